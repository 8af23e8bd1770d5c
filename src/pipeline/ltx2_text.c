/* LTX-2's text path (diffusers' LTX2Pipeline._get_gemma_prompt_embeds, then the
 * connectors):
 *   ids, mask = tokenizer(prompt.strip(), padding="max_length" on the LEFT, max_length=T,
 *                         truncation, add_special_tokens)
 *   h = text_encoder(ids, mask, output_hidden_states=True).hidden_states   // L + 1 of [T, C]
 *   embeds = stack(h, -1).flatten(2, 3)                                    // [T, C (L + 1)]
 *   video, audio = connectors(embeds, mask, padding_side="left") */
#include <stdlib.h>
#include <string.h>

#include "difflet/gemma3.h"
#include "difflet/ltx2.h"
#include "difflet/text.h"

dl_status dl_ltx2_text_embeds(const dl_tokenizer *tok, dl_gemma3_text *te, dl_ltx2_connectors *cn, const char *prompt,
                              int T, float *embeds, float *video, float *audio, int64_t *valid, double secs[2]) {
    const double t0 = dl_now();
    int64_t C, L1;
    dl_ltx2_connectors_text_dims(cn, &C, &L1);
    if (dl_gemma3_text_width(te) != C || dl_gemma3_text_layers(te) + 1 != L1)
        return dl_fail(DL_ERR_FORMAT, "LTX-2: the text encoder gives %lld hidden states of %lld, the connectors take %lld of %lld",
                       (long long)dl_gemma3_text_layers(te) + 1, (long long)dl_gemma3_text_width(te), (long long)L1,
                       (long long)C);
    if (T < 1 || T > dl_gemma3_text_max_len(te))
        return dl_fail(DL_ERR_INVALID, "LTX-2: %d text tokens for a text encoder built for %lld", T,
                       (long long)dl_gemma3_text_max_len(te));
    size_t a, b;
    dl_text_strip(prompt, strlen(prompt), &a, &b);
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    float *h = malloc((size_t)(L1 * T * C) * sizeof *h);
    int n = 0;
    dl_status s = ids && h ? dl_tokenizer_encode_opts(tok, prompt + a, b - a, T, DL_TOK_PAD_LEFT, ids, &n)
                           : dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s == DL_OK && n < 1) s = dl_fail(DL_ERR_INVALID, "LTX-2: the prompt gives no tokens");
    if (s == DL_OK) s = dl_gemma3_text_run_all(te, ids, T, T - n, h); /* layer-major [L1, T, C] */
    if (s == DL_OK) {
        for (int64_t t = 0; t < T; t++) /* the pipeline's packing: index c L1 + l */
            for (int64_t l = 0; l < L1; l++)
                for (int64_t c = 0; c < C; c++) embeds[(t * C + c) * L1 + l] = h[(l * T + t) * C + c];
        const double t1 = dl_now();
        s = dl_ltx2_connectors_run(cn, embeds, n, video, audio);
        if (secs) secs[0] += t1 - t0, secs[1] += dl_now() - t1;
    }
    if (s == DL_OK && valid) *valid = n;
    free(ids), free(h);
    return s;
}
