/* io: safetensors round trip through difflet's writer, files written by the Python
 * safetensors library and by transformers (sharded, with index), every kind of
 * malformed header, truncation at every length, diffusers folders and config
 * accessors. Bad input must give an error that names the file, never a crash. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/io.h"
#include "test_util.h"

static char g_dir[64];

static const char *tmp(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void write_raw(const char *path, const void *data, size_t len);
#define write_str(path, str) write_raw(path, str, strlen(str))

static void write_raw(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    DL_ASSERT(f);
    fwrite(data, 1, len, f);
    fclose(f);
}

/* a file with header `json` (8-byte length prefix) and `dlen` data bytes */
static void write_st(const char *path, const char *json, size_t dlen) {
    size_t hl = strlen(json);
    uint8_t *b = calloc(1, 8 + hl + dlen);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    write_raw(path, b, 8 + hl + dlen);
    free(b);
}

static void test_round_trip(void) {
    float a[6] = {1, -2, 3.5f, 4, 5, 6};
    uint16_t h[3] = {dl_f32_to_bf16(1.5f), dl_f32_to_bf16(-2.f), dl_f32_to_bf16(0.25f)};
    int64_t ids[2] = {7, 9};
    dl_st_writer *w = dl_st_writer_new();
    int64_t sa[2] = {2, 3}, sh[1] = {3}, si[2] = {1, 2};
    CHECK(dl_st_writer_add(w, "w.weight", DL_ST_F32, 2, sa, a) == DL_OK, "add");
    CHECK(dl_st_writer_add(w, "b.bias", DL_ST_BF16, 1, sh, h) == DL_OK, "add");
    CHECK(dl_st_writer_add(w, "pos", DL_ST_I64, 2, si, ids) == DL_OK, "add");
    CHECK(dl_st_writer_add(w, "pos", DL_ST_I64, 2, si, ids) == DL_ERR_INVALID, "duplicate name refused");
    dl_st_writer_meta(w, "format", "pt");
    CHECK(dl_st_writer_save(w, tmp("rt.safetensors")) == DL_OK, "save: %s", dl_last_error());
    dl_st_writer_free(w);
    dl_checkpoint *ck;
    CHECK(dl_ckpt_open(&ck, tmp("rt.safetensors"), "rt") == DL_OK, "open: %s", dl_last_error());
    if (!ck) return;
    CHECK(dl_ckpt_count(ck) == 3, "3 tensors");
    const dl_st_tensor *t;
    int64_t want[2] = {2, 3};
    CHECK(dl_ckpt_expect(ck, "w.weight", 2, want, &t) == DL_OK, "%s", dl_last_error());
    float back[6];
    uint16_t bb[6];
    CHECK(t && dl_ckpt_read(t, DL_F32, back) == DL_OK && !memcmp(back, a, sizeof a), "f32 values");
    CHECK(t && dl_ckpt_read(t, DL_BF16, bb) == DL_OK && dl_bf16_to_f32(bb[2]) == 3.5f, "f32 -> bf16");
    t = dl_ckpt_find(ck, "b.bias");
    CHECK(t && dl_ckpt_read(t, DL_F32, back) == DL_OK && back[1] == -2.f && back[2] == 0.25f, "bf16 -> f32");
    t = dl_ckpt_find(ck, "pos");
    CHECK(t && t->dtype == DL_ST_I64 && dl_ckpt_read(t, DL_F32, back) == DL_ERR_UNSUPPORTED, "I64 is parsed, not read as float");
    int64_t bad[2] = {3, 2};
    CHECK(dl_ckpt_expect(ck, "w.weight", 2, bad, NULL) == DL_ERR_FORMAT, "shape mismatch");
    CHECK(!strcmp(dl_last_error(), "`rt`: tensor `w.weight` has shape [2, 3], config expects [3, 2]"),
          "message: %s", dl_last_error());
    CHECK(dl_ckpt_expect(ck, "nope", 2, bad, NULL) == DL_ERR_FORMAT && strstr(dl_last_error(), "`nope` is missing"),
          "missing: %s", dl_last_error());
    CHECK(dl_ckpt_expect(ck, "pos", 2, si, NULL) == DL_ERR_FORMAT && strstr(dl_last_error(), "I64"), "dtype: %s", dl_last_error());
    uint64_t h1 = dl_ckpt_content_hash(ck);
    dl_ckpt_free(ck);
    a[5] = 6.5f; /* one value changes the content hash */
    w = dl_st_writer_new();
    dl_st_writer_add(w, "w.weight", DL_ST_F32, 2, sa, a);
    dl_st_writer_add(w, "b.bias", DL_ST_BF16, 1, sh, h);
    dl_st_writer_add(w, "pos", DL_ST_I64, 2, si, ids);
    dl_st_writer_save(w, tmp("rt2.safetensors"));
    dl_st_writer_free(w);
    CHECK(dl_ckpt_open(&ck, tmp("rt2.safetensors"), NULL) == DL_OK, "open 2");
    CHECK(ck && dl_ckpt_content_hash(ck) != h1, "content hash sees one changed value");
    dl_ckpt_free(ck);
}

static void test_python_files(void) {
    dl_checkpoint *ck;
    CHECK(dl_ckpt_open(&ck, DATA_DIR "/io/py_basic.safetensors", NULL) == DL_OK, "python file: %s", dl_last_error());
    if (!ck) return;
    CHECK(dl_ckpt_count(ck) == 5, "5 tensors");
    const char *names[] = {"a.f32", "b.f16", "c.bf16", "e.scalar"};
    int64_t ns[] = {15, 7, 24, 1};
    for (int k = 0; k < 4; k++) {
        const dl_st_tensor *t = dl_ckpt_find(ck, names[k]);
        float v[32];
        CHECK(t && t->numel == ns[k] && dl_ckpt_read(t, DL_F32, v) == DL_OK, "%s", names[k]);
        int ok = 1;
        for (int64_t i = 0; t && i < ns[k]; i++) ok &= v[i] == (float)(i % 17) * 0.25f - 2.f;
        CHECK(ok, "%s values", names[k]);
    }
    const dl_st_tensor *c = dl_ckpt_find(ck, "c.bf16"), *e = dl_ckpt_find(ck, "e.scalar");
    CHECK(c && c->ndim == 3 && c->shape[0] == 2 && c->shape[2] == 4 && c->dtype == DL_ST_BF16, "bf16 shape");
    CHECK(e && e->ndim == 0, "0-d tensor");
    dl_ckpt_free(ck);
    /* transformers' sharded save */
    CHECK(dl_ckpt_open(&ck, DATA_DIR "/io/clip_sharded/model.safetensors.index.json", "text_encoder/model.safetensors.index.json") == DL_OK,
          "sharded: %s", dl_last_error());
    if (!ck) return;
    CHECK(dl_ckpt_count(ck) > 20, "all shards' tensors: %d", dl_ckpt_count(ck));
    const dl_st_tensor *t = dl_ckpt_find(ck, "embeddings.token_embedding.weight");
    CHECK(t && t->shape[0] == 64 && t->shape[1] == 32, "token embedding [64, 32]");
    CHECK(t && strstr(t->file, "text_encoder/model-0000") != NULL, "tensor knows its shard: %s", t ? t->file : "");
    dl_ckpt_free(ck);
}

static void expect_bad(const char *name, const char *json, size_t dlen, const char *needle) {
    write_st(tmp(name), json, dlen);
    dl_checkpoint *ck = NULL;
    dl_status s = dl_ckpt_open(&ck, tmp(name), name);
    CHECK(s == DL_ERR_FORMAT && ck == NULL, "%s: accepted (status %d)", name, s);
    CHECK(strstr(dl_last_error(), name) && strstr(dl_last_error(), needle), "%s: message '%s' lacks '%s'", name,
          dl_last_error(), needle);
}

static void test_malformed(void) {
    expect_bad("notjson", "{\"a\": ", 0, "not a JSON object");
    expect_bad("array", "[1,2]", 0, "not a JSON object");
    expect_bad("dtype", "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    expect_bad("span", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "need 8");
    expect_bad("past", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated");
    expect_bad("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap");
    expect_bad("negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "invalid shape");
    expect_bad("fraction", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "invalid shape");
    expect_bad("offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "invalid data_offsets");
    expect_bad("fields", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets");
    expect_bad("dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dimensions");
    expect_bad("huge", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904, 8],\"data_offsets\":[0,4]}}", 4, "");
    expect_bad("meta", "{\"__metadata__\": 3}", 0, "__metadata__");
    expect_bad("trailing", "{}  x", 0, "bytes follow it"); /* found by fuzzing */
    {                                                       /* no tensors at all is valid (found by fuzzing) */
        dl_checkpoint *ck0 = NULL;
        write_st(tmp("empty"), "{}      ", 0);
        CHECK(dl_ckpt_open(&ck0, tmp("empty"), "empty") == DL_OK && dl_ckpt_count(ck0) == 0, "empty: %s", dl_last_error());
        CHECK(ck0 && dl_ckpt_find(ck0, "x") == NULL, "nothing to find");
        dl_ckpt_free(ck0);
    }
    /* header length lies */
    uint8_t b[16] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, '{', '}'};
    write_raw(tmp("biglen"), b, 10);
    dl_checkpoint *ck = NULL;
    CHECK(dl_ckpt_open(&ck, tmp("biglen"), "biglen") == DL_ERR_FORMAT && strstr(dl_last_error(), "limit"), "%s", dl_last_error());
    b[3] = 0;
    b[0] = 100;
    write_raw(tmp("longhdr"), b, 10);
    CHECK(dl_ckpt_open(&ck, tmp("longhdr"), "longhdr") == DL_ERR_FORMAT && strstr(dl_last_error(), "larger than the file"),
          "%s", dl_last_error());
    write_raw(tmp("short"), b, 5);
    CHECK(dl_ckpt_open(&ck, tmp("short"), "short") == DL_ERR_FORMAT && strstr(dl_last_error(), "too short"), "%s", dl_last_error());
    CHECK(dl_ckpt_open(&ck, tmp("absent.safetensors"), NULL) == DL_ERR_IO, "missing file");
}

/* Every truncation of a valid file is refused cleanly. */
static void test_truncation(void) {
    char *data;
    size_t len;
    CHECK(dl_file_read(DATA_DIR "/io/py_basic.safetensors", 1 << 20, &data, &len) == DL_OK, "read");
    int refused = 0;
    for (size_t n = 0; n < len; n++) {
        write_raw(tmp("trunc"), data, n);
        dl_checkpoint *ck = NULL;
        if (dl_ckpt_open(&ck, tmp("trunc"), "trunc") != DL_OK) refused++;
        dl_ckpt_free(ck);
    }
    CHECK(refused == (int)len, "%d of %zu truncations refused", refused, len);
    free(data);
}

static void test_index_errors(void) {
    write_str(tmp("bad.index.json"), "{\"weight_map\": {\"x\": \"../evil.safetensors\"}}");
    dl_checkpoint *ck;
    CHECK(dl_ckpt_open(&ck, tmp("bad.index.json"), NULL) == DL_ERR_FORMAT && strstr(dl_last_error(), "beside the index"),
          "%s", dl_last_error());
    float a[2] = {1, 2};
    int64_t s1[1] = {2};
    dl_st_writer *w = dl_st_writer_new();
    dl_st_writer_add(w, "x", DL_ST_F32, 1, s1, a);
    dl_st_writer_save(w, tmp("shard1.safetensors"));
    dl_st_writer_free(w);
    const char *idx = "{\"weight_map\": {\"x\": \"shard1.safetensors\", \"y\": \"shard1.safetensors\"}}";
    write_raw(tmp("m.index.json"), idx, strlen(idx));
    CHECK(dl_ckpt_open(&ck, tmp("m.index.json"), NULL) == DL_ERR_FORMAT && strstr(dl_last_error(), "`y` is not in"),
          "%s", dl_last_error());
    write_str(tmp("n.index.json"), "{\"weights\": {}}");
    CHECK(dl_ckpt_open(&ck, tmp("n.index.json"), NULL) == DL_ERR_FORMAT, "no weight_map");
}

static void test_model_dir(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/model", g_dir);
    dl_model_dir *m;
    CHECK(dl_model_dir_open(&m, p) == DL_ERR_IO && strstr(dl_last_error(), "does not exist"), "%s", dl_last_error());
    mkdir(p, 0755);
    CHECK(dl_model_dir_open(&m, p) == DL_ERR_IO && strstr(dl_last_error(), "model_index.json` is missing"), "%s", dl_last_error());
    write_str(tmp("model/model_index.json"), "{\"_class_name\": \"FluxPipeline\",");
    CHECK(dl_model_dir_open(&m, p) == DL_ERR_FORMAT && strstr(dl_last_error(), "not a valid JSON"), "%s", dl_last_error());
    const char *idx = "{\"_class_name\": \"FluxPipeline\", \"_diffusers_version\": \"0.30.0\","
                      "\"text_encoder\": [\"transformers\", \"CLIPTextModel\"], \"transformer\": [\"diffusers\", \"FluxTransformer2DModel\"],"
                      "\"vae\": [\"diffusers\", \"AutoencoderKL\"], \"image_encoder\": [null, null], \"force_zeros\": true}";
    write_raw(tmp("model/model_index.json"), idx, strlen(idx));
    CHECK(dl_model_dir_open(&m, p) == DL_OK, "%s", dl_last_error());
    if (!m) return;
    CHECK(!strcmp(dl_model_dir_class(m), "FluxPipeline") && dl_model_dir_ncomponents(m) == 4, "class and components");
    CHECK(!strcmp(dl_model_dir_component_class(m, "transformer"), "FluxTransformer2DModel"), "component class");
    CHECK(dl_model_dir_component_class(m, "image_encoder") == NULL, "null component");
    const cJSON *cfg;
    CHECK(dl_model_dir_config(m, "transformer", &cfg) == DL_ERR_IO && strstr(dl_last_error(), "transformer/config.json"),
          "%s", dl_last_error());
    snprintf(p, sizeof p, "%s/model/transformer", g_dir);
    mkdir(p, 0755);
    write_str(tmp("model/transformer/config.json"), "{\"num_layers\": 2, \"guidance_embeds\": true, \"theta\": 1e4, \"name\": 3}");
    CHECK(dl_model_dir_config(m, "transformer", &cfg) == DL_OK, "%s", dl_last_error());
    int64_t iv;
    double dv;
    int bv;
    const char *sv;
    CHECK(dl_cfg_int(cfg, "transformer/config.json", "num_layers", 0, &iv) == DL_OK && iv == 2, "int");
    CHECK(dl_cfg_int(cfg, "transformer/config.json", "absent", 19, &iv) == DL_OK && iv == 19, "default");
    CHECK(dl_cfg_bool(cfg, "transformer/config.json", "guidance_embeds", 0, &bv) == DL_OK && bv == 1, "bool");
    CHECK(dl_cfg_float(cfg, "transformer/config.json", "theta", 0, &dv) == DL_OK && dv == 1e4, "float");
    CHECK(dl_cfg_int(cfg, "transformer/config.json", "theta", 0, &iv) == DL_OK && iv == 10000, "integral float as int");
    CHECK(dl_cfg_str(cfg, "transformer/config.json", "name", "", &sv) == DL_ERR_FORMAT &&
              !strcmp(dl_last_error(), "`transformer/config.json`: \"name\" must be a string"),
          "%s", dl_last_error());
    dl_checkpoint *ck;
    CHECK(dl_model_dir_checkpoint(m, "transformer", &ck) == DL_ERR_IO && strstr(dl_last_error(), "no weights"), "%s", dl_last_error());
    write_str(tmp("model/transformer/diffusion_pytorch_model.bin"), "x");
    CHECK(dl_model_dir_checkpoint(m, "transformer", &ck) == DL_ERR_IO && strstr(dl_last_error(), ".bin"), "%s", dl_last_error());
    float a[2] = {1, 2};
    int64_t s1[1] = {2};
    dl_st_writer *w = dl_st_writer_new();
    dl_st_writer_add(w, "x_embedder.weight", DL_ST_F32, 1, s1, a);
    dl_st_writer_save(w, tmp("model/transformer/diffusion_pytorch_model.safetensors"));
    dl_st_writer_free(w);
    CHECK(dl_model_dir_checkpoint(m, "transformer", &ck) == DL_OK, "%s", dl_last_error());
    int64_t wrong[1] = {3};
    CHECK(ck && dl_ckpt_expect(ck, "x_embedder.weight", 1, wrong, NULL) == DL_ERR_FORMAT &&
              !strcmp(dl_last_error(), "`transformer/diffusion_pytorch_model.safetensors`: tensor `x_embedder.weight` has shape [2], config expects [3]"),
          "%s", dl_last_error());
    dl_ckpt_free(ck);
    CHECK(dl_model_dir_checkpoint(m, "unet", &ck) == DL_ERR_FORMAT && strstr(dl_last_error(), "no component"), "%s", dl_last_error());
    dl_model_dir_free(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/difflet_io_XXXXXX");
    DL_ASSERT(mkdtemp(g_dir));
    test_round_trip();
    test_python_files();
    test_malformed();
    test_truncation();
    test_index_errors();
    test_model_dir();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_done("test_io");
}
