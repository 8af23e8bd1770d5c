/* difflet models: one architecture per file, parameters named as in the
 * diffusers / transformers checkpoints, config read from the component's
 * config.json and checked against every tensor before any compute.
 *
 * A model is built for a fixed sequence length and dtype (f32 or bf16 weights and
 * matmul inputs; residual stream and outputs in f32): weights are packed and all
 * activation buffers allocated at load, so running allocates nothing. */
#ifndef DIFFLET_MODELS_H
#define DIFFLET_MODELS_H

#include "difflet/io.h"
#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a model's load gets its weights (artifact.h): NULL means the component's
 * checkpoint in the model folder, converted and packed at load. */
typedef struct dl_wsrc dl_wsrc;

/* ---- CLIPTextModel (transformers) --------------------------------------------------
 * Token + position embeddings, pre-LN layers with causal self-attention and an MLP
 * (quick_gelu / gelu / gelu_new), final layer norm; pooled output at the EOS
 * position (first max id when config eos_token_id == 2, as transformers does for
 * older configs; else the first id equal to eos_token_id). Tensor names with or
 * without the `text_model.` prefix. */
typedef struct dl_clip_text dl_clip_text;
dl_status dl_clip_text_load(dl_clip_text **out, dl_model_dir *dir, const char *component, int64_t seq_len,
                            dl_dtype dt, dl_wsrc *src);
int64_t dl_clip_text_width(const dl_clip_text *m);
int dl_clip_text_layers(const dl_clip_text *m);
/* ids: [seq_len]. hidden: [seq_len, width] last_hidden_state; pooled: [width] (may be
 * NULL). all_hidden (may be NULL): [(layers + 1), seq_len, width], the embeddings
 * and each layer's output, as transformers' hidden_states. */
dl_status dl_clip_text_run(dl_clip_text *m, const int32_t *ids, float *hidden, float *pooled, float *all_hidden);
void dl_clip_text_free(dl_clip_text *m);

/* ---- T5EncoderModel / UMT5EncoderModel (transformers) ------------------------------
 * RMS layer norms, self-attention without scaling plus a relative position bias
 * (bidirectional buckets): the first layer's, shared by all (T5: v1.1 gated-gelu or
 * original relu), or each layer's own (UMT5, Wan 2.1's umt5-xxl); gated-GELU or ReLU
 * feed-forward, final norm. The config says which (model_type "umt5" or architectures
 * "UMT5EncoderModel"; otherwise T5); a checkpoint with per-layer biases under a T5
 * config, or without them under a UMT5 one, is refused. */
typedef struct dl_t5_encoder dl_t5_encoder;
dl_status dl_t5_encoder_load(dl_t5_encoder **out, dl_model_dir *dir, const char *component, int64_t seq_len,
                             dl_dtype dt, dl_wsrc *src);
int64_t dl_t5_encoder_width(const dl_t5_encoder *m);
int64_t dl_t5_encoder_head_dim(const dl_t5_encoder *m); /* d_kv */
int dl_t5_encoder_layers(const dl_t5_encoder *m);
int dl_t5_encoder_is_umt5(const dl_t5_encoder *m);
/* ids: [seq_len]; hidden: [seq_len, d_model]; all_hidden as for CLIP (the last entry
 * is after the final norm, as transformers reports it). Every position attended (no
 * attention mask: what FLUX passes). */
dl_status dl_t5_encoder_run(dl_t5_encoder *m, const int32_t *ids, float *hidden, float *all_hidden);
/* The same with transformers' attention_mask [1]*valid + [0]*(seq_len - valid)
 * (padding to max_length, as Wan calls its encoder): keys [valid, seq_len) get no
 * weight from any query; the padded rows are still computed and returned. valid in
 * 1..seq_len (seq_len: no mask, identical to dl_t5_encoder_run), else DL_ERR_INVALID. */
dl_status dl_t5_encoder_run_masked(dl_t5_encoder *m, const int32_t *ids, int64_t valid, float *hidden,
                                   float *all_hidden);
void dl_t5_encoder_free(dl_t5_encoder *m);

/* ---- DiT splits: parallel execution of one denoiser evaluation (Difflet §4; comm.h). TP: Megatron
 * splits over the tp group (attention heads, MLP columns; row-parallel output
 * projections all-reduced). SP: on the TP group, norms, modulation and residuals
 * run on a token shard (all-gather before column-parallel layers, reduce-scatter
 * after row-parallel ones). CP: image tokens partitioned over the cp group, text
 * replicated; joint attention by Ulysses (all-to-all sequence <-> heads), ring
 * (visual K/V rotate, partials merged by row max and sum of exponentials) or
 * gather (all-gather K/V). Shards may be uneven: no padding is ever attended. */
typedef enum { DL_CP_ULYSSES = 0, DL_CP_RING, DL_CP_GATHER } dl_cp_mode;
typedef struct dl_comm dl_comm;
typedef struct {
    int tp, cp, sp;           /* degrees (1: off); sp: 1 = sequence parallel on the TP group */
    dl_cp_mode cp_mode;
    int tp_rank, cp_rank;     /* this rank's place (what its weights and rows are) */
    dl_comm *tp_comm, *cp_comm; /* at run time; NULL when the degree is 1 (compiling needs none) */
} dl_dit_split;
const char *dl_cp_mode_name(dl_cp_mode m);
/* Why a split is infeasible for a model with `heads` heads (NULL when feasible). */
const char *dl_dit_split_check(const dl_dit_split *split, int64_t heads, char *buf, size_t n);

/* ---- AutoencoderKL decoder (diffusers) -----------------------------------------
 * post_quant_conv (when configured), conv_in, mid block (resnet, single-head
 * attention, resnet), up blocks (resnets, nearest 2x + conv), group norm, SiLU,
 * conv_out. Built for a fixed latent size. */
typedef struct dl_vae_decoder dl_vae_decoder;
dl_status dl_vae_decoder_load(dl_vae_decoder **out, dl_model_dir *dir, const char *component, int64_t lat_h,
                              int64_t lat_w, dl_dtype dt, dl_wsrc *src);
/* The same decoder inside another model's checkpoint (OpenSora's VAE holds it as
 * `spatial_vae.module.*`): architecture from the diffusers AutoencoderKL config `cfg`
 * (named `file` in messages) instead of <component>/config.json, every tensor name
 * under `prefix` ("" for none). dl_vae_decoder_load is this with the component's
 * config and no prefix. */
dl_status dl_vae_decoder_load_from(dl_vae_decoder **out, dl_model_dir *dir, const char *component,
                                   const struct cJSON *cfg, const char *file, const char *prefix, int64_t lat_h,
                                   int64_t lat_w, dl_dtype dt, dl_wsrc *src);
int64_t dl_vae_latent_channels(const dl_vae_decoder *m);
/* 2^(levels - 1): image pixels per latent pixel along each axis */
int dl_vae_scale(const dl_vae_decoder *m);
double dl_vae_scaling_factor(const dl_vae_decoder *m);
double dl_vae_shift_factor(const dl_vae_decoder *m);
/* latent: [C, h, w] as vae.decode takes it (already z / scaling + shift);
 * image: [3, h * scale, w * scale], roughly in [-1, 1]. */
dl_status dl_vae_decode(dl_vae_decoder *m, const float *latent, float *image);
void dl_vae_decoder_free(dl_vae_decoder *m);

/* ---- AutoencoderKL encoder (diffusers) -----------------------------------------
 * conv_in, down blocks (resnets, then zero pad right/bottom + stride-2 conv), mid
 * block (resnet, single-head attention, resnet), group norm, SiLU, conv_out,
 * quant_conv (when configured). Built for a fixed image size (multiples of the
 * VAE's scale). */
typedef struct dl_vae_encoder dl_vae_encoder;
dl_status dl_vae_encoder_load(dl_vae_encoder **out, dl_model_dir *dir, const char *component, int64_t height,
                              int64_t width, dl_dtype dt, dl_wsrc *src);
int64_t dl_vae_encoder_latent_channels(const dl_vae_encoder *m);
/* image: [3, H, W] in [-1, 1] as vae.encode takes it; latent: [C, H / scale,
 * W / scale], the posterior's mean (vae.encode(x).latent_dist.mean: difflet never
 * samples the posterior; diffusers' image-to-image pipelines draw one sample, which
 * differs from the mean by the posterior's std, small in a trained VAE). */
dl_status dl_vae_encode(dl_vae_encoder *m, const float *image, float *latent);
void dl_vae_encoder_free(dl_vae_encoder *m);

/* T5's bucket of a relative position (memory - query), as transformers computes it. */
int32_t dl_t5_bucket(int64_t rel, int bidirectional, int num_buckets, int max_distance);

/* ---- int8 activation calibration (src/models/int8_calib.c; docs/int8.md) -------------
 * begin: from now on every linear made is observed (each run's input rows quantized as
 * W8A8 would quantize them, the error summed per layer); write: int8_calibration.json
 * at path, about_json's fields (the run's description) plus threshold, levels and per
 * component and layer act_error, worst_token, tokens and scheme ("int8-wo" above the
 * threshold, else "int8"); *layers written, *wo of them weight-only. end: off, and
 * forgets every layer (free the models made while on first). */
void dl_int8_calib_begin(void);
dl_status dl_int8_calib_write(const char *path, double threshold, const char *about_json, int *layers, int *wo);
void dl_int8_calib_end(void);

#ifdef __cplusplus
}
#endif
#endif
