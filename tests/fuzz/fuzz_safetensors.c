/* libFuzzer: the safetensors header parser and reader on arbitrary bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "difflet/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/difflet_fuzz_st_%d.safetensors", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    dl_checkpoint *ck;
    if (dl_ckpt_open(&ck, path, NULL) == DL_OK) {
        for (int i = 0; i < dl_ckpt_count(ck); i++) { /* touch every tensor's bytes */
            const dl_st_tensor *t = dl_ckpt_at(ck, i);
            float *buf = malloc((size_t)(t->numel ? t->numel : 1) * 4);
            if (buf && t->numel < (1 << 20)) dl_ckpt_read(t, DL_F32, buf);
            free(buf);
            int64_t shape[1] = {1};
            dl_ckpt_expect(ck, t->name, 1, shape, NULL);
        }
        dl_ckpt_content_hash(ck);
        dl_ckpt_free(ck);
    }
    unlink(path);
    return 0;
}
