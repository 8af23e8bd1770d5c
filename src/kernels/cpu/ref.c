/* Plain C references for every element-wise and row op. These define what the fast paths must compute; they favour clarity
 * over speed (f32 accumulation, two passes where that is clearest). */
#include "kernels/kernels_impl.h"

#include <math.h>
#include <string.h>

/* ---- references --------------------------------------------------------------- */

static void ref_convert(dl_dtype dd, void *dst, dl_dtype sd, const void *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dl_store1(dd, dst, i, dl_load1(sd, src, i));
}

static void ref_layernorm(dl_dtype dt, dl_dtype ydt, void *y, const void *x, int64_t rows, int64_t cols,
                          const float *w, const float *b, const float *scale,
                          const float *shift, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * cols;
        float mean = 0.f, var = 0.f;
        for (int64_t c = 0; c < cols; c++) mean += dl_load1(dt, x, o + c);
        mean /= (float)cols;
        for (int64_t c = 0; c < cols; c++) {
            float d = dl_load1(dt, x, o + c) - mean;
            var += d * d;
        }
        var /= (float)cols;
        float rstd = 1.f / sqrtf(var + eps);
        for (int64_t c = 0; c < cols; c++) {
            float v = (dl_load1(dt, x, o + c) - mean) * rstd;
            if (w) v *= w[c];
            if (b) v += b[c];
            if (scale) v = v * (1.f + scale[c]) + shift[c];
            dl_store1(ydt, y, o + c, v);
        }
    }
}

static void ref_rmsnorm(dl_dtype dt, dl_dtype ydt, void *y, const void *x, int64_t rows, int64_t cols,
                        const float *w, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * cols;
        float ss = 0.f;
        for (int64_t c = 0; c < cols; c++) {
            float v = dl_load1(dt, x, o + c);
            ss += v * v;
        }
        float rs = 1.f / sqrtf(ss / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++) {
            float v = dl_load1(dt, x, o + c) * rs;
            dl_store1(ydt, y, o + c, w ? v * w[c] : v);
        }
    }
}

static void ref_modulate(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                         const float *scale, const float *shift) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t i = r * cols + c;
            dl_store1(dt, y, i, dl_load1(dt, x, i) * (1.f + scale[c]) + shift[c]);
        }
}

static void ref_gated_residual(dl_dtype dt, void *x, const void *y, int64_t rows, int64_t cols,
                               const float *gate) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t i = r * cols + c;
            float g = gate ? gate[c] : 1.f;
            dl_store1(dt, x, i, dl_load1(dt, x, i) + g * dl_load1(dt, y, i));
        }
}

static float act1(dl_act act, float v) {
    switch (act) {
    case DL_ACT_NONE: return v;
    case DL_ACT_GELU_TANH:
        return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    case DL_ACT_GELU_ERF: return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    case DL_ACT_SILU: return v / (1.f + expf(-v));
    case DL_ACT_QUICK_GELU: return v / (1.f + expf(-1.702f * v));
    case DL_ACT_RELU: return v > 0.f ? v : 0.f;
    }
    return v;
}

static void ref_activation(dl_act act, dl_dtype dt, void *y, const void *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) dl_store1(dt, y, i, act1(act, dl_load1(dt, x, i)));
}

static void ref_mul(dl_dtype dt, void *y, const void *a, const void *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) dl_store1(dt, y, i, dl_load1(dt, a, i) * dl_load1(dt, b, i));
}

static void ref_softmax(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * cols;
        float mx = -INFINITY, sum = 0.f;
        for (int64_t c = 0; c < cols; c++) mx = fmaxf(mx, dl_load1(dt, x, o + c));
        for (int64_t c = 0; c < cols; c++) sum += expf(dl_load1(dt, x, o + c) - mx);
        for (int64_t c = 0; c < cols; c++)
            dl_store1(dt, y, o + c, expf(dl_load1(dt, x, o + c) - mx) / sum);
    }
}

static void ref_groupnorm(dl_dtype dt, void *y, const void *x, int64_t cpg, int64_t S,
                          const float *w, const float *b, float eps, int fuse_silu) {
    int64_t n = cpg * S;
    double mean = 0.0, var = 0.0; /* a group can hold 10^6 values: accumulate in f64 */
    for (int64_t i = 0; i < n; i++) mean += dl_load1(dt, x, i);
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = dl_load1(dt, x, i) - mean;
        var += d * d;
    }
    var /= (double)n;
    float rstd = (float)(1.0 / sqrt(var + eps)), fm = (float)mean;
    for (int64_t c = 0; c < cpg; c++)
        for (int64_t s = 0; s < S; s++) {
            int64_t i = c * S + s;
            float v = (dl_load1(dt, x, i) - fm) * rstd;
            if (w) v *= w[c];
            if (b) v += b[c];
            if (fuse_silu) v = v / (1.f + expf(-v));
            dl_store1(dt, y, i, v);
        }
}

static void ref_rope(dl_rope_form form, dl_dtype dt, void *x, int64_t seq, int64_t heads,
                     int64_t head_dim, int64_t stride, const float *cos_t, const float *sin_t) {
    int64_t half = head_dim / 2;
    for (int64_t s = 0; s < seq; s++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t o = s * stride + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                int64_t ia = form == DL_ROPE_PAIRS ? o + 2 * i : o + i;
                int64_t ib = form == DL_ROPE_PAIRS ? o + 2 * i + 1 : o + i + half;
                float c = cos_t[s * half + i], sn = sin_t[s * half + i];
                float a = dl_load1(dt, x, ia), b = dl_load1(dt, x, ib);
                dl_store1(dt, x, ia, a * c - b * sn);
                dl_store1(dt, x, ib, b * c + a * sn);
            }
        }
}

const dl_kernel_table dl_kernels_ref = {
    .name = "ref",
    .convert = ref_convert,
    .layernorm = ref_layernorm,
    .rmsnorm = ref_rmsnorm,
    .modulate = ref_modulate,
    .gated_residual = ref_gated_residual,
    .activation = ref_activation,
    .softmax = ref_softmax,
    .mul = ref_mul,
    .groupnorm = ref_groupnorm,
    .rope = ref_rope,
};
