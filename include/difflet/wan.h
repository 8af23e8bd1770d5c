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

#ifdef __cplusplus
}
#endif
#endif
