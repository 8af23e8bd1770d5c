/* Element-wise kernels: the active fast path against the references at many shapes
 * (sizes that are not multiples of 8, 16 or 128 included), through a 3-way thread
 * split; and independent properties that hold whatever path runs (exact dtype
 * conversions, normalisation statistics, softmax sums, RoPE norms, known values).
 * Tolerances (dl_check_tolerance): f32 1e-5 abs + 1e-5 rel; bf16 1e-2 abs + 2^-7
 * rel (one rounding on each side); f16 1e-3 abs + 2^-10 rel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/check.h"
#include "difflet/kernels.h"
#include "kernels/kernels_impl.h"
#include "test_util.h"

static void on_result(const dl_check_result *r, void *ctx) {
    (void)ctx;
    CHECK(r->ok, "%s %s %lldx%lld: %.2fx tolerance (got %g want %g)", r->op, dl_dtype_name(r->dt),
          (long long)r->rows, (long long)r->cols, r->worst, r->got, r->want);
}

static void test_against_reference(void) {
    static const int64_t shapes[] = {1, 1, 1, 7, 2, 15, 3, 16, 4, 17, 5, 33, 6, 64, 7, 100,
                                     8, 127, 9, 128, 3, 129, 2, 300, 12, 3072, 64, 96};
    int n = (int)(sizeof shapes / sizeof shapes[0] / 2);
    for (int nth = 1; nth <= 3; nth += 2) dl_kernels_check(shapes, n, nth, on_result, NULL);
}

static void test_conversions(void) {
    CHECK(dl_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(dl_f32_to_bf16(1.00390625f) == 0x3f80, "halfway rounds to even (down)");
    CHECK(dl_f32_to_bf16(1.01171875f) == 0x3f82, "halfway rounds to even (up)");
    CHECK(isnan(dl_bf16_to_f32(dl_f32_to_bf16(NAN))), "NaN stays NaN");
    CHECK(dl_f32_to_bf16(INFINITY) == 0x7f80, "inf");
    int f16_ok = 1;
    for (uint32_t h = 0; h < 65536; h++) { /* every f16 value round-trips exactly */
        float f = dl_f16_to_f32((uint16_t)h);
        uint16_t back = dl_f32_to_f16(f);
        if (isnan(f) ? !isnan(dl_f16_to_f32(back)) : back != h) {
            f16_ok = 0;
            fprintf(stderr, "f16 0x%04x -> %g -> 0x%04x\n", h, f, back);
            break;
        }
    }
    CHECK(f16_ok, "all f16 values round-trip");
    CHECK(dl_f32_to_f16(65504.f) == 0x7bff, "f16 max");
    CHECK(dl_f32_to_f16(65520.f) == 0x7c00, "rounds to inf past max");
    CHECK(dl_f32_to_f16(0x1p-24f) == 0x0001, "smallest subnormal");
    CHECK(dl_f32_to_f16(0x1p-25f) == 0x0000, "half of smallest subnormal rounds to even (0)");
    CHECK(dl_f32_to_f16(0x1.8p-25f) == 0x0001, "above half rounds up");
    CHECK(dl_f32_to_f16(1.f + 0x1p-11f) == 0x3c00, "f16 halfway to even");
    /* fast path conversion of every f16 value to f32 and of the results back */
    uint16_t *all = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *f = malloc(65536 * 4);
    for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
    dl_convert_t(DL_F32, f, DL_F16, all, 65536, 0, 1);
    dl_convert_t(DL_F16, back, DL_F32, f, 65536, 0, 1);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        if (f[h] == f[h] && back[h] != h) bad++;
    CHECK(bad == 0, "%d f16 values changed through the active path", bad);
    free(all), free(back), free(f);
}

static void test_properties(void) {
    const int64_t rows = 5, cols = 77;
    float *x = malloc(rows * cols * 4), *y = malloc(rows * cols * 4);
    dl_fill_uniform(DL_F32, x, rows * cols, -3.f, 5.f, 42);
    dl_layernorm_t(DL_F32, y, x, rows, cols, NULL, NULL, 0.f, 0, 1);
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < cols; c++) m += y[r * cols + c];
        m /= cols;
        for (int64_t c = 0; c < cols; c++) v += (y[r * cols + c] - m) * (y[r * cols + c] - m);
        v /= cols;
        CHECK(fabs(m) < 1e-5 && fabs(v - 1) < 1e-4, "layernorm row %lld: mean %g var %g", (long long)r, m, v);
    }
    dl_softmax_t(DL_F32, y, x, rows, cols, 0, 1);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t c = 0; c < cols; c++) s += y[r * cols + c];
        CHECK(fabs(s - 1) < 1e-5, "softmax row sums to 1: %g", s);
    }
    /* group norm: each group standardised */
    dl_groupnorm_t(DL_F32, y, x, 5, 77, 5, NULL, NULL, 0.f, 0, 0, 1);
    double m = 0;
    for (int c = 0; c < 77; c++) m += y[c];
    CHECK(fabs(m / 77) < 1e-5, "groupnorm group mean %g", m / 77);
    /* known activation values */
    float v[3] = {1.f, -2.f, 0.5f}, o[3];
    dl_activation_t(DL_ACT_GELU_ERF, DL_F32, o, v, 3, 0, 1);
    CHECK(fabsf(o[0] - 0.8413447f) < 1e-6 && fabsf(o[1] + 0.0455003f) < 1e-6, "gelu_erf %g %g", o[0], o[1]);
    dl_activation_t(DL_ACT_GELU_TANH, DL_F32, o, v, 3, 0, 1);
    CHECK(fabsf(o[0] - 0.8411920f) < 1e-6 && fabsf(o[1] + 0.0454023f) < 1e-6, "gelu_tanh %g %g", o[0], o[1]);
    dl_activation_t(DL_ACT_SILU, DL_F32, o, v, 3, 0, 1);
    CHECK(fabsf(o[0] - 0.7310586f) < 1e-6 && fabsf(o[2] - 0.3112296f) < 1e-6, "silu %g %g", o[0], o[2]);
    /* far from zero every activation stays finite and agrees with the reference
       (the vector exp once overflowed its exponent into a NaN for sigmoid(-14)) */
    {
        float xs[16] = {-1e4f, -1000.f, -100.f, -89.f, -88.f, -50.f, -20.f, -13.5f, 13.5f, 20.f, 50.f, 88.f, 89.f, 100.f, 1000.f, 1e4f};
        float yv[16], yr[16];
        for (int a = 1; a <= 5; a++) {
            dl_kernels()->activation((dl_act)a, DL_F32, yv, xs, 16);
            dl_kernels_ref.activation((dl_act)a, DL_F32, yr, xs, 16);
            int ok = 1;
            for (int i = 0; i < 16; i++) ok &= isfinite(yv[i]) && fabsf(yv[i] - yr[i]) <= 1e-5f * fmaxf(1.f, fabsf(yr[i]));
            CHECK(ok, "activation %d (%s) at large |x|: finite and as the reference", a, dl_kernels()->name);
        }
    }
    /* RoPE keeps each rotated pair's norm and is the identity at position 0 */
    const int64_t seq = 3, heads = 2, hd = 32;
    float ids[3 * 3] = {0, 0, 0, 1, 2, 3, 7, 5, 1};
    int axes[3] = {8, 12, 12};
    float cs[3 * 16], sn[3 * 16], q[3 * 2 * 32], q0[3 * 2 * 32];
    dl_rope_table_axes(ids, seq, 3, axes, 10000.0, cs, sn);
    CHECK(fabsf(cs[16 + 1] - cosf(1.f / powf(10000.f, 2.f / 8.f))) < 1e-6, "table: axis 0, i=1 at pos 1");
    CHECK(fabsf(sn[16 + 4] - sinf(2.f)) < 1e-6, "table: axis 1 starts at pos 2, freq 1");
    dl_fill_uniform(DL_F32, q, seq * heads * hd, -1.f, 1.f, 9);
    memcpy(q0, q, sizeof q);
    dl_rope_t(DL_ROPE_PAIRS, DL_F32, q, seq, heads, hd, 0, cs, sn, 0, 1);
    int id_ok = 1, norm_ok = 1;
    for (int i = 0; i < heads * hd; i++) id_ok &= fabsf(q[i] - q0[i]) < 1e-7f;
    for (int i = 0; i < seq * heads * hd; i += 2) {
        float a = q[i] * q[i] + q[i + 1] * q[i + 1], b = q0[i] * q0[i] + q0[i + 1] * q0[i + 1];
        norm_ok &= fabsf(a - b) < 1e-5f;
    }
    CHECK(id_ok, "rope at position 0 is the identity");
    CHECK(norm_ok, "rope preserves pair norms");
    /* Wan table: head_dim 12 -> axes (4, 4, 4); token (f=1, h=0, w=1) */
    float wc[2 * 2 * 2 * 6], ws[2 * 2 * 2 * 6];
    dl_rope_table_wan(2, 2, 2, 12, 10000.0, wc, ws);
    CHECK(fabsf(ws[5 * 6 + 0] - sinf(1.f)) < 1e-6 && fabsf(ws[5 * 6 + 2] - 0.f) < 1e-6 &&
              fabsf(ws[5 * 6 + 4] - sinf(1.f)) < 1e-6,
          "wan table angles");
    /* nearest upsample */
    float u[2 * 2 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uo[2 * 4 * 6];
    dl_upsample2x_t(DL_F32, uo, u, 2, 2, 3, 0, 1);
    CHECK(uo[0] == 1 && uo[1] == 1 && uo[6] == 1 && uo[7] == 1 && uo[2 * 6 + 0] == 4 &&
              uo[24 + 23] == 12 && uo[24 + 17] == 12,
          "upsample2x pattern");
    free(x), free(y);
}

/* Outputs of 2 MiB and more per call go out through streaming stores: the same bytes
 * as the regular stores a call over fewer rows makes. */
static void test_streaming(void) {
    const int64_t rows = 512, cols = 4096, part = 32;
    for (int d = 0; d < 2; d++) {
        const dl_dtype dt = d ? DL_BF16 : DL_F32;
        const size_t bytes = (size_t)(rows * cols) * dl_dtype_size(dt);
        void *x = dl_aligned_alloc(bytes), *a = dl_aligned_alloc(bytes), *b = dl_aligned_alloc(bytes);
        float *sc = malloc((size_t)cols * 4), *sh = malloc((size_t)cols * 4);
        dl_fill_uniform(dt, x, rows * cols, -3.f, 3.f, 31);
        dl_fill_uniform(DL_F32, sc, cols, -1.f, 1.f, 32);
        dl_fill_uniform(DL_F32, sh, cols, -1.f, 1.f, 33);
        for (int op = 0; op < 3; op++) {
            memset(a, 0, bytes), memset(b, 0xff, bytes);
            for (int64_t r0 = -1; r0 < rows; r0 += part) { /* r0 = -1: every row in one call */
                const int64_t o = r0 < 0 ? 0 : r0, n = r0 < 0 ? rows : part;
                void *out = (char *)(r0 < 0 ? a : b) + (size_t)(o * cols) * dl_dtype_size(dt);
                const void *in = (const char *)x + (size_t)(o * cols) * dl_dtype_size(dt);
                if (op == 0) dl_layernorm_modulate_t(dt, out, in, n, cols, sc, sh, 1e-6f, 0, 1);
                if (op == 1) dl_rmsnorm_t(dt, out, in, n, cols, sc, 1e-6f, 0, 1);
                if (op == 2) dl_softmax_t(dt, out, in, n, cols, 0, 1);
                if (r0 < 0) r0 = -part; /* then the parts from row 0 */
            }
            CHECK(!memcmp(a, b, bytes), "%s %s: %zu bytes in one call (streamed) differ from the calls over %lld rows",
                  op == 0 ? "layernorm_modulate" : op == 1 ? "rmsnorm" : "softmax", dl_dtype_name(dt), bytes, (long long)part);
        }
        dl_aligned_free(x), dl_aligned_free(a), dl_aligned_free(b);
        free(sc), free(sh);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--expect-ref"))
        CHECK(dl_kernel_isa() == DL_ISA_REF, "DIFFLET_KERNELS=ref selects the references (got %s)",
              dl_isa_name(dl_kernel_isa()));
    else
        printf("kernel path: %s\n", dl_isa_name(dl_kernel_isa()));
    test_conversions();
    test_properties();
    test_against_reference();
    test_streaming();
    /* and the AVX2 fallback explicitly, where the CPU has it */
    if (dl_kernel_isa() > DL_ISA_AVX2 && dl_cpu()->avx2_fma) {
        dl_set_kernel_isa(DL_ISA_AVX2);
        test_against_reference();
        test_properties();
        test_streaming();
    }
    return test_done("test_kernels");
}
