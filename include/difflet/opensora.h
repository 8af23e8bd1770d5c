/* OpenSora 1.2 (hpcaitech/Open-Sora v1.2.0): the STDiT3 denoiser (src/models/stdit3.c)
 * and the OpenSoraVAE v1.2 decoder (src/models/opensora_vae.c). The pipeline around
 * them (T5 v1.1 text, rectified flow with its timestep transform, CFG with the null
 * caption) is src/pipeline/opensora_pipeline.c. Checkpoints are read as published:
 * transformer/ holds STDiT3's config.json + model.safetensors, vae/ holds
 * VideoAutoencoderPipeline's config.json + model.safetensors (docs/opensora.md). */
#ifndef DIFFLET_OPENSORA_H
#define DIFFLET_OPENSORA_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- STDiT3 ------------------------------------------------------------------------
 * Built for a fixed latent grid (frames x height x width as the VAE gives it, before
 * patching; padded to the patch size and cropped back as the reference does), a
 * caption length txt_len (rows of y the caller passes; at most model_max_length) and
 * batch 1 or 2 (batched CFG: both branches in every linear). `split` NULL for one
 * rank; TP splits heads and MLP columns; CP is OpenSora's dynamic sequence parallelism:
 * spatial blocks hold a shard of the frames, temporal blocks a shard of the spatial
 * positions, an all-to-all of the residual stream between them. */
typedef struct dl_stdit3 dl_stdit3;
dl_status dl_stdit3_load(dl_stdit3 **out, dl_model_dir *dir, const char *component, int64_t lat_frames, int64_t lat_h,
                         int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split, int batch);
int64_t dl_stdit3_in_channels(const dl_stdit3 *m);
int64_t dl_stdit3_out_channels(const dl_stdit3 *m);     /* 2 in_channels when pred_sigma */
int64_t dl_stdit3_caption_channels(const dl_stdit3 *m); /* the T5 width */
int64_t dl_stdit3_max_length(const dl_stdit3 *m);       /* model_max_length */
int64_t dl_stdit3_heads(const dl_stdit3 *m);
int dl_stdit3_batch(const dl_stdit3 *m);
/* The conditioning one call gets: the caption y [txt_len, caption_channels] of which
 * rows [0, valid) are the prompt's tokens (the reference keeps only those:
 * masked_select by the prompt's mask), the timestep as the sampler passes it (0..1000),
 * fps, and the video's pixel height and width (the position embedding's scale). */
typedef struct {
    const float *y;
    int64_t valid;
    float timestep, fps, height, width;
} dl_stdit3_cond;
/* latents [Cin, F, H, W]; out [Cout, F, H, W] on every rank (the sampler uses the
 * first Cin channels). A batch-2 model runs a one-branch call as two identical ones. */
dl_status dl_stdit3_run(dl_stdit3 *m, const float *latents, const dl_stdit3_cond *c, float *out);
/* both CFG branches (batch 2): the same latents, timestep, fps and size; y per branch */
dl_status dl_stdit3_run2(dl_stdit3 *m, const float *latents, const dl_stdit3_cond *c0, const dl_stdit3_cond *c1,
                         float *out0, float *out1);
void dl_stdit3_free(dl_stdit3 *m);
/* y_embedder.y_embedding [model_max_length, caption_channels] f32: the null caption
 * of CFG (RFLOW's text_encoder.null), read at load on every rank */
const float *dl_stdit3_null_caption(const dl_stdit3 *m);
/* Parity tests: fn(ctx, name, data, dt, rows, cols) is called during each run with the
 * intermediates the reference names: "t_emb", "fps_emb", "t" [1, D] and "t_mlp"
 * [1, 6D] f32; "y_tokens" [valid, D] (branch 0's caption tokens, dt); "pos_emb"
 * [S, D], "patch_embed", "x_embed", "spatial_<i>", "temporal_<i>" [rows, D] and
 * "final" [rows, pt ph pw Cout] f32, where rows are every branch's tokens in token
 * order (branch 1's after branch 0's). Not called on a cp-split model (its rows are
 * shards). fn NULL detaches. */
typedef void (*dl_stdit3_tap)(void *ctx, const char *name, const void *data, dl_dtype dt, int64_t rows, int64_t cols);
void dl_stdit3_set_tap(dl_stdit3 *m, dl_stdit3_tap fn, void *ctx);

/* The step-caching probe (Difflet §5), a separate program of the transformer's
 * weights (patch and position embedding, t_embedder, fps_embedder, t_block and the
 * first spatial block's scale_shift_table): that block's modulated input
 * LN(x)(1 + scale_msa) + shift_msa of this rank's tokens and its relative L1 change
 * since the same slot's previous probe (0 on a slot's first), summed over the cp group. */
typedef struct dl_stdit3_probe dl_stdit3_probe;
dl_status dl_stdit3_probe_load(dl_stdit3_probe **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                               int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split);
dl_status dl_stdit3_probe_run(dl_stdit3_probe *p, int slot, const float *latents, const dl_stdit3_cond *c,
                              double *score);
void dl_stdit3_probe_reset(dl_stdit3_probe *p);
void dl_stdit3_probe_free(dl_stdit3_probe *p);

/* ---- OpenSoraVAE v1.2 decoder --------------------------------------------------------
 * VideoAutoencoderPipeline.decode: z * scale + shift per channel, the temporal VAE
 * (MAGVIT-style causal 3-D convolutions over time) on independent chunks of
 * micro_frame_size frames' latents, then the spatial AutoencoderKL (SDXL's, /0.18215)
 * per frame. Built for `frames` output frames at height x width pixels, multiples of
 * the spatial VAE's scale (8; the reference decodes 8 floor(W / 8), so the pipeline
 * passes 424 for the default 426); memory is bounded by one chunk (the temporal
 * decoder's buffers for micro_frame_size frames and the spatial VAE's for one frame),
 * whatever the number of frames. The spatial VAE's architecture is
 * vae/spatial_config.json (a diffusers AutoencoderKL config) when present, else the
 * SDXL VAE when vae_2d.from_pretrained is PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers
 * (the published config); the temporal VAE's is the config's vae_temporal
 * (VAE_Temporal_SD, or VAE_Temporal with every argument). Weights: vae/model.safetensors,
 * `temporal_vae.*`, `spatial_vae.module.*`, `scale`, `shift` (the config's when absent).
 * f32 or bf16 (convolution inputs; norms, residual sums and outputs in f32). Refused by
 * name: micro_frame_size null, vae_2d types other than VideoAutoencoderKL, other
 * vae_temporal types or arguments, a from_pretrained without its config. */
typedef struct dl_opensora_vae dl_opensora_vae;
dl_status dl_opensora_vae_load(dl_opensora_vae **out, dl_model_dir *dir, const char *component, int64_t frames,
                               int64_t height, int64_t width, dl_dtype dt, dl_wsrc *src);
/* the latent [C, lat[0], lat[1], lat[2]] the VAE decodes into those frames (get_latent_size:
 * lat[0] = (frames / 17) 5 + ceil((frames % 17) / 4) for micro_frame_size 17) */
void dl_opensora_vae_latent_size(const dl_opensora_vae *m, int64_t lat[3]);
int64_t dl_opensora_vae_channels(const dl_opensora_vae *m);
/* temporal chunks one decode runs (the progress total): ceil(frames / micro_frame_size) */
int dl_opensora_vae_chunks(const dl_opensora_vae *m);
/* activation bytes held for decoding, fixed at load (weights not counted) */
size_t dl_opensora_vae_activation_bytes(const dl_opensora_vae *m);
/* z: the sampler's latent (normalised); video: [3, frames, height, width] as decode
 * returns it (not clamped). on_chunk (may be NULL) is called with ctx after each
 * temporal chunk's frames are decoded (done of total). Decoding the same z twice gives
 * the same bytes; a non-finite latent is DL_ERR_INVALID. */
dl_status dl_opensora_vae_decode(dl_opensora_vae *m, const float *z, float *video,
                                 void (*on_chunk)(void *ctx, int done, int total), void *ctx);
/* The temporal VAE's output alone (parity): x_z [in_out_channels, frames, height / 8,
 * width / 8], what the spatial VAE's decode receives before its / 0.18215. */
dl_status dl_opensora_vae_decode_temporal(dl_opensora_vae *m, const float *z, float *xz);
void dl_opensora_vae_free(dl_opensora_vae *m);

#ifdef __cplusplus
}
#endif
#endif
