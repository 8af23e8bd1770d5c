/* `difflet inspect PATH`: validate and summarise a diffusers model folder or a
 * safetensors checkpoint (file or sharded index). Exit 1 with one line on bad input. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/gguf.h"
#include "difflet/io.h"

static void summarise(const dl_checkpoint *ck, const char *indent) {
    size_t bytes = 0;
    int per[DL_ST_COUNT] = {0};
    for (int i = 0; i < dl_ckpt_count(ck); i++) {
        bytes += dl_ckpt_at(ck, i)->nbytes;
        per[dl_ckpt_at(ck, i)->dtype]++;
    }
    printf("%s%s: %d tensors, %.1f MiB (", indent, dl_ckpt_label(ck), dl_ckpt_count(ck), (double)bytes / (1 << 20));
    int first = 1;
    for (int d = 0; d < DL_ST_COUNT; d++)
        if (per[d]) {
            printf("%s%d %s", first ? "" : ", ", per[d], dl_st_dtype_name((dl_st_dtype)d));
            first = 0;
        }
    printf(")\n");
}

int cli_inspect(int argc, char **argv) {
    if (argc != 1) {
        fprintf(stderr, "difflet: inspect needs one path: a model folder, a .safetensors file or an index.json\n");
        return 2;
    }
    const char *path = argv[0];
    size_t n = strlen(path);
    int is_file = (n > 12 && !strcmp(path + n - 12, ".safetensors")) || (n > 5 && !strcmp(path + n - 5, ".json"));
    if (is_file) {
        dl_checkpoint *ck;
        if (dl_ckpt_open(&ck, path, NULL) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            return 1;
        }
        summarise(ck, "");
        for (int i = 0; i < dl_ckpt_count(ck); i++) {
            const dl_st_tensor *t = dl_ckpt_at(ck, i);
            printf("  %-60s %-5s [", t->name, t->dtype == DL_ST_GGUF ? dl_gguf_type_name(t->qtype) : dl_st_dtype_name(t->dtype));
            for (int d = 0; d < t->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
            printf("]\n");
        }
        dl_ckpt_free(ck);
        return 0;
    }
    dl_model_dir *m;
    if (dl_model_dir_open(&m, path) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    printf("%s: %s, %d components\n", path, dl_model_dir_class(m), dl_model_dir_ncomponents(m));
    int rc = 0;
    for (int i = 0; i < dl_model_dir_ncomponents(m) && !rc; i++) {
        const char *c = dl_model_dir_component_name(m, i), *cls = dl_model_dir_component_class(m, c);
        printf("  %-16s %s\n", c, cls ? cls : "(none)");
        if (!cls || strstr(c, "tokenizer") || strstr(c, "scheduler")) continue;
        const cJSON *cfg;
        dl_checkpoint *ck;
        if (dl_model_dir_config(m, c, &cfg) != DL_OK || dl_model_dir_checkpoint(m, c, &ck) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            rc = 1;
            break;
        }
        summarise(ck, "    ");
        dl_ckpt_free(ck);
    }
    dl_model_dir_free(m);
    return rc;
}
