/* HunyuanVideo's Llama prompt embeddings (diffusers' HunyuanVideoPipeline.
 * _get_llama_prompt_embeds):
 *   text = template.format(prompt)                      // the system prompt around it
 *   ids  = tokenizer(text, max_length = M + crop, padding = max_length, truncation)
 *   h    = text_encoder(ids, attention_mask).hidden_states[-(skip + 1)]
 *   embeds, mask = h[crop:], attention_mask[crop:]      // [M, D], [M]
 * The template's own tokens are dropped; what stays is the prompt (and its <|eot_id|>)
 * with padding. */
#include <stdlib.h>
#include <string.h>

#include "difflet/qwen.h"
#include "difflet/text.h"

/* Python's str.format with one positional `{}`: {{ and }} are braces */
static char *format_template(const char *tmpl, const char *prompt) {
    size_t tl = strlen(tmpl), pl = strlen(prompt), n = 0;
    char *o = malloc(tl + pl + 1);
    int used = 0;
    if (!o) return NULL;
    for (size_t i = 0; i < tl; i++) {
        if ((tmpl[i] == '{' && tmpl[i + 1] == '{') || (tmpl[i] == '}' && tmpl[i + 1] == '}')) {
            o[n++] = tmpl[i++];
        } else if (tmpl[i] == '{' && tmpl[i + 1] == '}' && !used) {
            memcpy(o + n, prompt, pl);
            n += pl, i++, used = 1;
        } else if (tmpl[i] == '{' || tmpl[i] == '}') {
            free(o);
            dl_fail(DL_ERR_INVALID, "prompt template: a brace at byte %zu that is not `{}`, `{{` or `}}`", i);
            return NULL;
        } else {
            o[n++] = tmpl[i];
        }
    }
    if (!used) {
        free(o);
        dl_fail(DL_ERR_INVALID, "prompt template: no `{}` for the prompt");
        return NULL;
    }
    o[n] = 0;
    return o;
}

dl_status dl_hunyuan_llama_embeds(const dl_tokenizer *tok, dl_qwen2_text *te, const char *prompt, const char *tmpl,
                                  int crop_start, int max_sequence_length, int skip, float *embeds, int32_t *mask) {
    const int L = dl_qwen2_text_layers(te);
    const int64_t D = dl_qwen2_text_width(te);
    if (crop_start < 0 || max_sequence_length < 1 || (int64_t)crop_start + max_sequence_length > dl_qwen2_text_max_len(te))
        return dl_fail(DL_ERR_INVALID, "HunyuanVideo text: %d + %d tokens do not fit the text encoder's %lld", crop_start,
                       max_sequence_length, (long long)dl_qwen2_text_max_len(te));
    if (skip < 0 || skip > L)
        return dl_fail(DL_ERR_INVALID, "HunyuanVideo text: %d layers to skip of %d", skip, L);
    char *text = format_template(tmpl, prompt);
    if (!text) return DL_ERR_INVALID;
    const int n = crop_start + max_sequence_length;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *h = malloc((size_t)n * (size_t)D * sizeof *h);
    int valid = 0;
    dl_status s = ids && h ? dl_tokenizer_encode(tok, text, strlen(text), n, 1, ids, &valid)
                           : dl_fail(DL_ERR_NOMEM, "out of memory");
    free(text);
    if (s == DL_OK && valid < 1) s = dl_fail(DL_ERR_INVALID, "HunyuanVideo text: the prompt has no tokens");
    if (s == DL_OK) s = dl_qwen2_text_run_hidden(te, ids, n, valid, L - skip, h);
    if (s == DL_OK) {
        memcpy(embeds, h + (size_t)crop_start * (size_t)D, (size_t)max_sequence_length * (size_t)D * sizeof *h);
        for (int i = 0; i < max_sequence_length; i++) mask[i] = crop_start + i < valid;
    }
    free(ids), free(h);
    return s;
}
