/* AVX2 + FMA + F16C element-wise kernels: elem_simd.inc over the 8-lane vocabulary. */
#include "kernels/kernels_impl.h"
#include "avx2_vec.h"

#define TABLE_NAME dl_kernels_avx2
#define TABLE_LABEL "avx2"
#include "elem_simd.inc"
