/* Public element-wise entry points: split the work by (ith, nth) and call the
 * table of the kernel path chosen at run time (dl_kernel_isa). */
#include "kernels/kernels_impl.h"

#include <string.h>

const dl_kernel_table *dl_kernels(void) {
    switch (dl_kernel_isa()) {
    case DL_ISA_AVX512:
    case DL_ISA_AVX512_BF16: return &dl_kernels_avx512;
    case DL_ISA_AVX2: return &dl_kernels_avx2;
    default: return &dl_kernels_ref;
    }
}

#define OFF(p, dt, i) ((char *)(p) + (size_t)(i) * dl_dtype_size(dt))
#define COFF(p, dt, i) ((const char *)(p) + (size_t)(i) * dl_dtype_size(dt))

void dl_convert_t(dl_dtype dd, void *dst, dl_dtype sd, const void *src, int64_t n, int ith,
                  int nth) {
    int64_t b, e;
    dl_split(n, ith, nth, &b, &e);
    if (e > b) dl_kernels()->convert(dd, OFF(dst, dd, b), sd, COFF(src, sd, b), e - b);
}

void dl_layernorm_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                    const float *w, const float *b, float eps, int ith, int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->layernorm(dt, dt, OFF(y, dt, r0 * cols), COFF(x, dt, r0 * cols), r1 - r0, cols,
                                w, b, NULL, NULL, eps);
}

void dl_layernorm_modulate_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                             const float *scale, const float *shift, float eps, int ith, int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->layernorm(dt, dt, OFF(y, dt, r0 * cols), COFF(x, dt, r0 * cols), r1 - r0, cols,
                                NULL, NULL, scale, shift, eps);
}

void dl_rmsnorm_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                  const float *w, float eps, int ith, int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->rmsnorm(dt, dt, OFF(y, dt, r0 * cols), COFF(x, dt, r0 * cols), r1 - r0, cols, w,
                              eps);
}

void dl_layernorm_x_t(dl_dtype ydt, void *y, dl_dtype xdt, const void *x, int64_t rows, int64_t cols,
                      const float *w, const float *b, const float *scale, const float *shift, float eps, int ith,
                      int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->layernorm(xdt, ydt, OFF(y, ydt, r0 * cols), COFF(x, xdt, r0 * cols), r1 - r0, cols, w, b, scale,
                                shift, eps);
}

void dl_rmsnorm_x_t(dl_dtype ydt, void *y, dl_dtype xdt, const void *x, int64_t rows, int64_t cols, const float *w,
                    float eps, int ith, int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->rmsnorm(xdt, ydt, OFF(y, ydt, r0 * cols), COFF(x, xdt, r0 * cols), r1 - r0, cols, w, eps);
}

void dl_rmsnorm_heads_t(dl_dtype dt, void *x, int64_t ntok, int64_t tok_stride, int64_t heads, int64_t head_dim,
                        const float *w, float eps, int ith, int nth) {
    int64_t t0, t1;
    dl_split(ntok, ith, nth, &t0, &t1);
    const dl_kernel_table *k = dl_kernels();
    for (int64_t t = t0; t < t1; t++) {
        void *p = OFF(x, dt, t * tok_stride);
        k->rmsnorm(dt, dt, p, p, heads, head_dim, w, eps);
    }
}

void dl_modulate_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                   const float *scale, const float *shift, int ith, int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->modulate(dt, OFF(y, dt, r0 * cols), COFF(x, dt, r0 * cols), r1 - r0, cols,
                               scale, shift);
}

void dl_gated_residual_t(dl_dtype dt, void *x, const void *y, int64_t rows, int64_t cols,
                         const float *gate, int ith, int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->gated_residual(dt, OFF(x, dt, r0 * cols), COFF(y, dt, r0 * cols), r1 - r0,
                                     cols, gate);
}

void dl_activation_t(dl_act act, dl_dtype dt, void *y, const void *x, int64_t n, int ith,
                     int nth) {
    int64_t b, e;
    dl_split(n, ith, nth, &b, &e);
    if (e > b) dl_kernels()->activation(act, dt, OFF(y, dt, b), COFF(x, dt, b), e - b);
}

void dl_mul_t(dl_dtype dt, void *y, const void *a, const void *b, int64_t n, int ith, int nth) {
    int64_t e0, e1;
    dl_split(n, ith, nth, &e0, &e1);
    if (e1 > e0) dl_kernels()->mul(dt, OFF(y, dt, e0), COFF(a, dt, e0), COFF(b, dt, e0), e1 - e0);
}

void dl_softmax_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols, int ith,
                  int nth) {
    int64_t r0, r1;
    dl_split(rows, ith, nth, &r0, &r1);
    if (r1 > r0)
        dl_kernels()->softmax(dt, OFF(y, dt, r0 * cols), COFF(x, dt, r0 * cols), r1 - r0, cols);
}

void dl_groupnorm_t(dl_dtype dt, void *y, const void *x, int64_t C, int64_t S, int64_t groups,
                    const float *w, const float *b, float eps, int fuse_silu, int ith, int nth) {
    DL_ASSERT(groups > 0 && C % groups == 0);
    int64_t cpg = C / groups, g0, g1;
    dl_split(groups, ith, nth, &g0, &g1);
    for (int64_t g = g0; g < g1; g++) {
        int64_t c0 = g * cpg;
        dl_kernels()->groupnorm(dt, OFF(y, dt, c0 * S), COFF(x, dt, c0 * S), cpg, S,
                                w ? w + c0 : NULL, b ? b + c0 : NULL, eps, fuse_silu);
    }
}

/* A pure copy: memory-bound, one form for every path. */
void dl_upsample2x_t(dl_dtype dt, void *y, const void *x, int64_t C, int64_t H, int64_t W,
                     int ith, int nth) {
    size_t es = dl_dtype_size(dt);
    int64_t r0, r1;
    dl_split(C * H, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) { /* r = c * H + h: one input row -> two output rows */
        const char *src = (const char *)x + (size_t)(r * W) * es;
        char *d0 = (char *)y + (size_t)(2 * r * 2 * W) * es;
        if (es == 4) {
            const uint32_t *s = (const uint32_t *)src;
            uint32_t *d = (uint32_t *)d0;
            for (int64_t w = 0; w < W; w++) d[2 * w] = d[2 * w + 1] = s[w];
        } else {
            const uint16_t *s = (const uint16_t *)src;
            uint16_t *d = (uint16_t *)d0;
            for (int64_t w = 0; w < W; w++) d[2 * w] = d[2 * w + 1] = s[w];
        }
        memcpy(d0 + (size_t)(2 * W) * es, d0, (size_t)(2 * W) * es);
    }
}

void dl_rope_t(dl_rope_form form, dl_dtype dt, void *x, int64_t seq, int64_t heads,
               int64_t head_dim, int64_t stride, const float *cos_t, const float *sin_t, int ith,
               int nth) {
    DL_ASSERT(head_dim % 2 == 0);
    if (stride == 0) stride = heads * head_dim;
    int64_t s0, s1;
    dl_split(seq, ith, nth, &s0, &s1);
    if (s1 > s0)
        dl_kernels()->rope(form, dt, OFF(x, dt, s0 * stride), s1 - s0, heads, head_dim, stride,
                           cos_t + s0 * (head_dim / 2), sin_t + s0 * (head_dim / 2));
}
