/* libFuzzer: tokenizer.json parsing (the arbitrary bytes are the file), then one
 * encode when it loads. */
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
    dl_tokenizer *t;
    if (dl_tokenizer_load(&t, dir) == DL_OK) {
        int32_t ids[64];
        int n;
        dl_tokenizer_encode(t, "a red circle, CAFÉ 🐱 on blue!", 33, 64, 1, ids, &n);
        dl_tokenizer_free(t);
    }
    return 0;
}
