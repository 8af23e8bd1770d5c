/* Wan 2.1 (diffusers' WanPipeline): the WanTransformer3DModel denoiser and the
 * text-to-video pipeline around it (UMT5 text encoder, UniPC schedule, the causal
 * 3-D VAE of wan_vae.h). */
#ifndef DIFFLET_WAN_H
#define DIFFLET_WAN_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- WanTransformer3DModel (diffusers) -------------------------------------------
 * Built for a fixed latent grid (frames x height x width, before patching) and text
 * length; `split` NULL for one rank (CP over video tokens; TP is refused: the Q/K
 * RMSNorm spans every head of a row). The image-conditioning branch (I2V:
 * image_dim / added_kv_proj_dim) is refused by name. */
typedef struct dl_wan dl_wan;
dl_status dl_wan_load(dl_wan **out, dl_model_dir *dir, const char *component, int64_t lat_frames, int64_t lat_h,
                      int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split);
int64_t dl_wan_in_channels(const dl_wan *m);
int64_t dl_wan_out_channels(const dl_wan *m);
int64_t dl_wan_heads(const dl_wan *m);
int64_t dl_wan_text_dim(const dl_wan *m);
/* patch_size (t, h, w) */
void dl_wan_patch(const dl_wan *m, int64_t patch[3]);
/* latents: [C_in, F, H, W]; txt: [txt_len, text_dim] (prompt_embeds: rows past the
 * prompt are zeros, attended as the reference attends them); timestep as the
 * scheduler gives it (0..1000); out: [C_out, F, H, W] on every rank. */
dl_status dl_wan_run(dl_wan *m, const float *latents, const float *txt, float timestep, float *out);
void dl_wan_free(dl_wan *m);
/* Batched CFG: the same model built for `batch` (1 or 2) branches per call, every
 * linear over both branches' rows at once, attention per branch. A batch-2 model runs
 * a one-branch call as two identical branches (no saving). */
dl_status dl_wan_load_batch(dl_wan **out, dl_model_dir *dir, const char *component, int64_t lat_frames, int64_t lat_h,
                            int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split, int batch);
int dl_wan_batch(const dl_wan *m);
/* both CFG branches of one step (batch 2): the same latents and timestep, prompt
 * embeds txt0 / txt1, outputs out0 / out1 */
dl_status dl_wan_run2(dl_wan *m, const float *latents, const float *txt0, const float *txt1, float timestep, float *out0,
                      float *out1);

/* Wall seconds of dl_wan_run's parts, for benchmarks: added to (never cleared) by
 * every run while attached with dl_wan_set_phase_times (NULL detaches; detached, the
 * default, no clock is read). Each layer's three sublayers are timed from their first
 * norm to their residual add. */
typedef struct {
    double self_attn_s;  /* the self-attention kernel alone: softmax(q k^T) v over the video tokens */
    double self_s;       /* the self-attention sublayer: LN, QKV, Q/K norm + RoPE, attention, to_out, gate */
    double cross_s;      /* the cross-attention sublayer (its text K/V projection included) */
    double ffn_s;        /* the feed-forward sublayer */
    double total_s;      /* the whole dl_wan_run (embedders and proj_out included) */
    int64_t runs;
} dl_wan_phase_times;
void dl_wan_set_phase_times(dl_wan *m, dl_wan_phase_times *t);

/* The step-caching probe (Difflet §5), a separate program of the transformer's
 * weights (its patch embedding, time conditioning and first block's modulation
 * table): the first block's modulated input LN(x)(1 + scale1) + shift1 of this rank's
 * video tokens, and its relative L1 change since the same CFG slot's previous probe
 * (0 on a slot's first probe), summed over the cp group. Built for the transformer's
 * latent grid and split. */
typedef struct dl_wan_probe dl_wan_probe;
dl_status dl_wan_probe_load(dl_wan_probe **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                            int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split);
dl_status dl_wan_probe_run(dl_wan_probe *p, int slot, const float *latents, float timestep, double *score);
void dl_wan_probe_reset(dl_wan_probe *p);
void dl_wan_probe_free(dl_wan_probe *p);

#ifdef __cplusplus
}
#endif
#endif
