/* libFuzzer: the tokenizers (CLIP BPE with the real vocabulary, T5 Unigram with
 * the published pipeline and with transformers' current one, Qwen2 byte-level BPE
 * from vocab.json + merges.txt) on arbitrary bytes: invalid UTF-8 must be refused,
 * anything else encoded within bounds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "difflet/text.h"

#ifndef DATA_DIR
#define DATA_DIR "tests/data"
#endif

enum { NTOK = 4 };
static dl_tokenizer *g_tok[NTOK];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok[0]) {
        static const char *dirs[NTOK] = {DATA_DIR "/tok/clip_real", DATA_DIR "/tok/t5_tiny_legacy", DATA_DIR "/tok/t5_tiny",
                                         DATA_DIR "/tok/qwen_tiny_vocab"};
        for (int i = 0; i < NTOK; i++)
            if (dl_tokenizer_load(&g_tok[i], dirs[i]) != DL_OK) {
                fprintf(stderr, "%s\n", dl_last_error());
                abort();
            }
    }
    int32_t ids[512];
    for (int i = 0; i < NTOK; i++) {
        int n;
        if (dl_tokenizer_encode(g_tok[i], (const char *)data, size, i ? 512 : 77, 1, ids, &n) == DL_OK) {
            if (n < (i == 3 ? 0 : 1) || n > (i ? 512 : 77)) abort(); /* Qwen2 adds no EOS: 0 ids for "" */
            for (int k = 0; k < n; k++)
                if (ids[k] < 0 || ids[k] >= dl_tokenizer_vocab_size(g_tok[i])) abort();
        }
    }
    return 0;
}
