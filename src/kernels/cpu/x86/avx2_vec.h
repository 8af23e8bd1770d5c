/* The AVX2 + FMA + F16C vector vocabulary (8 f32 lanes) shared by the element-wise
 * kernels (elem_simd.inc) and the AVX2 attention. bf16 stores round to nearest even
 * in integer code (no AVX512_BF16 here). */
#ifndef DIFFLET_AVX2_VEC_H
#define DIFFLET_AVX2_VEC_H
#include <immintrin.h>
#include <stdint.h>

typedef __m256 vf;
#define VW 8

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 f32 -> 8 bf16 (round to nearest even, NaN kept quiet) in the low 128 bits */
static inline __m128i bf16x8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256 isnan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(nan), isnan));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

static inline void store_bf16x8(uint16_t *p, __m256 v) { _mm_storeu_si128((__m128i *)p, bf16x8(v)); }

#define V_SET1(x) _mm256_set1_ps(x)
#define V_ZERO() _mm256_setzero_ps()
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_STOREU(p, v) _mm256_storeu_ps(p, v)
#define V_ADD _mm256_add_ps
#define V_SUB _mm256_sub_ps
#define V_MUL _mm256_mul_ps
#define V_DIV _mm256_div_ps
#define V_MIN _mm256_min_ps
#define V_MAX _mm256_max_ps
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_FNMA(a, b, c) _mm256_fnmadd_ps(a, b, c) /* c - a*b */
#define V_RCP_EST(d) _mm256_rcp_ps(d)
#define V_RCP_BITS 12
#define V_HSUM(v) hsum8(v)
#define V_HMAX(v) hmax8(v)
#define V_ABS(v) _mm256_andnot_ps(_mm256_set1_ps(-0.f), v)
#define V_COPYSIGN(mag, sgn) _mm256_or_ps(mag, _mm256_and_ps(sgn, _mm256_set1_ps(-0.f)))
#define V_ROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_CVT_I(v) _mm256_cvtps_epi32(v)
#define V_POW2I(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23))
#define V_EXP_LO (-87.33654f)
/* p * 2^n by exponent arithmetic; inputs below V_EXP_LO give 0 */
#define V_SCALE2(x, p, n)                                                             \
    _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(V_EXP_LO), _CMP_GE_OQ),             \
                  _mm256_mul_ps(p, V_POW2I(V_CVT_I(n))))
#define V_LOAD_BF16(p)                                                                \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define V_STORE_BF16(p, v) store_bf16x8(p, v)
/* streaming (non-temporal) stores of one vector to an address aligned to its size */
#define V_STREAM_BF16(p, v) _mm_stream_si128((__m128i *)(p), bf16x8(v))
#define V_STREAM_F32(p, v) _mm256_stream_ps(p, v)
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_STORE_F16(p, v) _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT))
#define V_LOAD_DUP_HALF(p)                                                            \
    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)),                 \
                             _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0))
#define V_SWAP_PAIRS(v) _mm256_permute_ps(v, 0xB1)
#define V_ALT_SIGN() _mm256_set_ps(1, -1, 1, -1, 1, -1, 1, -1)

#endif
