/* `difflet tokenize`: the ids (and their token strings) a pipeline's tokenizer gives
 * a text, with the model's special tokens and no padding or truncation, as
 * transformers' tokenizer(text).input_ids and convert_ids_to_tokens show them: for
 * users debugging prompts, and for tests. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/text.h"

int cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *component = "tokenizer", *text = NULL;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = 1;
        else if ((!strcmp(a, "--model") || !strcmp(a, "--component")) && v) {
            if (!strcmp(a, "--model")) model = v;
            else component = v;
            i++;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "difflet: tokenize: unknown option '%s' (--model DIR [--component NAME] [--json] TEXT)\n", a);
            return 2;
        } else if (!text) text = a;
        else {
            fprintf(stderr, "difflet: tokenize: one TEXT argument (quote it)\n");
            return 2;
        }
    }
    if (!model || !text) {
        fprintf(stderr, "difflet: tokenize: --model DIR and a TEXT are required\n");
        return 2;
    }
    if (strchr(component, '/') || !strncmp(component, "..", 2)) {
        fprintf(stderr, "difflet: tokenize: --component names a folder of the model (tokenizer, tokenizer_2)\n");
        return 2;
    }
    char dir[4096], path[4200];
    if (!cli_model("tokenize", model, dir, sizeof dir)) return 1;
    snprintf(path, sizeof path, "%s/%s", dir, component);
    dl_tokenizer *t = NULL;
    char **pieces = NULL;
    int32_t npieces = 0, *ids = NULL;
    int n = 0, rc = 1;
    size_t len = strlen(text);
    const int max_len = (int)(len * 4 + 16); /* no truncation: at most a few ids per byte, plus the specials */
    if (dl_tokenizer_load(&t, path) != DL_OK || !(ids = malloc((size_t)max_len * sizeof *ids)) ||
        dl_tokenizer_encode(t, text, len, max_len, 0, ids, &n) != DL_OK || dl_tokenizer_pieces(t, &pieces, &npieces) != DL_OK) {
        fprintf(stderr, "difflet: tokenize: %s\n", ids || !t ? dl_last_error() : "out of memory");
        goto done;
    }
    cJSON *ji = cJSON_CreateArray(), *jp = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON_AddItemToArray(ji, cJSON_CreateNumber(ids[i]));
        const char *p = ids[i] >= 0 && ids[i] < npieces ? pieces[ids[i]] : NULL;
        cJSON_AddItemToArray(jp, p ? cJSON_CreateString(p) : cJSON_CreateNull());
    }
    char *si = cJSON_PrintUnformatted(ji), *sp = cJSON_PrintUnformatted(jp);
    if (json) printf("{\"ids\":%s,\"tokens\":%s}\n", si, sp);
    else printf("%d ids: %s\ntokens: %s\n", n, si, sp);
    free(si), free(sp);
    cJSON_Delete(ji), cJSON_Delete(jp);
    rc = 0;
done:
    dl_tokenizer_pieces_free(pieces, npieces);
    free(ids);
    dl_tokenizer_free(t);
    return rc;
}
