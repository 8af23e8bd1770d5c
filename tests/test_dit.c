/* The DiT block library's blocks a model composes without its own code: cross-
 * attention of the image rows over the valid text keys (padding never attended) and
 * SwiGLU, against naive double references, f32 and bf16, on every kernel path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/check.h"
#include "difflet/kernels.h"
#include "kernels/kernels_impl.h"
#include "models/models_impl.h"
#include "test_util.h"

static void test_cross(dl_dtype dt) {
    const int64_t T = 19, N = 70, H = 3, Dh = 32, D = H * Dh, L = 13;
    dl_dit c = {.sp = {.tp = 1, .cp = 1}, .dt = dt, .D = D, .H = H, .Dh = Dh, .F = 4 * D, .T = T, .N = N, .S = T + N, .L = L};
    CHECK(dl_dit_plan(&c) == DL_OK && c.Nl == N && c.Hl == H, "plan: %s", dl_last_error());
    size_t es = dl_dtype_size(dt);
    void *q = malloc((size_t)(N * D) * es), *k = malloc((size_t)(T * D) * es), *v = malloc((size_t)(T * D) * es);
    void *out = malloc((size_t)(N * D) * es);
    dl_fill_uniform(dt, q, N * D, -1.5f, 1.5f, 1);
    dl_fill_uniform(dt, k, T * D, -1.5f, 1.5f, 2);
    dl_fill_uniform(dt, v, T * D, -1.f, 1.f, 3);
    for (int64_t i = L * D; i < T * D; i++) dl_store1(dt, k, i, NAN), dl_store1(dt, v, i, NAN); /* padding */
    dl_attn_args probe = {.dt = dt, .sq = N, .sk = c.S, .heads = H, .head_dim = Dh, .kv_begin = 0, .kv_end = c.S};
    c.scratch = dl_aligned_alloc(dl_attn_scratch_bytes(&probe, dl_threads()) + 64);
    dl_dit_cross_attention(&c, q, D, k, v, D, T, L, out, D);
    double worst = 0, scale = 1.0 / sqrt((double)Dh);
    int finite = 1;
    for (int64_t r = 0; r < N; r++)
        for (int64_t h = 0; h < H; h++) {
            double s[64], mx = -1e300, sum = 0;
            for (int64_t j = 0; j < L; j++) {
                double d = 0;
                for (int64_t e = 0; e < Dh; e++) d += dl_load1(dt, q, r * D + h * Dh + e) * dl_load1(dt, k, j * D + h * Dh + e);
                s[j] = d * scale;
                mx = fmax(mx, s[j]);
            }
            for (int64_t j = 0; j < L; j++) sum += (s[j] = exp(s[j] - mx));
            for (int64_t e = 0; e < Dh; e++) {
                double o = 0;
                for (int64_t j = 0; j < L; j++) o += s[j] / sum * dl_load1(dt, v, j * D + h * Dh + e);
                double got = dl_load1(dt, out, r * D + h * Dh + e);
                finite &= isfinite(got);
                worst = fmax(worst, fabs(got - o));
            }
        }
    /* f32: rounding only; bf16: probabilities and the output rounded (v in [-1, 1]) */
    double bound = dt == DL_F32 ? 1e-5 : 4.0 / 512.0;
    CHECK(finite && worst <= bound, "%s cross-attention (%s kernel) vs naive: %g > %g, or NaN padding leaked",
          dl_dtype_name(dt), dl_attn_path_name(&probe), worst, bound);
    free(q), free(k), free(v), free(out);
    dl_aligned_free(c.scratch);
    c.scratch = NULL;
    dl_dit_free(&c);
}

static void test_swiglu(dl_dtype dt) {
    const int64_t rows = 37, f = 53, ldy = 61;
    dl_dit c = {.dt = dt};
    size_t es = dl_dtype_size(dt);
    void *ab = malloc((size_t)(rows * 2 * f) * es), *y = calloc((size_t)(rows * ldy), es);
    dl_fill_uniform(dt, ab, rows * 2 * f, -4.f, 4.f, 5);
    dl_dit_swiglu(&c, y, ldy, ab, rows, f);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < f; i++) {
            double a = dl_load1(dt, ab, r * 2 * f + i), b = dl_load1(dt, ab, r * 2 * f + f + i);
            double s = a / (1 + exp(-a)), got = dl_load1(dt, y, r * ldy + i), err = fabs(got - s * b);
            if (dt == DL_BF16) { /* silu's output is rounded (as torch does) to one of its two bf16
                                  * neighbours: the kernel's e^x is exact to ~1e-5, so a value within
                                  * that of a tie may round the other way than the exact one */
                float sf = (float)s, lo = dl_bf16_to_f32(dl_f32_to_bf16(sf)), hi = lo;
                uint16_t bits = dl_f32_to_bf16(sf);
                if ((double)lo > s) bits = (uint16_t)(lo > 0 ? bits - 1 : bits + 1), lo = dl_bf16_to_f32(bits);
                else if ((double)lo < s) bits = (uint16_t)(lo >= 0 ? bits + 1 : bits - 1), hi = dl_bf16_to_f32(bits);
                err = fmin(fabs(got - (double)lo * b), fabs(got - (double)hi * b));
            }
            double ref = s * b;
            worst = fmax(worst, err / (fabs(ref) + 1e-3));
        }
    double bound = dt == DL_F32 ? 1e-5 : 2.0 / 256.0; /* bf16: the product rounded (half an ulp, <= 2^-8, twice that allowed) */
    CHECK(worst <= bound, "%s SwiGLU vs naive: relative %g > %g", dl_dtype_name(dt), worst, bound);
    free(ab), free(y);
}

int main(void) {
    dl_isa best = dl_kernel_isa();
    for (int isa = (int)best; isa >= (int)DL_ISA_REF; isa--) {
        dl_set_kernel_isa((dl_isa)isa);
        for (int d = 0; d < 2; d++) {
            test_cross(d ? DL_BF16 : DL_F32);
            test_swiglu(d ? DL_BF16 : DL_F32);
        }
    }
    dl_set_kernel_isa(best);
    return test_done("test_dit");
}
