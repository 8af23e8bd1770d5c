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
 * tokens and match the connectors' C and L + 1. */
struct dl_tokenizer;
typedef struct dl_gemma3_text dl_gemma3_text;
dl_status dl_ltx2_text_embeds(const struct dl_tokenizer *tok, dl_gemma3_text *te, dl_ltx2_connectors *cn,
                              const char *prompt, int T, float *embeds, float *video, float *audio, int64_t *valid);

#ifdef __cplusplus
}
#endif
#endif
