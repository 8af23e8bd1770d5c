/* difflet CPU kernels.
 *
 * Element-wise and row ops work on f32, bf16 or f16 activations (`dl_dtype`), always
 * computing in f32. Small parameter vectors (norm weights, biases, modulation scale /
 * shift / gate, RoPE tables) are f32: they are converted once at compile time.
 *
 * Every op (suffix _t) takes (ith, nth) and does thread ith's share of the rows;
 * run it on the pool from inside a dl_parallel task. Each op has a plain C reference (forced with DIFFLET_KERNELS=ref) and AVX-512 and
 * AVX2 paths chosen at run time. In-place use (y == x) is allowed where noted. */
#ifndef DIFFLET_KERNELS_H
#define DIFFLET_KERNELS_H

#include "difflet/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DL_F32 = 0, DL_BF16 = 1, DL_F16 = 2 } dl_dtype;

size_t dl_dtype_size(dl_dtype dt);
const char *dl_dtype_name(dl_dtype dt);

/* Scalar conversions (round to nearest even; NaN stays NaN). */
uint16_t dl_f32_to_bf16(float f);
float dl_bf16_to_f32(uint16_t h);
uint16_t dl_f32_to_f16(float f);
float dl_f16_to_f32(uint16_t h);

/* ---- element-wise and row ops (all: rows x cols row-major, contiguous) -------- */

/* dst[i] = src[i] converted; n elements. */
void dl_convert_t(dl_dtype dst_dt, void *dst, dl_dtype src_dt, const void *src, int64_t n,
                  int ith, int nth);
/* y = LayerNorm(x) over cols; w, b may be NULL (no affine). y may alias x. */
void dl_layernorm_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                    const float *w, const float *b, float eps, int ith, int nth);
/* y = x / sqrt(mean(x^2) + eps) * w; w may be NULL. y may alias x. */
void dl_rmsnorm_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                  const float *w, float eps, int ith, int nth);
/* The general forms with separate dtypes for x and y (e.g. an f32 residual stream
 * normalised into bf16 matmul input): LayerNorm with optional affine (w, b) and
 * optional modulation (scale, shift); RMSNorm with optional weight. y must not
 * alias x when the dtypes differ. */
void dl_layernorm_x_t(dl_dtype ydt, void *y, dl_dtype xdt, const void *x, int64_t rows, int64_t cols,
                      const float *w, const float *b, const float *scale, const float *shift, float eps, int ith,
                      int nth);
void dl_rmsnorm_x_t(dl_dtype ydt, void *y, dl_dtype xdt, const void *x, int64_t rows, int64_t cols, const float *w,
                    float eps, int ith, int nth);
/* Per-head RMSNorm in place (FLUX's QK norm): x holds ntok tokens `tok_stride`
 * elements apart, each with `heads` contiguous vectors of head_dim; w: [head_dim].
 * Thread split over tokens. */
void dl_rmsnorm_heads_t(dl_dtype dt, void *x, int64_t ntok, int64_t tok_stride, int64_t heads, int64_t head_dim,
                        const float *w, float eps, int ith, int nth);
/* adaLN: y = x * (1 + scale) + shift, scale/shift: [cols]. y may alias x. */
void dl_modulate_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                   const float *scale, const float *shift, int ith, int nth);
/* Fused LayerNorm (no affine) then modulation, as in adaLN-zero blocks. */
void dl_layernorm_modulate_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols,
                             const float *scale, const float *shift, float eps, int ith, int nth);
/* Gated residual: x += gate * y, gate: [cols] (NULL means 1). */
void dl_gated_residual_t(dl_dtype dt, void *x, const void *y, int64_t rows, int64_t cols,
                         const float *gate, int ith, int nth);

/* quick_gelu (CLIP) is x * sigmoid(1.702 x) */
typedef enum { DL_ACT_NONE = 0, DL_ACT_GELU_TANH, DL_ACT_GELU_ERF, DL_ACT_SILU, DL_ACT_QUICK_GELU, DL_ACT_RELU } dl_act;
const char *dl_act_name(dl_act a);
/* y = act(x) on n elements. y may alias x. */
void dl_activation_t(dl_act act, dl_dtype dt, void *y, const void *x, int64_t n, int ith, int nth);
/* y = a * b element-wise on n elements (gated feed-forwards). y may alias a or b. */
void dl_mul_t(dl_dtype dt, void *y, const void *a, const void *b, int64_t n, int ith, int nth);
/* Row softmax, y may alias x. */
void dl_softmax_t(dl_dtype dt, void *y, const void *x, int64_t rows, int64_t cols, int ith,
                  int nth);

/* Group norm over x: [C, S] (channels-first, S = spatial size), `groups` dividing C,
 * w/b: [C] (may be NULL), optionally followed by SiLU (VAE resnets). y may alias x. */
void dl_groupnorm_t(dl_dtype dt, void *y, const void *x, int64_t C, int64_t S, int64_t groups,
                    const float *w, const float *b, float eps, int fuse_silu, int ith, int nth);
/* Nearest 2x upsample: x: [C, H, W] -> y: [C, 2H, 2W]. */
void dl_upsample2x_t(dl_dtype dt, void *y, const void *x, int64_t C, int64_t H, int64_t W,
                     int ith, int nth);

/* ---- rotary embeddings --------------------------------------------------------- */

typedef enum {
    DL_ROPE_PAIRS = 0, /* adjacent pairs (2i, 2i+1) rotate: FLUX, HunyuanVideo, and Wan's
                          complex multiplication (view_as_complex over adjacent pairs) */
    DL_ROPE_HALVES,    /* (i, i + D/2) rotate: rotate_half / NeoX form */
} dl_rope_form;

/* In place over x: [seq, heads, head_dim] with `stride` elements between tokens
 * (so Q/K can sit inside a fused QKV buffer). cos/sin: [seq, head_dim/2]. */
void dl_rope_t(dl_rope_form form, dl_dtype dt, void *x, int64_t seq, int64_t heads,
               int64_t head_dim, int64_t stride, const float *cos_t, const float *sin_t, int ith,
               int nth);
/* FLUX tables: ids: [seq, n_axes] positions, axes_dim[a] (even, sum = head_dim),
 * theta (10000). Frequencies per axis as diffusers' get_1d_rotary_pos_embed, in f64. */
void dl_rope_table_axes(const float *ids, int64_t seq, int n_axes, const int *axes_dim,
                        double theta, float *cos_t, float *sin_t);
/* The same with f32 frequencies and angles (get_1d_rotary_pos_embed's default
 * freqs_dtype, as HunyuanVideo's RoPE calls it). */
void dl_rope_table_axes_f32(const float *ids, int64_t seq, int n_axes, const int *axes_dim, double theta,
                            float *cos_t, float *sin_t);
/* Wan 2.1 tables for a (frames, height, width) token grid: head_dim split as
 * [d - 4*(d/6), 2*(d/6), 2*(d/6)] over (f, h, w). */
void dl_rope_table_wan(int64_t frames, int64_t height, int64_t width, int64_t head_dim,
                       double theta, float *cos_t, float *sin_t);

/* ---- fused attention ------------------------------------------------------------ */

/* Flash-style attention, never materialising the score matrix.
 * q: [Sq, H, D] with q_stride elements between tokens; k, v: [Sk, H, D] with their
 * strides; dtype `dt` (f32 or bf16) for q, k, v and out.
 * Only keys in [kv_begin, kv_end) are read: keys outside contribute exactly nothing,
 * whatever they hold. Output out: [Sq, H, D] (stride out_stride), normalised.
 * Partial mode (for merging results over disjoint key sets, Difflet §4.3): when
 * `o_part` is set, the unnormalised output (f32, [Sq, H, D] contiguous) and per-row
 * max `m` and sum of exponentials `l` (f32, [H, Sq]) are written instead of `out`. */
typedef struct {
    dl_dtype dt;
    int64_t sq, sk, heads, head_dim;
    const void *q, *k, *v;
    int64_t q_stride, k_stride, v_stride; /* elements between tokens (0: heads*head_dim) */
    void *out;
    int64_t out_stride;
    int64_t kv_begin, kv_end; /* valid keys [kv_begin, kv_end) */
    float scale;              /* softmax scale, e.g. 1/sqrt(head_dim) */
    float *o_part, *m, *l;    /* partial outputs; all three or none */
    int causal;               /* query i sees keys j <= i only (CLIP's text encoder) */
    /* Optional additive bias that depends on j - i only (T5's relative position
     * bias): score(h, i, j) += bias_rel[h * (sq + sk - 1) + (j - i + sq - 1)]. */
    const float *bias_rel;
} dl_attn_args;

/* Bytes of scratch the attention needs for `nth` threads (packed K/V tiles). */
size_t dl_attn_scratch_bytes(const dl_attn_args *a, int nth);
/* The kernel that runs `a` on this path: "avx512-bf16", "avx2" or "reference". */
const char *dl_attn_path_name(const dl_attn_args *a);
/* Checks the arguments (shapes, strides, interval); DL_ERR_INVALID with a message. */
dl_status dl_attn_check(const dl_attn_args *a);
/* Thread ith's share. `scratch` is dl_attn_scratch_bytes(a, nth) bytes, 64-aligned. */
void dl_attn_t(const dl_attn_args *a, void *scratch, int ith, int nth);
/* Whole op on the pool; allocates scratch if `scratch` is NULL (not for hot loops). */
dl_status dl_attn(const dl_attn_args *a, void *scratch);

/* Merge n partial results over disjoint key sets into the exact joint softmax:
 * parts[i] = {o_part, m, l} as written by dl_attn in partial mode, all [Sq, H, D] /
 * [H, Sq]. Writes normalised `out` (dtype dt, [Sq, H, D], stride out_stride), or, if
 * `o_merged` is set, the merged partial triple (for merging in several rounds). */
typedef struct {
    const float *o, *m, *l;
} dl_attn_partial;
void dl_attn_merge_t(const dl_attn_partial *parts, int n, int64_t sq, int64_t heads,
                     int64_t head_dim, dl_dtype dt, void *out, int64_t out_stride,
                     float *o_merged, float *m_merged, float *l_merged, int ith, int nth);

/* ---- oneDNN matmul and convolution --------------------------------------------- */

/* y[M, N] = act(x[M, K] * W^T + bias). W is given as [N, K] row-major (PyTorch
 * nn.Linear layout) and reordered once into the layout oneDNN picks. Compute dtype
 * f32 or bf16 (x and W in it; accumulation in f32); y in `dst_dt`. */
/* Quantized weights of a linear (int8.c). Both store W as int8 with one symmetric
 * scale per output channel (w[n, k] ~ q[n, k] * s[n], q in [-127, 127]):
 *  - DL_QUANT_W8A8: each run quantizes x per token (row), asymmetric u8 with the
 *    row's own scale and zero point, multiplies u8 x s8 -> s32 through oneDNN, and
 *    rescales (exact integer products; CPUs without VNNI use 7-bit activations,
 *    whose products cannot saturate their 16-bit intermediate sums);
 *  - DL_QUANT_W8: weight-only; each run dequantizes W a panel of output channels
 *    at a time and multiplies in f32 (x as given, f32 accumulation).
 * Bias and activation are applied in f32 after the rescale; y in dst_dt. */
typedef enum { DL_QUANT_NONE = 0, DL_QUANT_W8A8, DL_QUANT_W8 } dl_quant;
/* The longest K an int8 linear takes: its s32 sums and zero-point correction stay
 * exact in int32 while 2 x 255 x 127 x K < 2^31. */
#define DL_Q8_MAX_K 33000
const char *dl_quant_name(dl_quant q); /* "none", "w8a8", "w8" */
/* A whole component's scheme, as --dtype and program keys name it: "int8" (W8A8 per
 * layer, weight-only or none where measured better) or "int8-wo" (weight-only). */
const char *dl_quant_scheme_name(dl_quant q);
/* ||W - dequant(quant(W))|| / ||W|| of the per-channel int8 weights of w [n, k]. */
double dl_q8_weight_error(const float *w, int64_t n, int64_t k);
/* The activation levels W8A8 uses on this CPU: 255, or 127 where oneDNN's u8 x s8
 * product saturates (measured once per process). */
int dl_q8_levels(void);
/* int8 linears created by this process so far (tests: a program really quantized). */
int dl_q8_count(void);
/* A --dtype / deployment dtype: "f32", "bf16", "int8" (bf16 activations, W8A8
 * linears) or "int8-wo" (bf16 activations, weight-only int8). 1 when known. */
#define DL_DTYPE_NAMES "f32, bf16, int8 or int8-wo"
int dl_dtype_parse(const char *s, dl_dtype *dt, dl_quant *quant);
/* The dtype a command or deployment uses when none is given: bf16 where the CPU
 * multiplies bf16 natively (AVX-512 BF16, AMX), else f32 (bf16 would be emulated). */
dl_dtype dl_dtype_default(void);

typedef struct {
    int64_t m, k, n;
    dl_dtype dt;     /* x and weights */
    dl_dtype dst_dt; /* y */
    dl_act act;      /* fused post-op */
    int64_t ldx, ldy; /* leading dimensions of x and y (0: k and n) */
    dl_quant quant;  /* int8 weights (then `dt` is x's dtype only) */
} dl_matmul_desc;

typedef struct dl_matmul dl_matmul;
/* Weights already packed (a program artifact): the bytes and the record of their
 * oneDNN layout (an opaque serialized memory descriptor). */
typedef struct {
    const void *data;
    size_t bytes;
    const void *layout;
    size_t layout_bytes;
    const float *aux; /* int8 weights: the channel scales [N] then the column sums of q [N] */
    size_t aux_bytes;
} dl_packed;
/* w: [N, K] in w_dt (any dtype; converted), bias: [N] f32 or NULL. */
dl_status dl_matmul_new(dl_matmul **out, const dl_matmul_desc *d, const void *w, dl_dtype w_dt,
                        const float *bias);
/* The same from weights already packed: used in place (e.g. a read-only mapping,
 * which must then outlive mm) when this process's primitive takes their recorded
 * layout, whatever thread count or ISA variant packed them; otherwise reordered
 * once into the layout this process wants. A record that does not describe
 * `bytes` of this shape is refused. */
dl_status dl_matmul_new_packed(dl_matmul **out, const dl_matmul_desc *d, const dl_packed *pk, const float *bias);
/* The packed weights and their layout record (for writing them into an artifact;
 * owned by mm). */
void dl_matmul_packed(const dl_matmul *mm, dl_packed *out);
/* Runs on the OpenMP pool. Allocates nothing itself (OpenBLAS sizes its packing
 * buffers once per thread, at its first product). */
dl_status dl_matmul_run(dl_matmul *mm, const void *x, void *y);
/* The library mm's products run in: "OpenBLAS" (f32 sgemm over oneDNN's plain
 * weights, M >= 32; DIFFLET_GEMM=onednn turns it off), "oneDNN", "oneDNN int8" (W8A8)
 * or "OpenBLAS (int8 weights)" / "oneDNN (int8 weights)" (weight-only int8). */
const char *dl_gemm_name(const dl_matmul *mm);
/* "OpenBLAS 0.3.21 (Zen, OpenMP)": the version, the kernel set it picked for this
 * CPU and its threading. */
const char *dl_openblas_version(void);
void dl_matmul_free(dl_matmul *mm);
/* Bytes held by the packed weights (for planning and reports). */
size_t dl_matmul_weight_bytes(const dl_matmul *mm);

/* 2-D or 3-D convolution, batch 1, channels-first activations ([C, H, W] or
 * [C, D, H, W]), weights [Cout, Cin, (kd,) kh, kw] as in PyTorch, bias [Cout] f32. */
typedef struct {
    int ndim;                     /* 2 or 3 */
    int64_t cin, cout;
    int64_t in[3];                /* (H, W) or (D, H, W) */
    int64_t kernel[3], stride[3], pad[3];
    dl_dtype dt;
} dl_conv_desc;

typedef struct dl_conv dl_conv;
dl_status dl_conv_new(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt,
                      const float *bias);
/* Output spatial size along axis i (of ndim). */
int64_t dl_conv_out_dim(const dl_conv_desc *d, int i);
dl_status dl_conv_new_packed(dl_conv **out, const dl_conv_desc *d, const dl_packed *pk, const float *bias);
void dl_conv_packed(const dl_conv *c, dl_packed *out);
dl_status dl_conv_run(dl_conv *c, const void *x, void *y);
void dl_conv_free(dl_conv *c);
/* Transposed convolution (PyTorch ConvTranspose2d / 3d, output_padding 0, no
 * dilation or groups) with the same desc: weights [cin, cout, (kd,) kh, kw] as
 * PyTorch stores them; output size along axis i (in - 1) stride - 2 pad + kernel.
 * Runs and frees as a dl_conv (dl_conv_run, dl_conv_free); not packable. */
dl_status dl_deconv_new(dl_conv **out, const dl_conv_desc *d, const void *w, dl_dtype w_dt, const float *bias);
int64_t dl_deconv_out_dim(const dl_conv_desc *d, int i);

/* oneDNN version string ("2.6.3"), part of program keys. */
const char *dl_onednn_version(void);
/* The ISA oneDNN's primitives run on in this process ("avx512-amx", "avx512-bf16",
 * "avx512", "avx2", "sse41"): the CPU's best, lowered by ONEDNN_MAX_CPU_ISA. */
const char *dl_onednn_isa(void);

#ifdef __cplusplus
}
#endif
#endif
