/* Fused attention entry points: argument checks, the choice between the AVX-512
 * kernel and the reference, and the merge of partial results (Difflet §4.3): for
 * disjoint key sets with partials (O_i, m_i, l_i),
 *   m = max m_i,  O = sum O_i e^(m_i - m),  l = sum l_i e^(m_i - m),  out = O / l,
 * which is exactly the softmax over the union of the key sets. */
#include "kernels/kernels_impl.h"

#include <math.h>
#include <stdlib.h>

/* Fill defaulted strides in a private copy. */
static dl_attn_args norm_args(const dl_attn_args *a) {
    dl_attn_args n = *a;
    int64_t hd = a->heads * a->head_dim;
    if (!n.q_stride) n.q_stride = hd;
    if (!n.k_stride) n.k_stride = hd;
    if (!n.v_stride) n.v_stride = hd;
    if (!n.out_stride) n.out_stride = hd;
    return n;
}

dl_status dl_attn_check(const dl_attn_args *a0) {
    dl_attn_args a = norm_args(a0);
    int64_t hd = a.heads * a.head_dim;
    if (a.sq < 0 || a.sk < 0 || a.heads <= 0 || a.head_dim <= 0 || a.head_dim > 1024)
        return dl_fail(DL_ERR_INVALID, "attention: bad shape sq=%lld sk=%lld heads=%lld head_dim=%lld",
                       (long long)a.sq, (long long)a.sk, (long long)a.heads, (long long)a.head_dim);
    if (a.kv_begin < 0 || a.kv_end < a.kv_begin || a.kv_end > a.sk)
        return dl_fail(DL_ERR_INVALID, "attention: valid key interval [%lld, %lld) is not inside [0, %lld)",
                       (long long)a.kv_begin, (long long)a.kv_end, (long long)a.sk);
    if (a.q_stride < hd || a.k_stride < hd || a.v_stride < hd || a.out_stride < hd)
        return dl_fail(DL_ERR_INVALID, "attention: a token stride is below heads*head_dim=%lld", (long long)hd);
    if (!a.q || !a.k || !a.v)
        return dl_fail(DL_ERR_INVALID, "attention: q, k and v are required");
    int parts = (a.o_part != NULL) + (a.m != NULL) + (a.l != NULL);
    if (parts != 0 && parts != 3)
        return dl_fail(DL_ERR_INVALID, "attention: partial outputs need all of o_part, m and l");
    if (!parts && !a.out) return dl_fail(DL_ERR_INVALID, "attention: no output given");
    return DL_OK;
}

/* The fused kernel for this path, or none (the reference). */
typedef enum { ATTN_REF = 0, ATTN_AVX2, ATTN_AVX512 } attn_path;

static attn_path path_for(const dl_attn_args *a) {
    dl_isa isa = dl_kernel_isa();
    if (isa >= DL_ISA_AVX512_BF16 && dl_attn_avx512_supported(a)) return ATTN_AVX512;
    if (isa >= DL_ISA_AVX2 && dl_attn_avx2_supported(a)) return ATTN_AVX2;
    return ATTN_REF;
}

static size_t slice_bytes(attn_path p, const dl_attn_args *a) {
    return p == ATTN_AVX512 ? dl_attn_avx512_scratch(a) : p == ATTN_AVX2 ? dl_attn_avx2_scratch(a) : 0;
}

const char *dl_attn_path_name(const dl_attn_args *a0) {
    dl_attn_args a = norm_args(a0);
    static const char *names[] = {"reference", "avx2", "avx512-bf16"};
    return names[path_for(&a)];
}

size_t dl_attn_scratch_bytes(const dl_attn_args *a0, int nth) {
    dl_attn_args a = norm_args(a0);
    return (size_t)nth * slice_bytes(path_for(&a), &a);
}

void dl_attn_t(const dl_attn_args *a0, void *scratch, int ith, int nth) {
    dl_attn_args a = norm_args(a0);
    attn_path p = path_for(&a);
    if (p == ATTN_AVX512) {
        dl_attn_avx512_t(&a, (char *)scratch + (size_t)ith * slice_bytes(p, &a), ith, nth);
        return;
    }
    if (p == ATTN_AVX2) {
        dl_attn_avx2_t(&a, (char *)scratch + (size_t)ith * slice_bytes(p, &a), ith, nth);
        return;
    }
    /* reference: split (head, row) pairs */
    int64_t b, e;
    dl_split(a.heads * a.sq, ith, nth, &b, &e);
    while (b < e) {
        int64_t h = b / a.sq, q0 = b % a.sq, q1 = a.sq;
        if (q1 - q0 > e - b) q1 = q0 + (e - b);
        dl_attn_ref_rows(&a, h, q0, q1);
        b += q1 - q0;
    }
}

typedef struct {
    const dl_attn_args *a;
    void *scratch;
} attn_task;

static void attn_task_fn(void *ctx, int ith, int nth) {
    attn_task *t = ctx;
    dl_attn_t(t->a, t->scratch, ith, nth);
}

dl_status dl_attn(const dl_attn_args *a, void *scratch) {
    dl_status s = dl_attn_check(a);
    if (s != DL_OK) return s;
    void *own = NULL;
    size_t need = dl_attn_scratch_bytes(a, dl_threads());
    if (!scratch && need) {
        own = scratch = dl_aligned_alloc(need);
        if (!own) return dl_fail(DL_ERR_NOMEM, "attention: cannot allocate %zu bytes of scratch", need);
    }
    attn_task t = {a, scratch};
    dl_parallel(attn_task_fn, &t);
    dl_aligned_free(own);
    return DL_OK;
}

void dl_attn_merge_t(const dl_attn_partial *parts, int n, int64_t sq, int64_t heads,
                     int64_t head_dim, dl_dtype dt, void *out, int64_t out_stride,
                     float *o_merged, float *m_merged, float *l_merged, int ith, int nth) {
    const int64_t D = head_dim;
    if (!out_stride) out_stride = heads * D;
    int64_t b, e;
    dl_split(sq * heads, ith, nth, &b, &e);
    float acc[1024];
    DL_ASSERT(D <= 1024);
    for (int64_t r = b; r < e; r++) { /* r = q * heads + h: rows of the [Sq, H, D] layout */
        int64_t q = r / heads, h = r % heads, st = h * sq + q;
        float m = -INFINITY, l = 0.f;
        for (int i = 0; i < n; i++) m = fmaxf(m, parts[i].m[st]);
        for (int64_t d = 0; d < D; d++) acc[d] = 0.f;
        if (m > -INFINITY) {
            for (int i = 0; i < n; i++) {
                if (parts[i].m[st] == -INFINITY) continue; /* empty part: contributes nothing */
                float w = expf(parts[i].m[st] - m);
                l += w * parts[i].l[st];
                const float *o = parts[i].o + r * D;
                for (int64_t d = 0; d < D; d++) acc[d] += w * o[d];
            }
        }
        if (o_merged) {
            for (int64_t d = 0; d < D; d++) o_merged[r * D + d] = acc[d];
            m_merged[st] = m;
            l_merged[st] = l;
        } else {
            float inv = l > 0.f ? 1.f / l : 0.f;
            for (int64_t d = 0; d < D; d++) dl_store1(dt, out, q * out_stride + h * D + d, acc[d] * inv);
        }
    }
}
