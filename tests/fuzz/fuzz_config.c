/* libFuzzer: model_index.json and a component's config.json, then typed access. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/io.h"

static char g_dir[64];

static void put(const char *name, const uint8_t *data, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, size, f);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/difflet_fuzz_cfg_%d", (int)getpid());
        mkdir(g_dir, 0755);
        char sub[96];
        snprintf(sub, sizeof sub, "%s/transformer", g_dir);
        mkdir(sub, 0755);
    }
    /* the same bytes serve as model_index.json and as transformer/config.json */
    put("model_index.json", data, size);
    put("transformer/config.json", data, size);
    dl_model_dir *m;
    if (dl_model_dir_open(&m, g_dir) == DL_OK) {
        for (int i = 0; i < dl_model_dir_ncomponents(m); i++) dl_model_dir_component_class(m, dl_model_dir_component_name(m, i));
        const cJSON *cfg;
        if (dl_model_dir_config(m, "transformer", &cfg) == DL_OK) {
            int64_t iv;
            double dv;
            int bv;
            const char *sv;
            dl_cfg_int(cfg, "c", "num_layers", 0, &iv);
            dl_cfg_float(cfg, "c", "theta", 0, &dv);
            dl_cfg_bool(cfg, "c", "guidance_embeds", 0, &bv);
            dl_cfg_str(cfg, "c", "_class_name", "", &sv);
        }
        dl_model_dir_free(m);
    }
    return 0;
}
