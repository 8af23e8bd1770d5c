/* libFuzzer: both tokenizers (CLIP BPE with the real vocabulary, T5 Unigram with
 * the published pipeline and with transformers' current one) on arbitrary bytes:
 * invalid UTF-8 must be refused, anything else encoded within bounds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "difflet/text.h"

#ifndef DATA_DIR
#define DATA_DIR "tests/data"
#endif

static dl_tokenizer *g_tok[3];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok[0]) {
        static const char *dirs[3] = {DATA_DIR "/tok/clip_real", DATA_DIR "/tok/t5_tiny_legacy", DATA_DIR "/tok/t5_tiny"};
        for (int i = 0; i < 3; i++)
            if (dl_tokenizer_load(&g_tok[i], dirs[i]) != DL_OK) {
                fprintf(stderr, "%s\n", dl_last_error());
                abort();
            }
    }
    int32_t ids[512];
    for (int i = 0; i < 3; i++) {
        int n;
        if (dl_tokenizer_encode(g_tok[i], (const char *)data, size, i ? 512 : 77, 1, ids, &n) == DL_OK) {
            if (n < 1 || n > (i ? 512 : 77)) abort();
            for (int k = 0; k < n; k++)
                if (ids[k] < 0 || ids[k] >= dl_tokenizer_vocab_size(g_tok[i])) abort();
        }
    }
    return 0;
}
