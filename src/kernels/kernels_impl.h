/* Internals of the kernel layer: the per-ISA function table and the references.
 * A table entry processes a contiguous block of rows (or elements); the public _t
 * functions in dispatch.c split the work by (ith, nth) and pick the table. */
#ifndef DIFFLET_KERNELS_IMPL_H
#define DIFFLET_KERNELS_IMPL_H

#include "difflet/kernels.h"

typedef struct {
    const char *name;
    void (*convert)(dl_dtype dst_dt, void *dst, dl_dtype src_dt, const void *src, int64_t n);
    /* LayerNorm with optional affine (w, b) and optional modulation (scale, shift). */
    /* norms read x in dt and write y in ydt */
    void (*layernorm)(dl_dtype dt, dl_dtype ydt, void *y, const void *x, int64_t rows, int64_t cols,
                      const float *w, const float *b, const float *scale, const float *shift,
                      float eps);
    void (*rmsnorm)(dl_dtype dt, dl_dtype ydt, void *y, const void *x, int64_t rows, int64_t cols,
                    const float *w, float eps);
    void (*modulate)(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                     const float *scale, const float *shift);
    void (*gated_residual)(dl_dtype dt, void *x, const void *y, int64_t rows, int64_t cols,
                           const float *gate);
    void (*activation)(dl_act act, dl_dtype dt, void *y, const void *x, int64_t n);
    void (*softmax)(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols);
    void (*mul)(dl_dtype dt, void *y, const void *a, const void *b, int64_t n);
    /* One group of `cpg` channels x S positions (contiguous); w, b point at the group's
     * first channel. */
    void (*groupnorm)(dl_dtype dt, void *y, const void *x, int64_t cpg, int64_t S,
                      const float *w, const float *b, float eps, int fuse_silu);
    void (*rope)(dl_rope_form form, dl_dtype dt, void *x, int64_t seq, int64_t heads,
                 int64_t head_dim, int64_t stride, const float *cos_t, const float *sin_t);
} dl_kernel_table;

extern const dl_kernel_table dl_kernels_ref;
extern const dl_kernel_table dl_kernels_avx2;
extern const dl_kernel_table dl_kernels_avx512;

/* The table for the current dl_kernel_isa(). */
const dl_kernel_table *dl_kernels(void);

/* Scalar element access by dtype (references and tails). */
static inline float dl_load1(dl_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case DL_F32: return ((const float *)p)[i];
    case DL_BF16: return dl_bf16_to_f32(((const uint16_t *)p)[i]);
    case DL_F16: return dl_f16_to_f32(((const uint16_t *)p)[i]);
    }
    return 0.f;
}
static inline void dl_store1(dl_dtype dt, void *p, int64_t i, float v) {
    switch (dt) {
    case DL_F32: ((float *)p)[i] = v; break;
    case DL_BF16: ((uint16_t *)p)[i] = dl_f32_to_bf16(v); break;
    case DL_F16: ((uint16_t *)p)[i] = dl_f32_to_f16(v); break;
    }
}

/* Tests: the layout record of matmul weights [N, K] row-major in dt (what a
 * dl_packed of plain weights carries); writes at most 512 bytes, returns its size. */
size_t dl_onednn_plain_record(int64_t k, int64_t n, dl_dtype dt, void *rec);

/* Reference attention (naive online softmax per row, f64-free, keys in order). */
void dl_attn_ref_rows(const dl_attn_args *a, int64_t h, int64_t q0, int64_t q1);

/* AVX-512 BF16 attention: thread's share, or returns 0 if the shape is not handled
 * (the caller then uses the reference). */
int dl_attn_avx512_supported(const dl_attn_args *a);
size_t dl_attn_avx512_scratch(const dl_attn_args *a);
void dl_attn_avx512_t(const dl_attn_args *a, void *scratch, int ith, int nth);
int dl_attn_avx2_supported(const dl_attn_args *a);
size_t dl_attn_avx2_scratch(const dl_attn_args *a);
void dl_attn_avx2_t(const dl_attn_args *a, void *scratch, int ith, int nth);

#endif
