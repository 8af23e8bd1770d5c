/* AutoencoderKLLTX2Video decoder (diffusers; the LTX-2 video VAE), src/models/ltx2_vae.c.
 *
 * Decodes as diffusers' vae.decode(z, temb) does with its default settings: tiling
 * and framewise decoding are off by default, so the whole clip is one decoder pass.
 * Built for a fixed latent size and dtype (f32 or bf16 weights and convolution
 * inputs; norms, modulation, residual sums and the output in f32); every
 * convolution and activation buffer is made at load, so decoding allocates
 * nothing. Activations grow linearly with the number of frames (a few buffers of
 * the largest level's size; dl_ltx2_vae_activation_bytes says how much).
 * Supported: any decoder_block_out_channels / decoder_layers_per_block /
 * decoder_spatio_temporal_scaling / upsample_type / upsample_residual /
 * upsample_factor that diffusers can run, patch_size, patch_size_t, timestep
 * conditioning on or off, causal or non-causal decoder, spatial padding zeros,
 * reflect, replicate or circular. Refused by name: decoder_inject_noise (diffusers
 * draws that noise from torch's global generator), timestep conditioning with an
 * up block conv_in (diffusers fails on it), configs whose channels do not chain. */
#ifndef DIFFLET_LTX2_VAE_H
#define DIFFLET_LTX2_VAE_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_ltx2_vae dl_ltx2_vae;

/* Reads <component>/config.json and the decoder's weights (`decoder.*`,
 * `latents_mean`, `latents_std`; from `src`, a program's weight source, or NULL:
 * the component's checkpoint), checks every tensor's shape against the config, and
 * builds the decoder for a latent of lat_frames x lat_h x lat_w. Bad sizes are
 * DL_ERR_INVALID, a dtype other than f32 / bf16 DL_ERR_UNSUPPORTED; a config or
 * checkpoint that disagrees is an error naming the field or tensor. */
dl_status dl_ltx2_vae_load(dl_ltx2_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                           int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src);
/* Latent channels (config latent_channels). */
int64_t dl_ltx2_vae_latent_channels(const dl_ltx2_vae *m);
/* Video channels: out_channels / patch_size_t (3 for LTX-2). */
int64_t dl_ltx2_vae_video_channels(const dl_ltx2_vae *m);
/* Video pixels per latent pixel along each axis: patch_size x 2^(spatial upsamplers). */
int dl_ltx2_vae_scale_spatial(const dl_ltx2_vae *m);
/* Video frames per latent frame after the first: 2^(temporal upsamplers); the
 * decoder's frames are then multiplied by patch_size_t. */
int dl_ltx2_vae_scale_temporal(const dl_ltx2_vae *m);
/* Output frames: ((lat_frames - 1) * scale_temporal + 1) * patch_size_t. */
int64_t dl_ltx2_vae_frames(const dl_ltx2_vae *m);
/* Config scaling_factor (1.0 when absent). */
float dl_ltx2_vae_scaling_factor(const dl_ltx2_vae *m);
/* The checkpoint's latents_mean / latents_std buffers, [latent_channels] each
 * (owned by m). The pipeline de-normalises its latents, z = z std / scaling_factor
 * + mean, before dl_ltx2_vae_decode. */
const float *dl_ltx2_vae_latents_mean(const dl_ltx2_vae *m);
const float *dl_ltx2_vae_latents_std(const dl_ltx2_vae *m);
/* Config timestep_conditioning: when set, the pipeline also mixes noise into its
 * latents ((1 - decode_noise_scale) z + decode_noise_scale noise) and passes its
 * decode_timestep as temb. */
int dl_ltx2_vae_timestep_conditioning(const dl_ltx2_vae *m);
/* Bytes held for decoding, fixed at load (weights not counted). */
size_t dl_ltx2_vae_activation_bytes(const dl_ltx2_vae *m);

/* z: [latent_channels, lat_frames, lat_h, lat_w] f32, already de-normalised (what
 * the pipeline hands vae.decode); temb: the decode timestep (diffusers multiplies it
 * by the checkpoint's timestep_scale_multiplier), ignored without timestep
 * conditioning; video: [video_channels, frames, lat_h * scale, lat_w * scale] f32,
 * not clamped (diffusers' decode(z, temb).sample; the pipeline post-processes it).
 * Deterministic: decoding the same input twice gives the same bytes. on_chunk (may
 * be NULL) is called with ctx after each stage (conv_in and mid block, each up
 * block, the output: done of total). One decode at a time per model. A non-finite
 * latent or temb is DL_ERR_INVALID. */
dl_status dl_ltx2_vae_decode(dl_ltx2_vae *m, const float *z, float temb, float *video,
                             void (*on_chunk)(void *ctx, int done, int total), void *ctx);
void dl_ltx2_vae_free(dl_ltx2_vae *m);

#ifdef __cplusplus
}
#endif
#endif
