/* Internals shared by the oneDNN wrappers (onednn.c: f32/bf16 matmul and conv;
 * int8.c: quantized linears): the engine, the packed-layout records and the weight
 * reorder. */
#ifndef DIFFLET_ONEDNN_IMPL_H
#define DIFFLET_ONEDNN_IMPL_H

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

#include "difflet/kernels.h"

extern dnnl_engine_t dl_dnnl_eng;
extern dnnl_stream_t dl_dnnl_stream;

/* The CPU engine and stream, created once (an error when oneDNN cannot). */
dl_status dl_dnnl_engine(void);
dnnl_data_type_t dl_dnnl_dt(dl_dtype dt);
const char *dl_dnnl_impl(const_dnnl_primitive_desc_t pd);

/* A memory descriptor as little-endian int64 fields (never the struct's bytes), at
 * most MD_MAX_FIELDS of them; returns the field count. */
#define MD_MAX_FIELDS (7 + 4 * DNNL_MAX_NDIMS + 2 * DNNL_MAX_NDIMS + 4)
size_t dl_dnnl_md_serialize(const dnnl_memory_desc_t *md, int64_t *f);
/* Parse such a record: it must describe the dims of `plain` and exactly `bytes`. */
dl_status dl_dnnl_md_parse(const void *rec, size_t rec_bytes, const dnnl_memory_desc_t *plain, size_t bytes,
                           dnnl_memory_desc_t *md);
/* Whether f32 products may run in OpenBLAS's sgemm (DIFFLET_GEMM is not "onednn"). */
int dl_gemm_blas(void);

/* A primitive of pd and its memory objects: src and dst bound at each run, the
 * weights over w (pd's weights layout), a user scratchpad allocated in *sbuf. On
 * failure what was made is the caller's to destroy. */
dl_status dl_dnnl_bind(const_dnnl_primitive_desc_t pd, const void *w, dnnl_primitive_t *prim, dnnl_memory_t *src,
                       dnnl_memory_t *wei, dnnl_memory_t *dst, dnnl_memory_t *scratch, void **sbuf);
/* One reorder of weights from (from_md over from) into (to_md over to). */
dl_status dl_dnnl_reorder(const dnnl_memory_desc_t *from_md, const void *from, const dnnl_memory_desc_t *to_md, void *to);

/* A staging buffer shared by the primitives of a kind, sized at their creation (the
 * largest wins) and taken under its lock by a run: runs allocate nothing. */
typedef struct {
    pthread_mutex_t lock;
    void *buf;
    size_t cap;
} dl_staging;
dl_status dl_staging_reserve(dl_staging *st, size_t bytes, const char *what);

#define DNNL_TRY(call, what)                                                                 \
    do {                                                                                     \
        dnnl_status_t st_ = (call);                                                          \
        if (st_ != dnnl_success) {                                                           \
            s = dl_fail(DL_ERR_BACKEND, "oneDNN: %s failed (status %d)", what, (int)st_);    \
            goto err;                                                                        \
        }                                                                                    \
    } while (0)

/* ---- int8 linears (int8.c), behind dl_matmul when its desc asks for a quant ---- */
typedef struct dl_q8 dl_q8;
dl_status dl_q8_new(dl_q8 **out, const dl_matmul_desc *d, const void *w, dl_dtype w_dt, const dl_packed *pk,
                    const float *bias);
dl_status dl_q8_run(dl_q8 *q, const void *x, void *y);
void dl_q8_packed(const dl_q8 *q, dl_packed *out);
size_t dl_q8_weight_bytes(const dl_q8 *q);
/* weight-only int8 multiplied by oneDNN's bf16 matmul over dequantized panels (else f32) */
int dl_q8_bf16_panels(const dl_q8 *q);
void dl_q8_free(dl_q8 *q);
/* w [n, k] f32 -> q [n, k] int8 and aux = scales [n], column sums [n]. */
dl_status dl_q8_quantize(const float *w, int64_t n, int64_t k, int8_t *q, float *aux);

#endif
