/* AutoencoderKLWan decoder (diffusers; the Wan 2.1 video VAE), src/models/wan_vae.c.
 *
 * A causal 3-D decoder run as diffusers runs it: one latent frame at a time, each
 * causal convolution continuing from the last two input frames of the previous chunk
 * (its feature cache). Built for a fixed latent size and dtype (f32 or bf16 weights
 * and convolution inputs; norms, residual sums and the output in f32); every
 * convolution primitive, cache and activation buffer is made at load, so decoding
 * allocates nothing, and memory is bounded by one chunk plus the caches, whatever
 * the number of frames. Refused by name: `is_residual: true` (the Wan 2.2 VAE),
 * `patch_size` other than null, `out_channels` other than 3. */
#ifndef DIFFLET_WAN_VAE_H
#define DIFFLET_WAN_VAE_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_wan_vae dl_wan_vae;

/* Reads <component>/config.json and the decoder's weights (or `src`, a program's
 * weight source; NULL: the component's checkpoint), checks every tensor's shape,
 * and builds the decoder for a latent of lat_frames x lat_h x lat_w. */
dl_status dl_wan_vae_load(dl_wan_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                          int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src);
/* Latent channels (config z_dim). */
int64_t dl_wan_vae_z_dim(const dl_wan_vae *m);
/* Video pixels per latent pixel along each axis: 2^(len(dim_mult) - 1). */
int dl_wan_vae_scale_spatial(const dl_wan_vae *m);
/* 2^(number of temporal upsamplings): video frames per latent frame after the first. */
int dl_wan_vae_scale_temporal(const dl_wan_vae *m);
/* Output frames: 1 + (lat_frames - 1) * scale_temporal. */
int64_t dl_wan_vae_frames(const dl_wan_vae *m);
/* [z_dim] each, from the config (latents_mean, latents_std): the pipeline
 * un-normalises its latents as z * std + mean before decoding. */
const float *dl_wan_vae_latents_mean(const dl_wan_vae *m);
const float *dl_wan_vae_latents_std(const dl_wan_vae *m);
/* Bytes held for decoding, fixed at load: activations of one chunk plus the
 * feature caches (weights not counted). */
size_t dl_wan_vae_activation_bytes(const dl_wan_vae *m);

/* z: [z_dim, lat_frames, lat_h, lat_w], already un-normalised (as the pipeline hands
 * it to vae.decode); video: [3, frames, lat_h * scale, lat_w * scale], clamped to
 * [-1, 1] (unless the config sets clip_output false). Decodes chunk by chunk from
 * cleared caches, so decoding the same z twice gives the same bytes; on_chunk (may
 * be NULL) is called with ctx after each latent frame (done of total). One decode at
 * a time per model. A non-finite latent is DL_ERR_INVALID. */
dl_status dl_wan_vae_decode(dl_wan_vae *m, const float *z, float *video,
                            void (*on_chunk)(void *ctx, int done, int total), void *ctx);
void dl_wan_vae_free(dl_wan_vae *m);

#ifdef __cplusplus
}
#endif
#endif
