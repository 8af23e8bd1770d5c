/* AVX-512 fused attention (flash style): for each (head, block of BQ queries) the
 * keys are visited in blocks of BK; scores for one block live in a BQ x BK tile,
 * the running max / sum per row are updated (online softmax) and the output
 * accumulator is rescaled, so the Sq x Sk score matrix never exists.
 *
 * bf16: both products use vdpbf16ps (pairs of bf16 -> f32 accumulate). Keys are
 * packed per head into 16-key groups, [group][D/2][16 keys][2 dims], so one zmm
 * holds 16 keys x one dim pair and a broadcast query pair scores 16 keys; values
 * are packed into key pairs, [K/2][D][2 keys], so a broadcast pair of
 * probabilities updates 16 output dims. f32: the same loop nest with FMAs.
 *
 * Head dims: any multiple of 8. Q.K runs over D (bf16: over dim pairs), so it takes
 * any even D. V and the output accumulator are Dv = D rounded up to 16 wide (one zmm
 * of dims); the packed V's columns past D are zero, the accumulator's columns past D
 * are never written out, and P.V runs in chunks of 64, 32 and 16 dims.
 *
 * Short sequences: the tiles are the most the kernel works on, not the least. A
 * query block computes only its rows rounded up to the micro-tile's R, and a key
 * block only its keys rounded up to 16 (one group; Q.K micro-tiles of 4, 2 or 1
 * groups), so a 15 x 15 attention costs 16 x 16, not 64 x 128. Dropping the padded
 * keys changes no bit: their probabilities are exactly 0 and their V rows 0, so the
 * terms dropped from the sums were exact zeros (vdpbf16ps flushes denormals, but
 * every accumulator has been through one already).
 *
 * Only keys in [kv_begin, kv_end) are read when packing; the padding of the last
 * block is zero and its scores are masked to probability 0, so keys outside the
 * interval contribute exactly nothing. Each thread owns a scratch slice and packs
 * the K/V of the heads it visits (work items are (head, query block) in order, so a
 * thread packs each of its heads once). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels_impl.h"

/* KG: keys per group, the granularity of a key block */
enum { BQ = 64, BK = 128, R = 4, KG = 16 };

int dl_attn_avx512_supported(const dl_attn_args *a) {
    if (a->dt != DL_F32 && a->dt != DL_BF16) return 0;
    return a->head_dim % 8 == 0 && a->head_dim <= 512;
}

/* width of the packed V rows and of the output accumulator: D up to a zmm of dims */
static inline int64_t dv_width(int64_t D) { return (D + 15) / 16 * 16; }

typedef struct {
    void *qt;             /* [BQ][D] query tile (dtype), zero rows past Sq */
    float *s;             /* [BQ][BK] scores */
    void *p;              /* [BQ][BK] probabilities (bf16 or f32) */
    float *o;             /* [BQ][Dv] unnormalised output */
    float *m, *l, *alpha; /* [BQ] */
    void *kp, *vp;        /* packed K ([K][D]) and V ([K][Dv]) of one head, padded to KG keys */
} tiles;

static int64_t kv_padded(const dl_attn_args *a) {
    int64_t n = a->kv_end - a->kv_begin;
    return (n + KG - 1) / KG * KG;
}

static size_t carve(tiles *t, const dl_attn_args *a, void *base) {
    size_t es = dl_dtype_size(a->dt), D = (size_t)a->head_dim, Dv = (size_t)dv_width(a->head_dim), off = 0;
    size_t kb = (size_t)kv_padded(a) * D * es, vb = (size_t)kv_padded(a) * Dv * es;
    char *b = base;
#define TAKE(field, type, bytes)                                 \
    do {                                                          \
        if (b) t->field = (type)(b + off);                        \
        off += dl_align_up((bytes), DL_ALIGN);                    \
    } while (0)
    TAKE(qt, void *, BQ * D * es);
    TAKE(s, float *, BQ * BK * 4);
    TAKE(p, void *, BQ * BK * 4);
    TAKE(o, float *, BQ * Dv * 4);
    TAKE(m, float *, BQ * 4);
    TAKE(l, float *, BQ * 4);
    TAKE(alpha, float *, BQ * 4);
    TAKE(kp, void *, kb);
    TAKE(vp, void *, vb);
#undef TAKE
    return off;
}

size_t dl_attn_avx512_scratch(const dl_attn_args *a) {
    tiles t = {0};
    return carve(&t, a, NULL);
}

/* ---- packing ------------------------------------------------------------------ */

static void pack_head(const dl_attn_args *a, int64_t h, tiles *t) {
    const int64_t D = a->head_dim, Dv = dv_width(D), n = a->kv_end - a->kv_begin, np = kv_padded(a);
    if (a->dt == DL_BF16) {
        /* K: as uint32 dim pairs, [g][D/2][16] */
        const uint16_t *k = a->k;
        uint32_t *kp = t->kp;
        for (int64_t j = 0; j < np; j++) {
            int64_t g = j / 16, jj = j % 16;
            uint32_t *dst = kp + g * (D / 2) * 16 + jj;
            if (j < n) {
                const uint16_t *src = k + (a->kv_begin + j) * a->k_stride + h * D;
                for (int64_t dp = 0; dp < D / 2; dp++) {
                    uint32_t w;
                    memcpy(&w, src + 2 * dp, 4);
                    dst[dp * 16] = w;
                }
            } else {
                for (int64_t dp = 0; dp < D / 2; dp++) dst[dp * 16] = 0;
            }
        }
        /* V: [K/2][Dv][2], zero past D */
        const uint16_t *v = a->v;
        uint16_t *vp = t->vp;
        for (int64_t j = 0; j < np; j++) {
            uint16_t *dst = vp + (j / 2) * Dv * 2 + (j % 2);
            int64_t d = 0;
            if (j < n) {
                const uint16_t *src = v + (a->kv_begin + j) * a->v_stride + h * D;
                for (; d < D; d++) dst[2 * d] = src[d];
            }
            for (; d < Dv; d++) dst[2 * d] = 0;
        }
    } else {
        /* K: [g][D][16] f32; V: rows, [K][Dv], zero past D */
        const float *k = a->k, *v = a->v;
        float *kp = t->kp, *vp = t->vp;
        for (int64_t j = 0; j < np; j++) {
            float *dst = kp + (j / 16) * D * 16 + (j % 16);
            float *vd = vp + j * Dv;
            if (j < n) {
                const float *src = k + (a->kv_begin + j) * a->k_stride + h * D;
                for (int64_t d = 0; d < D; d++) dst[d * 16] = src[d];
                memcpy(vd, v + (a->kv_begin + j) * a->v_stride + h * D, (size_t)D * 4);
                memset(vd + D, 0, (size_t)(Dv - D) * 4);
            } else {
                for (int64_t d = 0; d < D; d++) dst[d * 16] = 0.f;
                memset(vd, 0, (size_t)Dv * 4);
            }
        }
    }
}

/* ---- micro-kernels: R query rows x G groups of 16 keys ---------------------- */

/* S[R][16 G] = Qt[R][D] . K[16 G keys]^T (bf16 pairs) */
#define QK_BF16(G)                                                                          \
    static inline void qk_bf16_##G(const uint32_t *q, int64_t D, const __m512bh *kp, float *s) { \
        __m512 c[R][G];                                                                     \
        for (int i = 0; i < R; i++)                                                         \
            for (int j = 0; j < G; j++) c[i][j] = _mm512_setzero_ps();                      \
        const int64_t dp2 = D / 2;                                                          \
        for (int64_t dp = 0; dp < dp2; dp++) {                                              \
            __m512bh k[G];                                                                  \
            for (int j = 0; j < G; j++) k[j] = kp[j * dp2 + dp];                            \
            for (int i = 0; i < R; i++) {                                                   \
                __m512bh b = (__m512bh)_mm512_set1_epi32((int)q[i * dp2 + dp]);             \
                for (int j = 0; j < G; j++) c[i][j] = _mm512_dpbf16_ps(c[i][j], b, k[j]);   \
            }                                                                               \
        }                                                                                   \
        for (int i = 0; i < R; i++)                                                         \
            for (int j = 0; j < G; j++) _mm512_storeu_ps(s + i * BK + 16 * j, c[i][j]);     \
    }
QK_BF16(4)
QK_BF16(2)
QK_BF16(1)

#define QK_F32(G)                                                                           \
    static inline void qk_f32_##G(const float *q, int64_t D, const float *kp, float *s) {   \
        __m512 c[R][G];                                                                     \
        for (int i = 0; i < R; i++)                                                         \
            for (int j = 0; j < G; j++) c[i][j] = _mm512_setzero_ps();                      \
        for (int64_t d = 0; d < D; d++) {                                                   \
            __m512 k[G];                                                                    \
            for (int j = 0; j < G; j++) k[j] = _mm512_loadu_ps(kp + (j * D + d) * 16);      \
            for (int i = 0; i < R; i++) {                                                   \
                __m512 b = _mm512_set1_ps(q[i * D + d]);                                    \
                for (int j = 0; j < G; j++) c[i][j] = _mm512_fmadd_ps(b, k[j], c[i][j]);    \
            }                                                                               \
        }                                                                                   \
        for (int i = 0; i < R; i++)                                                         \
            for (int j = 0; j < G; j++) _mm512_storeu_ps(s + i * BK + 16 * j, c[i][j]);     \
    }
QK_F32(4)
QK_F32(2)
QK_F32(1)

/* O[R][d0 : d0+16*C] = alpha * O + P[R][nk] . V[nk][...] for C chunks of 16 dims;
 * Dv: the row width of V and O; nk: keys, even */
#define PV_BF16(C)                                                                          \
    static inline void pv_bf16_##C(const uint32_t *p, const __m512bh *vp, int64_t Dv, int64_t d0, \
                                   int64_t nk, float *o, const float *alpha) {              \
        __m512 c[R][C];                                                                     \
        for (int i = 0; i < R; i++) {                                                       \
            __m512 al = _mm512_set1_ps(alpha[i]);                                           \
            for (int j = 0; j < C; j++)                                                     \
                c[i][j] = _mm512_mul_ps(al, _mm512_loadu_ps(o + i * Dv + d0 + 16 * j));     \
        }                                                                                   \
        const int64_t dv = Dv / 16; /* zmm per key pair */                                  \
        for (int64_t kp = 0; kp < nk / 2; kp++) {                                           \
            __m512bh v[C];                                                                  \
            for (int j = 0; j < C; j++) v[j] = vp[kp * dv + d0 / 16 + j];                   \
            for (int i = 0; i < R; i++) {                                                   \
                __m512bh b = (__m512bh)_mm512_set1_epi32((int)p[i * (BK / 2) + kp]);        \
                for (int j = 0; j < C; j++) c[i][j] = _mm512_dpbf16_ps(c[i][j], b, v[j]);   \
            }                                                                               \
        }                                                                                   \
        for (int i = 0; i < R; i++)                                                         \
            for (int j = 0; j < C; j++) _mm512_storeu_ps(o + i * Dv + d0 + 16 * j, c[i][j]); \
    }
PV_BF16(4)
PV_BF16(2)
PV_BF16(1)

#define PV_F32(C)                                                                           \
    static inline void pv_f32_##C(const float *p, const float *vp, int64_t Dv, int64_t d0, \
                                  int64_t nk, float *o, const float *alpha) {               \
        __m512 c[R][C];                                                                     \
        for (int i = 0; i < R; i++) {                                                       \
            __m512 al = _mm512_set1_ps(alpha[i]);                                           \
            for (int j = 0; j < C; j++)                                                     \
                c[i][j] = _mm512_mul_ps(al, _mm512_loadu_ps(o + i * Dv + d0 + 16 * j));     \
        }                                                                                   \
        for (int64_t k = 0; k < nk; k++) {                                                  \
            __m512 v[C];                                                                    \
            for (int j = 0; j < C; j++) v[j] = _mm512_loadu_ps(vp + k * Dv + d0 + 16 * j);  \
            for (int i = 0; i < R; i++) {                                                   \
                __m512 b = _mm512_set1_ps(p[i * BK + k]);                                   \
                for (int j = 0; j < C; j++) c[i][j] = _mm512_fmadd_ps(b, v[j], c[i][j]);    \
            }                                                                               \
        }                                                                                   \
        for (int i = 0; i < R; i++)                                                         \
            for (int j = 0; j < C; j++) _mm512_storeu_ps(o + i * Dv + d0 + 16 * j, c[i][j]); \
    }
PV_F32(4)
PV_F32(2)
PV_F32(1)

/* e^x for the softmax: same polynomial as the element-wise kernels; x < -87.3 -> 0. */
static inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.72283f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), p, _mm512_castsi512_ps(e));
}

static inline __mmask16 lanes(int64_t valid, int64_t c) {
    return valid - c >= 16 ? 0xffff : valid > c ? (__mmask16)((1u << (valid - c)) - 1u) : 0;
}

/* Online softmax over one block of keys [kb, kb + nb) of the valid interval, for
 * the query rows q0 + i, i < rows, over the block's first nbp >= nb columns (a
 * multiple of 16): scores scaled, biased (bias_rel), masked past nb and, when
 * causal, past the row's own position. A row with no valid key yet keeps m = -inf,
 * l = 0 and gets probability 0 everywhere; so do the zero rows past the nq real ones. */
static void softmax_block(tiles *t, const dl_attn_args *a, int64_t h, int64_t q0, int64_t nq, int64_t rows, int64_t kb,
                          int64_t nb, int64_t nbp, int bf16) {
    const __m512 vs = _mm512_set1_ps(a->scale);
    const int64_t key0 = a->kv_begin + kb; /* absolute index of the block's first key */
    const size_t ps = bf16 ? 2 : 4;
    for (int64_t i = 0; i < rows; i++) {
        float *s = t->s + i * BK;
        int64_t valid = nb, q = q0 + i;
        if (i >= nq) { /* a zero row past the end: no key, its output is never read */
            t->alpha[i] = 1.f;
            memset((char *)t->p + (size_t)(i * BK) * ps, 0, (size_t)nbp * ps);
            continue;
        }
        if (a->causal && q + 1 - key0 < valid) valid = q + 1 - key0 < 0 ? 0 : q + 1 - key0;
        if (a->bias_rel) { /* the row's biases for keys key0.. are contiguous */
            const float *b = a->bias_rel + h * (a->sq + a->sk - 1) + (key0 - q + a->sq - 1);
            for (int64_t c = 0; c < nbp; c += 16) {
                __mmask16 k = lanes(valid, c);
                _mm512_storeu_ps(s + c, _mm512_maskz_fmadd_ps(k, _mm512_loadu_ps(s + c), vs, _mm512_maskz_loadu_ps(k, b + c)));
            }
        } else {
            for (int64_t c = 0; c < nbp; c += 16) _mm512_storeu_ps(s + c, _mm512_mul_ps(_mm512_loadu_ps(s + c), vs));
        }
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t c = 0; c < nbp; c += 16) mx = _mm512_mask_max_ps(mx, lanes(valid, c), mx, _mm512_loadu_ps(s + c));
        float m_old = t->m[i], m_new = fmaxf(m_old, _mm512_reduce_max_ps(mx));
        t->alpha[i] = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
        if (m_new == -INFINITY) { /* nothing valid yet for this row */
            t->alpha[i] = 1.f;
            memset((char *)t->p + (size_t)(i * BK) * ps, 0, (size_t)nbp * ps);
            continue;
        }
        __m512 vm = _mm512_set1_ps(m_new), sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < nbp; c += 16) {
            __mmask16 k = lanes(valid, c);
            __m512 p = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm)));
            sum = _mm512_add_ps(sum, p);
            if (bf16)
                _mm256_storeu_si256((__m256i *)((uint16_t *)t->p + i * BK + c), (__m256i)_mm512_cvtneps_pbh(p));
            else
                _mm512_storeu_ps((float *)t->p + i * BK + c, p);
        }
        t->l[i] = t->l[i] * t->alpha[i] + _mm512_reduce_add_ps(sum);
        t->m[i] = m_new;
    }
}

static void run_block(const dl_attn_args *a, int64_t h, int64_t q0, tiles *t) {
    const int64_t D = a->head_dim, Dv = dv_width(D), nq = a->sq - q0 < BQ ? a->sq - q0 : BQ;
    const int64_t rows = (nq + R - 1) / R * R; /* rows computed: nq up to the micro-tile */
    const int64_t n = a->kv_end - a->kv_begin;
    const int bf16 = a->dt == DL_BF16;
    const size_t es = dl_dtype_size(a->dt);
    /* query tile, zero rows past the end */
    for (int64_t i = 0; i < rows; i++) {
        char *dst = (char *)t->qt + (size_t)(i * D) * es;
        if (i < nq)
            memcpy(dst, (const char *)a->q + (size_t)((q0 + i) * a->q_stride + h * D) * es, (size_t)D * es);
        else
            memset(dst, 0, (size_t)D * es);
    }
    memset(t->o, 0, (size_t)(rows * Dv) * 4);
    for (int64_t i = 0; i < rows; i++) {
        t->m[i] = -INFINITY;
        t->l[i] = 0.f;
    }
    for (int64_t kb = 0; kb < n; kb += BK) {
        const int64_t nb = n - kb < BK ? n - kb : BK, nbp = (nb + KG - 1) / KG * KG; /* keys, computed keys */
        const int64_t ng = nbp / 16;                                                  /* groups */
        if (a->causal && a->kv_begin + kb > q0 + nq - 1) break; /* no row of the tile sees these keys */
        for (int64_t r0 = 0; r0 < rows; r0 += R) {
            int64_t g = 0;
            if (bf16) {
                const uint32_t *q = (const uint32_t *)t->qt + r0 * (D / 2);
                const __m512bh *kp = (const __m512bh *)t->kp + (kb / 16) * (D / 2);
                float *s = t->s + r0 * BK;
                for (; g + 4 <= ng; g += 4) qk_bf16_4(q, D, kp + g * (D / 2), s + g * 16);
                if (g + 2 <= ng) qk_bf16_2(q, D, kp + g * (D / 2), s + g * 16), g += 2;
                if (g < ng) qk_bf16_1(q, D, kp + g * (D / 2), s + g * 16);
            } else {
                const float *q = (const float *)t->qt + r0 * D;
                const float *kp = (const float *)t->kp + (kb / 16) * D * 16;
                float *s = t->s + r0 * BK;
                for (; g + 4 <= ng; g += 4) qk_f32_4(q, D, kp + g * D * 16, s + g * 16);
                if (g + 2 <= ng) qk_f32_2(q, D, kp + g * D * 16, s + g * 16), g += 2;
                if (g < ng) qk_f32_1(q, D, kp + g * D * 16, s + g * 16);
            }
        }
        softmax_block(t, a, h, q0, nq, rows, kb, nb, nbp, bf16);
        for (int64_t r0 = 0; r0 < rows; r0 += R) {
            float *o = t->o + r0 * Dv;
            int64_t d0 = 0;
            if (bf16) {
                const uint32_t *p = (const uint32_t *)((uint16_t *)t->p + r0 * BK);
                const __m512bh *vp = (const __m512bh *)t->vp + (kb / 2) * (Dv / 16);
                for (; d0 + 64 <= Dv; d0 += 64) pv_bf16_4(p, vp, Dv, d0, nbp, o, t->alpha + r0);
                for (; d0 + 32 <= Dv; d0 += 32) pv_bf16_2(p, vp, Dv, d0, nbp, o, t->alpha + r0);
                if (d0 < Dv) pv_bf16_1(p, vp, Dv, d0, nbp, o, t->alpha + r0);
            } else {
                const float *p = (const float *)t->p + r0 * BK;
                const float *vp = (const float *)t->vp + kb * Dv;
                for (; d0 + 64 <= Dv; d0 += 64) pv_f32_4(p, vp, Dv, d0, nbp, o, t->alpha + r0);
                for (; d0 + 32 <= Dv; d0 += 32) pv_f32_2(p, vp, Dv, d0, nbp, o, t->alpha + r0);
                if (d0 < Dv) pv_f32_1(p, vp, Dv, d0, nbp, o, t->alpha + r0);
            }
        }
    }
    for (int64_t i = 0; i < nq; i++) {
        int64_t q = q0 + i;
        const float *o = t->o + i * Dv;
        if (a->o_part) {
            memcpy(a->o_part + (q * a->heads + h) * D, o, (size_t)D * 4);
            a->m[h * a->sq + q] = t->m[i];
            a->l[h * a->sq + q] = t->l[i];
        } else {
            __m512 inv = _mm512_set1_ps(t->l[i] > 0.f ? 1.f / t->l[i] : 0.f);
            char *dst = (char *)a->out + (size_t)(q * a->out_stride + h * D) * es;
            for (int64_t d = 0; d < D; d += 16) { /* o is Dv wide: the last load may pass D */
                __m512 v = _mm512_mul_ps(_mm512_loadu_ps(o + d), inv);
                if (D - d >= 16) {
                    if (bf16)
                        _mm256_storeu_si256((__m256i *)((uint16_t *)dst + d), (__m256i)_mm512_cvtneps_pbh(v));
                    else
                        _mm512_storeu_ps((float *)dst + d, v);
                } else { /* the last 8 dims of a D that is 8 mod 16 */
                    if (bf16)
                        _mm_storeu_si128((__m128i *)((uint16_t *)dst + d),
                                         _mm256_castsi256_si128((__m256i)_mm512_cvtneps_pbh(v)));
                    else
                        _mm256_storeu_ps((float *)dst + d, _mm512_castps512_ps256(v));
                }
            }
        }
    }
}

void dl_attn_avx512_t(const dl_attn_args *a, void *scratch, int ith, int nth) {
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
