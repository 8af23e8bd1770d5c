/* LTX-2's pieces (diffusers' LTX2Pipeline) as they are built. */
#ifndef DIFFLET_LTX2_H
#define DIFFLET_LTX2_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the text connectors (LTX2TextConnectors; math in src/models/ltx2_connectors.c) --
 * The Gemma hidden states of every layer, packed as the pipeline packs them, in; the
 * video and audio streams' text embeddings out. Both generations diffusers accepts:
 * LTX-2.0 (per-layer masked mean/range norm, one text_proj_in) and LTX-2.3 (per-token
 * RMS norm, per-modality projections). Built for T text rows (the pipeline's
 * max_sequence_length; a multiple of the learnable registers when the connectors have
 * them), f32 or bf16 matmul inputs, f32 residual stream. */
typedef struct dl_ltx2_connectors dl_ltx2_connectors;
dl_status dl_ltx2_connectors_load(dl_ltx2_connectors **out, dl_model_dir *dir, const char *component, int64_t T,
                                  dl_dtype dt, dl_wsrc *src);
/* caption_channels (C) and text_proj_in_factor (the stacked layers, L1) */
void dl_ltx2_connectors_text_dims(const dl_ltx2_connectors *m, int64_t *channels, int64_t *layers);
int64_t dl_ltx2_connectors_video_width(const dl_ltx2_connectors *m);
int64_t dl_ltx2_connectors_audio_width(const dl_ltx2_connectors *m);
/* hidden [T, C * L1] (index c * L1 + l: torch.stack(hidden_states, -1).flatten(2, 3)),
 * LEFT padded: the last `valid` rows are the prompt (1..T). video [T, Dv], audio
 * [T, Da]; every text row is then attended by the transformer (diffusers' returned
 * mask is all ones). */
dl_status dl_ltx2_connectors_run(dl_ltx2_connectors *m, const float *hidden, int64_t valid, float *video, float *audio);
void dl_ltx2_connectors_free(dl_ltx2_connectors *m);

/* The text path (src/pipeline/ltx2_text.c): LTX2Pipeline._get_gemma_prompt_embeds (the
 * prompt stripped, left-padded or truncated to T tokens, every Gemma 3 hidden state
 * stacked into embeds [T, C (L + 1)]) then the connectors into video [T, Dv] and audio
 * [T, Da]; *valid: the prompt's real tokens. The text encoder must be built for >= T
 * tokens and match the connectors' C and L + 1. secs (NULL: not timed): [0] += the
 * tokenizer's and Gemma's seconds, [1] += the connectors'. */
struct dl_tokenizer;
typedef struct dl_gemma3_text dl_gemma3_text;
dl_status dl_ltx2_text_embeds(const struct dl_tokenizer *tok, dl_gemma3_text *te, dl_ltx2_connectors *cn,
                              const char *prompt, int T, float *embeds, float *video, float *audio, int64_t *valid,
                              double secs[2]);

/* ---- the audio-video transformer (LTX2VideoTransformer3DModel; src/models/ltx2_transformer.c)
 * One denoising forward of the video and audio streams together, batch 1, as each of
 * LTX2Pipeline's guidance passes calls it: one timestep per stream (not per token),
 * every text row attended (the connectors' mask is all ones), optionally with
 * spatio-temporal guidance blocks (perturbed self-attention) or isolated modalities. Built for one shape: the latent grid the pipeline packs (frames, height,
 * width before patching), the audio latent frames, the text rows and the frame rate
 * (RoPE positions are computed at load as prepare_video_coords / prepare_audio_coords
 * compute them); f32 or bf16 matmul inputs, f32 residual streams. Refused by name:
 * norm_elementwise_affine, audio patch sizes other than 1, cross-attention widths other
 * than the streams' widths, activation_fn / qk_norm other than diffusers' only ones. */
typedef struct dl_ltx2_transformer dl_ltx2_transformer;
typedef struct {
    int64_t frames, height, width; /* latent grid (num_frames, height, width the pipeline passes) */
    int64_t audio_frames;          /* audio latent frames (audio_num_frames) */
    int64_t text_rows;             /* text rows T of both streams' embeddings */
    double fps;                    /* frame_rate (RoPE's temporal positions) */
} dl_ltx2_transformer_shape;
typedef struct {
    int64_t video_tokens, video_in, video_out; /* packed latents [Nv, in] -> [Nv, out] */
    int64_t audio_tokens, audio_in, audio_out; /* [Na, audio_in] -> [Na, audio_out] */
    int64_t text_rows, text_width, audio_text_width; /* caption_channels with caption projections, else the widths */
    int64_t layers;      /* num_layers */
    int perturbed_attn;  /* config perturbed_attn: stg_blocks take effect */
} dl_ltx2_transformer_info;
typedef struct {
    const float *video;      /* [video_tokens, video_in] */
    const float *audio;      /* [audio_tokens, audio_in] */
    const float *text;       /* [text_rows, text_width] */
    const float *audio_text; /* [text_rows, audio_text_width] */
    int64_t video_tokens, audio_tokens, text_rows; /* must be the built ones */
    /* as the forward takes them; LTX2Pipeline passes timestep = audio_timestep =
     * sigma = audio_sigma = t (the scheduler's timestep, 0..1000) */
    float timestep, audio_timestep, sigma, audio_sigma;
    int use_cross_timestep;  /* cross-modal modulation from the other stream's sigma (pipeline default 1) */
    int isolate_modalities;  /* skip a2v / v2a (LTX-2.3 modality guidance) */
    /* spatio_temporal_guidance_blocks with perturbation_mask None (every element
     * perturbed): in these blocks both self-attentions output their value projection
     * (LTX2PerturbedAttnProcessor). Only a model whose config has perturbed_attn
     * perturbs (diffusers ignores the blocks otherwise); indices past the last block
     * perturb nothing. NULL / 0: the plain forward. */
    const int *stg_blocks;
    int stg_nblocks;
} dl_ltx2_transformer_input;
dl_status dl_ltx2_transformer_load(dl_ltx2_transformer **out, dl_model_dir *dir, const char *component,
                                   const dl_ltx2_transformer_shape *shape, dl_dtype dt, dl_wsrc *src);
/* The same, this rank's part of a split (NULL: one rank; docs/parallel.md): TP splits
 * both streams' heads and feed-forward columns (row-parallel outputs all-reduced), CP
 * the video tokens (self-attention by the split's cp_mode; the audio stream replicated
 * on every cp rank, v2a's partials merged over the cp group, or its video K / V
 * all-gathered with cp_mode gather). Every rank's run takes the full inputs and returns
 * the full outputs. A split dl_ltx2_split_check refuses, or more cp ranks than video
 * tokens, is refused ("parallel split refused: ..."). */
dl_status dl_ltx2_transformer_load_split(dl_ltx2_transformer **out, dl_model_dir *dir, const char *component,
                                         const dl_ltx2_transformer_shape *shape, dl_dtype dt, dl_wsrc *src,
                                         const dl_dit_split *split);
/* Why the transformer of config.json `cfg` cannot run `split` (NULL when it can; the
 * reason in buf): the video heads not divisible by tp (by tp x cp for Ulysses), the
 * audio heads not divisible by tp, sp, interleaved RoPE column pairs cut by tp, more
 * than 64 cp ranks, or the config itself refused. */
const char *dl_ltx2_split_check(const struct cJSON *cfg, const dl_dit_split *split, char *buf, size_t n);
const dl_ltx2_transformer_info *dl_ltx2_transformer_get_info(const dl_ltx2_transformer *m);
/* out_video [video_tokens, video_out], out_audio [audio_tokens, audio_out] (f32, the
 * velocity predictions). Refuses non-finite inputs or timesteps and other sizes.
 * The text cache: what a pass computes from its text alone (the caption projections
 * and every block's text cross-attention K | V) is kept for the last two texts (a
 * request's prompt and negative prompt), keyed by the text inputs' exact bytes (and
 * by the sigmas where cross_attn_mod's prompt adaLN modulates the keys): the steps
 * after a text's first pass skip it, with the same output bytes. Its memory, 2 x
 * (the text inputs + layers x text_rows x 2 (D + Da) / tp matmul elements), is made at
 * load and counted into the arena. */
dl_status dl_ltx2_transformer_run(dl_ltx2_transformer *m, const dl_ltx2_transformer_input *in, float *out_video,
                                  float *out_audio);
/* Empties the text cache: the next pass of every text computes its K | V again. */
void dl_ltx2_transformer_forget_text(dl_ltx2_transformer *m);
void dl_ltx2_transformer_free(dl_ltx2_transformer *m);

/* The step-caching probe (a program of its own, the pipeline's "probe" component; weights
 * from the transformer's folder): the video patch embedding (proj_in), the timestep
 * conditioning (time_embed) and block 0's modulated video input RMS(x)(1 + scale_msa) +
 * shift_msa [video_tokens, D] (f32), scored as the relative L1 change against the
 * slot's previous call (0 on a slot's first call after load or reset). The feature
 * depends on the video latents and the timestep only, so every guidance pass of a step
 * shares it. Built for the transformer's latent grid (shape's frames, height, width). */
typedef struct dl_ltx2_probe dl_ltx2_probe;
dl_status dl_ltx2_probe_load(dl_ltx2_probe **out, dl_model_dir *dir, const char *component,
                             const dl_ltx2_transformer_shape *shape, dl_dtype dt, dl_wsrc *src);
/* The same for this rank of a split (NULL: one rank): its cp rank's video rows, the
 * score's sums added over the cp group in rank order (the same score on every rank). */
dl_status dl_ltx2_probe_load_split(dl_ltx2_probe **out, dl_model_dir *dir, const char *component,
                                   const dl_ltx2_transformer_shape *shape, dl_dtype dt, dl_wsrc *src,
                                   const dl_dit_split *split);
/* video [video_tokens, video_in] (packed latents), timestep 0..1000; slot 0 or 1 */
dl_status dl_ltx2_probe_run(dl_ltx2_probe *p, int slot, const float *video, float timestep, double *score);
void dl_ltx2_probe_reset(dl_ltx2_probe *p); /* every slot's next score is 0 */
void dl_ltx2_probe_free(dl_ltx2_probe *p);

#ifdef __cplusplus
}
#endif
#endif
