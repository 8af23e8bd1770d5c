/* libFuzzer: tokenizer.json parsing (the arbitrary bytes are the file), then one
 * encode when it loads; then the same file read as a Qwen2Tokenizer's (only its
 * vocabulary, merges and post-processor taken). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[64], path[96];
    snprintf(dir, sizeof dir, "/tmp/difflet_fuzz_tok_%d", (int)getpid());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    for (int pass = 0; pass < 2; pass++) {
        dl_tokenizer *t;
        if (pass == 1) {
            snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
            if (!(f = fopen(path, "wb"))) return 0;
            fputs("{\"tokenizer_class\": \"Qwen2Tokenizer\", \"extra_special_tokens\": [\"<|im_start|>\"]}", f);
            fclose(f);
        }
        if (dl_tokenizer_load(&t, dir) == DL_OK) {
            int32_t ids[64];
            int n;
            static const char text[] = "a red circle, CAFÉ 🐱 on blue!\r\n  <|im_start|>it'S";
            dl_tokenizer_encode(t, text, sizeof text - 1, 64, 1, ids, &n);
            dl_tokenizer_free(t);
        }
    }
    remove(path);
    return 0;
}
