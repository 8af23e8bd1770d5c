/* AVX2 fused attention (flash style), the same contract and loop nest as the
 * AVX-512 kernel (attn_avx512.c): for each (head, block of BQ queries) the keys are
 * visited in blocks of BK, scores of one block live in a BQ x BK tile, the running
 * max / sum per row are updated (online softmax) and the output accumulator is
 * rescaled, so the Sq x Sk score matrix never exists.
 *
 * AVX2 has no bf16 dot product: bf16 Q, K and V are widened to f32 when they are
 * packed (exact), both products are f32 FMAs, and the probabilities are rounded to
 * bf16 before P.V, as the AVX-512 kernel's vdpbf16ps path rounds them, so both
 * paths compute the same quantity up to summation order. Keys are packed per head
 * into 8-key groups, [group][D][8], so a broadcast query dim scores 8 keys; values
 * stay rows, [K][D].
 *
 * Head dims: any multiple of 8. Q.K runs over D one dim at a time, so it takes any
 * D; P.V updates 16 dims per micro-tile and, when D is 8 mod 16, the last 8 with a
 * one-register micro-tile.
 *
 * Short sequences: the tiles are the most the kernel works on, not the least. A
 * query block computes only its rows rounded up to the micro-tile's R, and a key
 * block only its keys rounded up to 16 (one Q.K micro-tile), so a 15 x 15 attention
 * costs 18 x 16, not 60 x 128. Dropping the padded keys changes no bit: their
 * probabilities are exactly 0 and their V rows 0, so the terms dropped from the sums
 * were exact zeros.
 *
 * Only keys in [kv_begin, kv_end) are read when packing; the padding of the last
 * block is zero and its scores are masked to probability 0. Each thread owns a
 * scratch slice and packs the K/V of the heads it visits. */
#include <math.h>
#include <string.h>

#include "kernels/kernels_impl.h"
#include "avx2_vec.h"
#include "vexp.inc"

/* 6 x 16 micro-tiles: 12 accumulators, 2 loads, 1 broadcast of AVX2's 16 registers;
 * KG: keys per Q.K micro-tile, the granularity of a key block */
enum { BQ = 60, BK = 128, R = 6, KG = 16 };

int dl_attn_avx2_supported(const dl_attn_args *a) {
    if (a->dt != DL_F32 && a->dt != DL_BF16) return 0;
    return a->head_dim % 8 == 0 && a->head_dim <= 512;
}

typedef struct {
    float *qt;            /* [BQ][D] query tile, zero rows past Sq */
    float *s;             /* [BQ][BK] scores */
    float *p;             /* [BQ][BK] probabilities (bf16-rounded for bf16) */
    float *o;             /* [BQ][D] unnormalised output */
    float *m, *l, *alpha; /* [BQ] */
    float *kp, *vp;       /* packed K and V of one head, padded to KG keys */
} tiles;

static int64_t kv_padded(const dl_attn_args *a) {
    int64_t n = a->kv_end - a->kv_begin;
    return (n + KG - 1) / KG * KG;
}

static size_t carve(tiles *t, const dl_attn_args *a, void *base) {
    size_t D = (size_t)a->head_dim, off = 0;
    size_t kvb = (size_t)kv_padded(a) * D * 4;
    char *b = base;
#define TAKE(field, bytes)                                        \
    do {                                                          \
        if (b) t->field = (float *)(b + off);                     \
        off += dl_align_up((bytes), DL_ALIGN);                    \
    } while (0)
    TAKE(qt, BQ * D * 4);
    TAKE(s, BQ * BK * 4);
    TAKE(p, BQ * BK * 4);
    TAKE(o, BQ * D * 4);
    TAKE(m, BQ * 4);
    TAKE(l, BQ * 4);
    TAKE(alpha, BQ * 4);
    TAKE(kp, kvb);
    TAKE(vp, kvb);
#undef TAKE
    return off;
}

size_t dl_attn_avx2_scratch(const dl_attn_args *a) {
    tiles t = {0};
    return carve(&t, a, NULL);
}

/* n values of dtype dt from src to f32 dst, widened */
static inline void widen(float *dst, dl_dtype dt, const void *src, int64_t n) {
    if (dt == DL_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) V_STOREU(dst + i, V_LOAD_BF16((const uint16_t *)src + i));
    for (; i < n; i++) dst[i] = dl_bf16_to_f32(((const uint16_t *)src)[i]);
}

/* r[i][d] -> r[d][i] for an 8 x 8 block */
static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* K of head h into 8-key groups [group][D][8] (a full group by 8 x 8 transposes),
 * V into rows [K][D]; zero past the n valid keys up to a multiple of KG */
static void pack_head(const dl_attn_args *a, int64_t h, tiles *t) {
    const int64_t D = a->head_dim, n = a->kv_end - a->kv_begin, np = kv_padded(a);
    const size_t es = dl_dtype_size(a->dt);
    const char *k0 = (const char *)a->k + (size_t)(a->kv_begin * a->k_stride + h * D) * es;
    const char *v0 = (const char *)a->v + (size_t)(a->kv_begin * a->v_stride + h * D) * es;
    float row[512];
    for (int64_t j0 = 0; j0 < np; j0 += 8) {
        float *kd = t->kp + j0 * D; /* group j0 / 8 */
        if (j0 + 8 <= n) {
            for (int64_t d0 = 0; d0 < D; d0 += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) {
                    const char *src = k0 + (size_t)((j0 + i) * a->k_stride + d0) * es;
                    r[i] = a->dt == DL_F32 ? _mm256_loadu_ps((const float *)src) : V_LOAD_BF16(src);
                }
                transpose8(r);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(kd + (d0 + i) * 8, r[i]);
            }
        } else {
            for (int64_t j = j0; j < j0 + 8; j++) {
                if (j < n) widen(row, a->dt, k0 + (size_t)(j * a->k_stride) * es, D);
                for (int64_t d = 0; d < D; d++) kd[d * 8 + (j - j0)] = j < n ? row[d] : 0.f;
            }
        }
    }
    for (int64_t j = 0; j < np; j++) {
        if (j < n)
            widen(t->vp + j * D, a->dt, v0 + (size_t)(j * a->v_stride) * es, D);
        else
            memset(t->vp + j * D, 0, (size_t)D * 4);
    }
}

/* S[R][16] = Qt[R][D] . K[16 keys]^T (R = 6 rows, spelled out: the row pointers and
 * accumulators stay in registers) */
static inline void qk(const float *q, int64_t D, const float *kp, float *s) {
    const float *q0 = q, *q1 = q + D, *q2 = q + 2 * D, *q3 = q + 3 * D, *q4 = q + 4 * D, *q5 = q + 5 * D;
    const float *k0 = kp, *k1 = kp + D * 8;
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0, b4 = a0,
           a5 = a0, b5 = a0;
    for (int64_t d = 0; d < D; d++) {
        __m256 x0 = _mm256_loadu_ps(k0 + d * 8), x1 = _mm256_loadu_ps(k1 + d * 8), b;
        b = _mm256_broadcast_ss(q0 + d), a0 = _mm256_fmadd_ps(b, x0, a0), b0 = _mm256_fmadd_ps(b, x1, b0);
        b = _mm256_broadcast_ss(q1 + d), a1 = _mm256_fmadd_ps(b, x0, a1), b1 = _mm256_fmadd_ps(b, x1, b1);
        b = _mm256_broadcast_ss(q2 + d), a2 = _mm256_fmadd_ps(b, x0, a2), b2 = _mm256_fmadd_ps(b, x1, b2);
        b = _mm256_broadcast_ss(q3 + d), a3 = _mm256_fmadd_ps(b, x0, a3), b3 = _mm256_fmadd_ps(b, x1, b3);
        b = _mm256_broadcast_ss(q4 + d), a4 = _mm256_fmadd_ps(b, x0, a4), b4 = _mm256_fmadd_ps(b, x1, b4);
        b = _mm256_broadcast_ss(q5 + d), a5 = _mm256_fmadd_ps(b, x0, a5), b5 = _mm256_fmadd_ps(b, x1, b5);
    }
    _mm256_storeu_ps(s, a0), _mm256_storeu_ps(s + 8, b0);
    _mm256_storeu_ps(s + BK, a1), _mm256_storeu_ps(s + BK + 8, b1);
    _mm256_storeu_ps(s + 2 * BK, a2), _mm256_storeu_ps(s + 2 * BK + 8, b2);
    _mm256_storeu_ps(s + 3 * BK, a3), _mm256_storeu_ps(s + 3 * BK + 8, b3);
    _mm256_storeu_ps(s + 4 * BK, a4), _mm256_storeu_ps(s + 4 * BK + 8, b4);
    _mm256_storeu_ps(s + 5 * BK, a5), _mm256_storeu_ps(s + 5 * BK + 8, b5);
}

/* O[R][d0 : d0+16] = alpha * O + P[R][nk] . V[nk][d0 : d0+16] (R = 6 rows) */
static inline void pv(const float *p, const float *vp, int64_t D, int64_t d0, int64_t nk, float *o, const float *alpha) {
    float *o0 = o + d0, *o1 = o0 + D, *o2 = o0 + 2 * D, *o3 = o0 + 3 * D, *o4 = o0 + 4 * D, *o5 = o0 + 5 * D;
    const float *p0 = p, *p1 = p + BK, *p2 = p + 2 * BK, *p3 = p + 3 * BK, *p4 = p + 4 * BK, *p5 = p + 5 * BK, *v = vp + d0;
    __m256 l = _mm256_set1_ps(alpha[0]);
    __m256 a0 = _mm256_mul_ps(l, _mm256_loadu_ps(o0)), b0 = _mm256_mul_ps(l, _mm256_loadu_ps(o0 + 8));
    l = _mm256_set1_ps(alpha[1]);
    __m256 a1 = _mm256_mul_ps(l, _mm256_loadu_ps(o1)), b1 = _mm256_mul_ps(l, _mm256_loadu_ps(o1 + 8));
    l = _mm256_set1_ps(alpha[2]);
    __m256 a2 = _mm256_mul_ps(l, _mm256_loadu_ps(o2)), b2 = _mm256_mul_ps(l, _mm256_loadu_ps(o2 + 8));
    l = _mm256_set1_ps(alpha[3]);
    __m256 a3 = _mm256_mul_ps(l, _mm256_loadu_ps(o3)), b3 = _mm256_mul_ps(l, _mm256_loadu_ps(o3 + 8));
    l = _mm256_set1_ps(alpha[4]);
    __m256 a4 = _mm256_mul_ps(l, _mm256_loadu_ps(o4)), b4 = _mm256_mul_ps(l, _mm256_loadu_ps(o4 + 8));
    l = _mm256_set1_ps(alpha[5]);
    __m256 a5 = _mm256_mul_ps(l, _mm256_loadu_ps(o5)), b5 = _mm256_mul_ps(l, _mm256_loadu_ps(o5 + 8));
    for (int64_t k = 0; k < nk; k++, v += D) {
        __m256 x0 = _mm256_loadu_ps(v), x1 = _mm256_loadu_ps(v + 8), b;
        b = _mm256_broadcast_ss(p0 + k), a0 = _mm256_fmadd_ps(b, x0, a0), b0 = _mm256_fmadd_ps(b, x1, b0);
        b = _mm256_broadcast_ss(p1 + k), a1 = _mm256_fmadd_ps(b, x0, a1), b1 = _mm256_fmadd_ps(b, x1, b1);
        b = _mm256_broadcast_ss(p2 + k), a2 = _mm256_fmadd_ps(b, x0, a2), b2 = _mm256_fmadd_ps(b, x1, b2);
        b = _mm256_broadcast_ss(p3 + k), a3 = _mm256_fmadd_ps(b, x0, a3), b3 = _mm256_fmadd_ps(b, x1, b3);
        b = _mm256_broadcast_ss(p4 + k), a4 = _mm256_fmadd_ps(b, x0, a4), b4 = _mm256_fmadd_ps(b, x1, b4);
        b = _mm256_broadcast_ss(p5 + k), a5 = _mm256_fmadd_ps(b, x0, a5), b5 = _mm256_fmadd_ps(b, x1, b5);
    }
    _mm256_storeu_ps(o0, a0), _mm256_storeu_ps(o0 + 8, b0);
    _mm256_storeu_ps(o1, a1), _mm256_storeu_ps(o1 + 8, b1);
    _mm256_storeu_ps(o2, a2), _mm256_storeu_ps(o2 + 8, b2);
    _mm256_storeu_ps(o3, a3), _mm256_storeu_ps(o3 + 8, b3);
    _mm256_storeu_ps(o4, a4), _mm256_storeu_ps(o4 + 8, b4);
    _mm256_storeu_ps(o5, a5), _mm256_storeu_ps(o5 + 8, b5);
}

/* The same for 8 dims (the last 8 when D is 8 mod 16): one register per row */
static inline void pv8(const float *p, const float *vp, int64_t D, int64_t d0, int64_t nk, float *o, const float *alpha) {
    float *o0 = o + d0, *o1 = o0 + D, *o2 = o0 + 2 * D, *o3 = o0 + 3 * D, *o4 = o0 + 4 * D, *o5 = o0 + 5 * D;
    const float *p0 = p, *p1 = p + BK, *p2 = p + 2 * BK, *p3 = p + 3 * BK, *p4 = p + 4 * BK, *p5 = p + 5 * BK, *v = vp + d0;
    __m256 a0 = _mm256_mul_ps(_mm256_set1_ps(alpha[0]), _mm256_loadu_ps(o0));
    __m256 a1 = _mm256_mul_ps(_mm256_set1_ps(alpha[1]), _mm256_loadu_ps(o1));
    __m256 a2 = _mm256_mul_ps(_mm256_set1_ps(alpha[2]), _mm256_loadu_ps(o2));
    __m256 a3 = _mm256_mul_ps(_mm256_set1_ps(alpha[3]), _mm256_loadu_ps(o3));
    __m256 a4 = _mm256_mul_ps(_mm256_set1_ps(alpha[4]), _mm256_loadu_ps(o4));
    __m256 a5 = _mm256_mul_ps(_mm256_set1_ps(alpha[5]), _mm256_loadu_ps(o5));
    for (int64_t k = 0; k < nk; k++, v += D) {
        __m256 x = _mm256_loadu_ps(v);
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + k), x, a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + k), x, a1);
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + k), x, a2);
        a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + k), x, a3);
        a4 = _mm256_fmadd_ps(_mm256_broadcast_ss(p4 + k), x, a4);
        a5 = _mm256_fmadd_ps(_mm256_broadcast_ss(p5 + k), x, a5);
    }
    _mm256_storeu_ps(o0, a0), _mm256_storeu_ps(o1, a1), _mm256_storeu_ps(o2, a2);
    _mm256_storeu_ps(o3, a3), _mm256_storeu_ps(o4, a4), _mm256_storeu_ps(o5, a5);
}

/* lanes c .. c+7 that are below `valid`, as an all-ones / zero mask */
static inline __m256 lanes(int64_t valid, int64_t c) {
    int64_t r = valid - c;
    int v = r <= 0 ? 0 : r >= 8 ? 8 : (int)r;
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* f32 values rounded to the nearest bf16 (kept in f32) */
static inline __m256 round_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Online softmax over one block of keys [kb, kb + nb) of the valid interval, for the
 * query rows q0 + i, i < rows, over the block's first nbp >= nb columns (a multiple of
 * 8; see the AVX-512 kernel: the same masking and row states). Rows past the nq real
 * ones see no key. */
static void softmax_block(tiles *t, const dl_attn_args *a, int64_t h, int64_t q0, int64_t nq, int64_t rows, int64_t kb,
                          int64_t nb, int64_t nbp, int bf16) {
    const __m256 vs = _mm256_set1_ps(a->scale), ninf = _mm256_set1_ps(-INFINITY);
    const int64_t key0 = a->kv_begin + kb;
    for (int64_t i = 0; i < rows; i++) {
        float *s = t->s + i * BK;
        int64_t valid = nb, q = q0 + i;
        if (i >= nq) { /* a zero row past the end: no key, its output is never read */
            t->alpha[i] = 1.f;
            memset(t->p + i * BK, 0, (size_t)nbp * 4);
            continue;
        }
        if (a->causal && q + 1 - key0 < valid) valid = q + 1 - key0 < 0 ? 0 : q + 1 - key0;
        if (a->bias_rel) {
            const float *b = a->bias_rel + h * (a->sq + a->sk - 1) + (key0 - q + a->sq - 1);
            for (int64_t c = 0; c < nbp; c += 8) {
                __m256 k = lanes(valid, c);
                __m256 bv = _mm256_maskload_ps(b + c, _mm256_castps_si256(k));
                _mm256_storeu_ps(s + c, _mm256_and_ps(k, _mm256_fmadd_ps(_mm256_loadu_ps(s + c), vs, bv)));
            }
        } else {
            for (int64_t c = 0; c < nbp; c += 8) _mm256_storeu_ps(s + c, _mm256_mul_ps(_mm256_loadu_ps(s + c), vs));
        }
        __m256 mx = ninf;
        for (int64_t c = 0; c < nbp; c += 8) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + c), lanes(valid, c)));
        float m_old = t->m[i], m_new = fmaxf(m_old, hmax8(mx));
        t->alpha[i] = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
        if (m_new == -INFINITY) { /* nothing valid yet for this row */
            t->alpha[i] = 1.f;
            memset(t->p + i * BK, 0, (size_t)nbp * 4);
            continue;
        }
        __m256 vm = _mm256_set1_ps(m_new), sum = _mm256_setzero_ps();
        for (int64_t c = 0; c < nbp; c += 8) {
            __m256 p = _mm256_and_ps(lanes(valid, c), vexp(_mm256_sub_ps(_mm256_loadu_ps(s + c), vm)));
            sum = _mm256_add_ps(sum, p);
            _mm256_storeu_ps(t->p + i * BK + c, bf16 ? round_bf16(p) : p);
        }
        t->l[i] = t->l[i] * t->alpha[i] + hsum8(sum);
        t->m[i] = m_new;
    }
}

static void run_block(const dl_attn_args *a, int64_t h, int64_t q0, tiles *t) {
    const int64_t D = a->head_dim, nq = a->sq - q0 < BQ ? a->sq - q0 : BQ;
    const int64_t rows = (nq + R - 1) / R * R; /* rows computed: nq up to the micro-tile */
    const int64_t n = a->kv_end - a->kv_begin;
    const int bf16 = a->dt == DL_BF16;
    const size_t es = dl_dtype_size(a->dt);
    for (int64_t i = 0; i < rows; i++) {
        if (i < nq)
            widen(t->qt + i * D, a->dt, (const char *)a->q + (size_t)((q0 + i) * a->q_stride + h * D) * es, D);
        else
            memset(t->qt + i * D, 0, (size_t)D * 4);
    }
    memset(t->o, 0, (size_t)(rows * D) * 4);
    for (int64_t i = 0; i < rows; i++) {
        t->m[i] = -INFINITY;
        t->l[i] = 0.f;
    }
    for (int64_t kb = 0; kb < n; kb += BK) {
        const int64_t nb = n - kb < BK ? n - kb : BK, nbp = (nb + KG - 1) / KG * KG; /* keys, computed keys */
        if (a->causal && a->kv_begin + kb > q0 + nq - 1) break; /* no row of the tile sees these keys */
        for (int64_t r0 = 0; r0 < rows; r0 += R)
            for (int64_t g = 0; g < nbp / 8; g += 2)
                qk(t->qt + r0 * D, D, t->kp + (kb / 8 + g) * D * 8, t->s + r0 * BK + g * 8);
        softmax_block(t, a, h, q0, nq, rows, kb, nb, nbp, bf16);
        for (int64_t r0 = 0; r0 < rows; r0 += R) {
            int64_t d0 = 0;
            for (; d0 + 16 <= D; d0 += 16) pv(t->p + r0 * BK, t->vp + kb * D, D, d0, nbp, t->o + r0 * D, t->alpha + r0);
            if (d0 < D) pv8(t->p + r0 * BK, t->vp + kb * D, D, d0, nbp, t->o + r0 * D, t->alpha + r0);
        }
    }
    for (int64_t i = 0; i < nq; i++) {
        int64_t q = q0 + i;
        const float *o = t->o + i * D;
        if (a->o_part) {
            memcpy(a->o_part + (q * a->heads + h) * D, o, (size_t)D * 4);
            a->m[h * a->sq + q] = t->m[i];
            a->l[h * a->sq + q] = t->l[i];
        } else {
            __m256 inv = _mm256_set1_ps(t->l[i] > 0.f ? 1.f / t->l[i] : 0.f);
            char *dst = (char *)a->out + (size_t)(q * a->out_stride + h * D) * es;
            for (int64_t d = 0; d < D; d += 8) {
                __m256 v = _mm256_mul_ps(_mm256_loadu_ps(o + d), inv);
                if (bf16)
                    store_bf16x8((uint16_t *)dst + d, v);
                else
                    _mm256_storeu_ps((float *)dst + d, v);
            }
        }
    }
}

void dl_attn_avx2_t(const dl_attn_args *a, void *scratch, int ith, int nth) {
    tiles t = {0};
    carve(&t, a, scratch);
    const int64_t nqb = (a->sq + BQ - 1) / BQ;
    int64_t w0, w1, packed = -1;
    dl_split(a->heads * nqb, ith, nth, &w0, &w1);
    for (int64_t w = w0; w < w1; w++) {
        int64_t h = w / nqb, qb = w % nqb;
        if (h != packed) {
            pack_head(a, h, &t);
            packed = h;
        }
        run_block(a, h, qb * BQ, &t);
    }
}
