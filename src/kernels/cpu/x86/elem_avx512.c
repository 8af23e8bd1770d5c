/* AVX-512 (F/BW/VL/DQ + BF16) vocabulary for elem_simd.inc: 16 f32 lanes. */
#include <immintrin.h>

#include "kernels/kernels_impl.h"

typedef __m512 vf;
#define VW 16
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_STOREU(p, v) _mm512_storeu_ps(p, v)
#define V_ADD _mm512_add_ps
#define V_SUB _mm512_sub_ps
#define V_MUL _mm512_mul_ps
#define V_DIV _mm512_div_ps
#define V_MIN _mm512_min_ps
#define V_MAX _mm512_max_ps
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_FNMA(a, b, c) _mm512_fnmadd_ps(a, b, c) /* c - a*b */
#define V_RCP_EST(d) _mm512_rcp14_ps(d)
#define V_RCP_BITS 14
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_HMAX(v) _mm512_reduce_max_ps(v)
#define V_ABS(v) _mm512_abs_ps(v)
#define V_COPYSIGN(mag, sgn)                                                          \
    _mm512_or_ps(mag, _mm512_and_ps(sgn, _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u))))
#define V_ROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* vscalefps handles subnormal results and underflow to 0: clamp low enough that
 * e^x for x = -inf comes out exactly 0 */
#define V_EXP_LO (-104.f)
#define V_SCALE2(x, p, n) _mm512_scalef_ps(p, n)
#define V_LOAD_BF16(p)                                                                \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                            \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_STORE_BF16(p, v) _mm256_storeu_si256((__m256i *)(p), (__m256i)_mm512_cvtneps_pbh(v))
#define V_STREAM_BF16(p, v) _mm256_stream_si256((__m256i *)(p), (__m256i)_mm512_cvtneps_pbh(v))
#define V_STREAM_F32(p, v) _mm512_stream_ps(p, v)
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_STORE_F16(p, v)                                                             \
    _mm256_storeu_si256((__m256i *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define V_LOAD_DUP_HALF(p)                                                            \
    _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), \
                          _mm512_castps256_ps512(_mm256_loadu_ps(p)))
#define V_SWAP_PAIRS(v) _mm512_permute_ps(v, 0xB1)
#define V_ALT_SIGN() _mm512_set_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1)

#define TABLE_NAME dl_kernels_avx512
#define TABLE_LABEL "avx512"
#include "elem_simd.inc"
