/* Base layer: status messages, arena bounds, hashing, atomic files, mmap, CPU
 * features, the thread split. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/base.h"
#include "test_util.h"

static void test_status(void) {
    dl_status s = dl_fail(DL_ERR_IO, "cannot open %s", "x.bin");
    CHECK(s == DL_ERR_IO, "dl_fail returns its status");
    CHECK(!strcmp(dl_last_error(), "cannot open x.bin"), "message: %s", dl_last_error());
    dl_fail(DL_ERR_IO, "program x: %s; recompiling", dl_last_error()); /* wrapping the previous message */
    CHECK(!strcmp(dl_last_error(), "program x: cannot open x.bin; recompiling"), "a wrapped message: %s", dl_last_error());
    CHECK(!strcmp(dl_status_str(DL_ERR_FORMAT), "malformed input"), "status name");
}

static void test_arena(void) {
    dl_arena *a;
    CHECK(dl_arena_new(&a, 1000) == DL_OK, "arena new");
    void *p = dl_arena_alloc(a, 10), *q = dl_arena_alloc(a, 100);
    CHECK(p && q && ((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0, "64-byte aligned slices");
    CHECK((char *)q - (char *)p == 64, "slices packed at alignment: %td", (char *)q - (char *)p);
    CHECK(dl_arena_alloc(a, 1 << 20) == NULL, "over capacity returns NULL");
    CHECK(strstr(dl_last_error(), "arena") != NULL, "and says why: %s", dl_last_error());
    size_t used = dl_arena_used(a);
    dl_arena_reset(a);
    CHECK(used == 64 + 128 && dl_arena_used(a) == 0, "reset: used was %zu", used);
    dl_arena_free(a);
}

static void test_hash(void) {
    const char *s = "difflet";
    uint64_t h1 = dl_hash64(s, 7, 0), h2 = dl_hash64(s, 7, 0), h3 = dl_hash64(s, 7, 1);
    CHECK(h1 == h2 && h1 != h3, "deterministic, seeded");
    CHECK(dl_hash64("difflea", 7, 0) != h1, "content changes the hash");
    dl_hasher *h = dl_hasher_new(0);
    dl_hasher_update(h, "diff", 4);
    dl_hasher_update(h, "let", 3);
    CHECK(dl_hasher_digest(h) == h1, "streaming equals one-shot");
    dl_hasher_free(h);
}

static void test_files(void) {
    char dir[] = "/tmp/difflet_test_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    CHECK(dl_file_write_atomic(path, "hello", 5) == DL_OK, "atomic write: %s", dl_last_error());
    CHECK(dl_file_write_atomic(path, "world!", 6) == DL_OK, "atomic overwrite");
    char *data;
    size_t len;
    CHECK(dl_file_read(path, 100, &data, &len) == DL_OK && len == 6 && !strcmp(data, "world!"), "read back");
    free(data);
    CHECK(dl_file_read(path, 3, &data, &len) == DL_ERR_INVALID, "size limit enforced");
    CHECK(dl_file_read("/nonexistent/x", 3, &data, &len) == DL_ERR_IO, "missing file is an I/O error");
    CHECK(strstr(dl_last_error(), "/nonexistent/x") != NULL, "message names the file");
    dl_mmap m;
    CHECK(dl_mmap_open(&m, path) == DL_OK && m.len == 6 && !memcmp(m.data, "world!", 6), "mmap");
    dl_mmap_close(&m);
    CHECK(dl_file_write_atomic("/nonexistent/dir/f", "x", 1) == DL_ERR_IO, "atomic write into a missing dir fails");
    unlink(path);
    rmdir(dir);
}

static void test_cpu_and_split(void) {
    const dl_cpu_features *f = dl_cpu();
    CHECK(!f->avx512_bf16 || f->avx512f, "bf16 implies avx512f");
    CHECK(!f->avx512f || f->avx2_fma, "avx512 implies avx2");
    dl_isa isa = dl_kernel_isa();
    dl_set_kernel_isa(DL_ISA_REF);
    CHECK(dl_kernel_isa() == DL_ISA_REF, "override to ref");
    dl_set_kernel_isa(isa);
    for (int nth = 1; nth <= 7; nth++) {
        int64_t covered = 0, prev_end = 0;
        for (int ith = 0; ith < nth; ith++) {
            int64_t b, e;
            dl_split(23, ith, nth, &b, &e);
            CHECK(b == prev_end && e >= b, "contiguous split");
            covered += e - b;
            prev_end = e;
        }
        CHECK(covered == 23, "split covers everything (nth=%d)", nth);
    }
    double t0 = dl_now(), t1 = dl_now();
    CHECK(t1 >= t0, "monotonic clock");
}

/* RFC 8259 strictness where cJSON is lenient; base64 both ways */
static void test_json_strict(void) {
    static const char *ok[] = {"{}", " {\"a\": [1, -0.5e+3, 0, true, false, null, \"x\\u00e9\\n\"]} \r\n", "[]", "\"s\"", "0",
                               "-12.25E-2", "{\"k\":{\"k\":[[]]}}", "\"\\ud83d\\ude00 \\uDBFF\\uDFFF\""};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        const char *e = dl_json_strict_check(ok[i], strlen(ok[i]), NULL);
        CHECK(!e, "valid JSON %s refused: %s", ok[i], e);
    }
    static const struct {
        const char *s;
        size_t n;
    } bad[] = {
#define B(x) {x, sizeof(x) - 1}
        B("{\"p\": \"x\"\0}"), B("\001{}"), B("{\"p\":\x1f\"x\"}"), B("{}\0"), B("{\"s\": 02}"), B("{\"s\": 2.}"),
        B("{\"s\": +2}"), B("{\"s\": .5}"), B("{\"p\": \"a\nb\"}"), B("{\"p\": \"a\\u0000b\"}"), B("{\"p\": \"a\\x\"}"),
        B("{\"p\": tru}"), B("{\"p\": 1} x"), B("{\"p\" 1}"), B("{\"p\": 1,}"), B("[1 2]"), B("{'p': 1}"), B(""),
        B("{\"p\": \"x"), B("{\"s\": 1e}"), B("{\"s\": -}"), B("{\"p\": \"\\u12g4\"}"), B("{\"\x01\": 1}"),
        B("\"\\ud800\""), B("\"a\\ud800b\""), B("\"\\udc00\\ud800\""), B("\"\\ud800\\u0041\""), B("\"\\ud800\\\""),
        B("\"\\ude00\"")
#undef B
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(dl_json_strict_check(bad[i].s, bad[i].n, NULL) != NULL, "invalid JSON #%zu accepted", i);
    char deep[200];
    memset(deep, '[', 100), memset(deep + 100, ']', 100);
    CHECK(dl_json_strict_check(deep, 200, NULL) != NULL, "nesting of 100 refused");
    const uint8_t bin[] = {0, 1, 2, 250, 251, 255, 'a'};
    for (size_t n = 0; n <= sizeof bin; n++) {
        char *t = dl_b64_encode(bin, n);
        uint8_t *back = NULL;
        size_t len = 0;
        dl_status s = t ? dl_b64_decode(t, strlen(t), &back, &len) : DL_ERR_NOMEM;
        CHECK(t && strlen(t) == (n + 2) / 3 * 4 && s == DL_OK && len == n && !memcmp(back, bin, n),
              "base64 round trip of %zu bytes", n);
        free(back), free(t);
    }
    char *t = dl_b64_encode((const uint8_t *)"hello", 5);
    CHECK(t && !strcmp(t, "aGVsbG8="), "base64 of hello: %s", t);
    free(t);
    uint8_t *o;
    size_t on;
    CHECK(dl_b64_decode("aGVsbG8", 7, &o, &on) != DL_OK && dl_b64_decode("aG!sbG8=", 8, &o, &on) != DL_OK &&
              dl_b64_decode("aG=sbG8=", 8, &o, &on) != DL_OK,
          "malformed base64 refused");
}

int main(void) {
    test_json_strict();
    test_status();
    test_arena();
    test_hash();
    test_files();
    test_cpu_and_split();
    return test_done("test_base");
}
