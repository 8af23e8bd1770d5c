/* Dtypes: sizes, names, and the scalar conversions every kernel path shares (round
 * to nearest even; NaN stays NaN). */
#include <string.h>

#include "kernels/kernels_impl.h"

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t dl_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float dl_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dl_f32_to_f16(float f) {
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow (after rounding) -> inf */
    if (a < 0x38800000u) {                                   /* result is subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;          /* below half the smallest subnormal */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* value / 2^-24 = m * 2^(e - 126) */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    /* normal: rebias exponent, round mantissa from 23 to 10 bits, nearest even */
    uint32_t r = a - 0x38000000u; /* exponent -112 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float dl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return u2f(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return u2f(sign);
        float v = (float)m * 0x1p-24f; /* subnormal: exact */
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

size_t dl_dtype_size(dl_dtype dt) { return dt == DL_F32 ? 4 : 2; }

const char *dl_dtype_name(dl_dtype dt) {
    switch (dt) {
    case DL_F32: return "f32";
    case DL_BF16: return "bf16";
    case DL_F16: return "f16";
    }
    return "?";
}

const char *dl_act_name(dl_act a) {
    switch (a) {
    case DL_ACT_NONE: return "none";
    case DL_ACT_GELU_TANH: return "gelu_tanh";
    case DL_ACT_GELU_ERF: return "gelu_erf";
    case DL_ACT_SILU: return "silu";
    case DL_ACT_QUICK_GELU: return "quick_gelu";
    case DL_ACT_RELU: return "relu";
    }
    return "?";
}


dl_dtype dl_dtype_default(void) { return dl_cpu()->avx512_bf16 ? DL_BF16 : DL_F32; }

int dl_dtype_parse(const char *s, dl_dtype *dt, dl_quant *quant) {
    /* int8: the linears of the transformer and text encoders in int8, every
     * activation in bf16 (the dtype of the layers that stay unquantized) */
    static const struct {
        const char *name;
        dl_dtype dt;
        dl_quant q;
    } k[] = {{"f32", DL_F32, DL_QUANT_NONE}, {"bf16", DL_BF16, DL_QUANT_NONE}, {"int8", DL_BF16, DL_QUANT_W8A8},
             {"int8-wo", DL_BF16, DL_QUANT_W8}};
    for (size_t i = 0; s && i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(s, k[i].name)) {
            *dt = k[i].dt;
            if (quant) *quant = k[i].q;
            return 1;
        }
    return 0;
}
