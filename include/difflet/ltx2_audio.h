/* LTX-2's audio tail (diffusers 0.42): the AutoencoderKLLTX2Audio decoder
 * (src/models/ltx2_audio.c) and the LTX2Vocoder or LTX2VocoderWithBWE
 * (src/models/ltx2_vocoder.c).
 *
 * LTX2Pipeline ends its audio branch with
 *     z   = unpack(latents * latents_std + latents_mean)   [L, C M] -> [C, L, M]
 *     mel = audio_vae.decode(z)                             [out_channels, 4 L - 3, mel_bins]
 *     wav = vocoder(mel)                                    [out_channels, samples]
 * with M = mel_bins / 4 latent mel bins and L latent frames; both models are built
 * for one size and dtype at load (f32 or bf16 weights and convolution inputs;
 * norms, activations, residual sums and outputs in f32), every buffer is made at
 * load, and running allocates nothing.
 *
 * Refused by name: a vocoder class other than those two, a generator with act_fn
 * leaky_relu and antialias (diffusers nests its anti-aliased
 * activations there), norm_type, causality_axis and act_fn values diffusers
 * does not define, mel_bins null. */
#ifndef DIFFLET_LTX2_AUDIO_H
#define DIFFLET_LTX2_AUDIO_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- AutoencoderKLLTX2Audio decoder ---------------------------------------------- */

typedef struct dl_ltx2_audio_vae dl_ltx2_audio_vae;

/* Reads <component>/config.json and the decoder's weights (`decoder.*`,
 * `latents_mean`, `latents_std`; from `src`, a program's weight source, or NULL:
 * the component's checkpoint), checks every tensor's shape against the config and
 * builds the decoder for lat_frames latent frames (the pipeline's audio_num_frames)
 * of mel_bins / 4 latent mel bins. Bad sizes are DL_ERR_INVALID, a dtype other
 * than f32 / bf16 DL_ERR_UNSUPPORTED; a config or checkpoint that disagrees is an
 * error naming the field or tensor. */
dl_status dl_ltx2_audio_vae_load(dl_ltx2_audio_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                                 dl_dtype dt, dl_wsrc *src);
/* Latent channels C, latent frames L, latent mel bins M (config mel_bins / 4). */
int64_t dl_ltx2_audio_vae_latent_channels(const dl_ltx2_audio_vae *m);
int64_t dl_ltx2_audio_vae_latent_frames(const dl_ltx2_audio_vae *m);
int64_t dl_ltx2_audio_vae_latent_mel_bins(const dl_ltx2_audio_vae *m);
/* The mel spectrogram decode writes: out_channels x mel_frames x mel_bins, with
 * mel_frames = max(4 L - 3, 1) (diffusers' target length; the decoder's own
 * output is cut or zero-padded to it) and mel_bins the config's. */
int64_t dl_ltx2_audio_vae_out_channels(const dl_ltx2_audio_vae *m);
int64_t dl_ltx2_audio_vae_mel_frames(const dl_ltx2_audio_vae *m);
int64_t dl_ltx2_audio_vae_mel_bins(const dl_ltx2_audio_vae *m);
/* Config sample_rate and mel_hop_length (16000, 160): the pipeline's audio latent
 * rate is sample_rate / hop / 4 latent frames per second. */
int64_t dl_ltx2_audio_vae_sample_rate(const dl_ltx2_audio_vae *m);
int64_t dl_ltx2_audio_vae_hop_length(const dl_ltx2_audio_vae *m);
/* The latent statistics (buffers latents_mean, latents_std), n = base_channels
 * values each, indexed by packed feature c M + m; owned by m. */
const float *dl_ltx2_audio_vae_latents_mean(const dl_ltx2_audio_vae *m, int64_t *n);
const float *dl_ltx2_audio_vae_latents_std(const dl_ltx2_audio_vae *m, int64_t *n);
/* Bytes held for decoding, fixed at load (weights not counted). */
size_t dl_ltx2_audio_vae_activation_bytes(const dl_ltx2_audio_vae *m);

/* The pipeline's path: packed: [L, C M] f32 as the denoiser leaves them
 * (normalised); de-normalised with latents_mean / latents_std, unpacked to
 * [C, L, M] and decoded into mel [out_channels, mel_frames, mel_bins] f32.
 * Needs base_channels == C M (the pipeline's broadcast), else DL_ERR_INVALID. A
 * non-finite latent is DL_ERR_INVALID. One decode at a time per model. */
dl_status dl_ltx2_audio_vae_decode(dl_ltx2_audio_vae *m, const float *packed, float *mel);
/* audio_vae.decode(z) alone: z [C, L, M] f32, already de-normalised and unpacked. */
dl_status dl_ltx2_audio_vae_decode_z(dl_ltx2_audio_vae *m, const float *z, float *mel);
void dl_ltx2_audio_vae_free(dl_ltx2_audio_vae *m);

/* The vocoder's input from a decoded mel: [C, T, B] (channels, frames, bins) ->
 * [C B, T] (row c B + b), as LTX2Vocoder.forward's transpose(2, 3).flatten(1, 2). */
void dl_ltx2_audio_mel_to_vocoder(const float *mel, int64_t channels, int64_t frames, int64_t bins, float *out);

/* ---- LTX2Vocoder / LTX2VocoderWithBWE ------------------------------------------------ */

typedef struct dl_ltx2_vocoder dl_ltx2_vocoder;

/* Reads <component>/config.json and weights (as above) and builds the vocoder for
 * mel_frames input frames; _class_name picks LTX2Vocoder or LTX2VocoderWithBWE
 * (LTX-2.3: a first generator at input_sampling_rate, a causal STFT log-mel of its
 * output from the checkpoint's forward_basis / mel_basis, a second generator on
 * that mel, plus the Hann-sinc resampled first output, clamped to [-1, 1]). Each
 * generator supports act_fn leaky_relu (without antialias), snake and snakebeta
 * (with or without the anti-aliased activation in the resnets; the output
 * activation is always anti-aliased, as diffusers builds it), final_act_fn tanh,
 * clamp or none, with or without the output bias. The BWE's STFT, mel and
 * resampler run in f32 whatever dt. */
dl_status dl_ltx2_vocoder_load(dl_ltx2_vocoder **out, dl_model_dir *dir, const char *component, int64_t mel_frames,
                               dl_dtype dt, dl_wsrc *src);
/* Config in_channels (= the VAE's out_channels x mel_bins), out_channels,
 * output_sampling_rate (for the BWE class: the rate of its output, the pipeline's
 * audio rate). */
int64_t dl_ltx2_vocoder_in_channels(const dl_ltx2_vocoder *v);
int64_t dl_ltx2_vocoder_out_channels(const dl_ltx2_vocoder *v);
int64_t dl_ltx2_vocoder_sample_rate(const dl_ltx2_vocoder *v);
/* Samples per channel for mel_frames frames: each upsampler maps T to
 * (T - 1) s - 2 ((k - s) / 2) + k (s T for the released configs); for the BWE
 * class n1 output_sampling_rate / input_sampling_rate with n1 the first
 * generator's samples. */
int64_t dl_ltx2_vocoder_samples(const dl_ltx2_vocoder *v);
size_t dl_ltx2_vocoder_activation_bytes(const dl_ltx2_vocoder *v);
/* mel: [in_channels, mel_frames] f32 (time last; dl_ltx2_audio_mel_to_vocoder
 * makes it from the VAE's output) -> wave: [out_channels, samples] f32. A
 * non-finite input is DL_ERR_INVALID. One run at a time per vocoder. */
dl_status dl_ltx2_vocoder_run(dl_ltx2_vocoder *v, const float *mel, float *wave);
void dl_ltx2_vocoder_free(dl_ltx2_vocoder *v);

#ifdef __cplusplus
}
#endif
#endif
