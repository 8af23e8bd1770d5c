/* dl_text_clean_caption against Open-Sora v1.2.0's text_preprocessing (clean_caption
 * twice; Python 3.11, ftfy 6.3.1, beautifulsoup4 4.15.0) on
 * tests/data/tok/opensora_clean.json (provenance: opensora_clean.md): every output
 * must be byte-identical, and where the reference raises (markup its HTML parser
 * rejects) the call must fail.
 *
 * Known divergences, listed by exact input in k_mojibake: prompts whose result
 * ftfy's mojibake repair (fix_encoding) changes, which difflet's ftfy port does not
 * reproduce (see dl_text_clean_wan_opts). For those the JSON also holds the
 * reference's result with fix_encoding switched off ("out_without_fix_encoding"),
 * and the output must equal that one exactly. Every case with that key must be in
 * the list and every listed input must be such a case, so the list cannot hide
 * another mismatch. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/io.h"
#include "difflet/text.h"
#include "test_util.h"

static const char *const k_mojibake[] = {
    "don\xc3\xa2\xe2\x82\xac\xe2\x84\xa2t stop",                                  /* donâ€™t stop */
    "\xc3\xa2\xe2\x82\xac\xc5\x93hello\xc3\xa2\xe2\x82\xac\xc2\x9d",               /* â€œhelloâ€\x9d */
    "\xc3\xa3\xe2\x82\xac\xe2\x82\xac",                                          /* ã€€ */
};
#define N_MOJIBAKE (sizeof k_mojibake / sizeof k_mojibake[0])

static int known_mojibake(const char *in) {
    for (size_t i = 0; i < N_MOJIBAKE; i++)
        if (!strcmp(in, k_mojibake[i])) return 1;
    return 0;
}

static void test_corpus(void) {
    cJSON *cases = NULL;
    char *txt;
    size_t len;
    if (dl_file_read(DATA_DIR "/tok/opensora_clean.json", 16u << 20, &txt, &len) == DL_OK) {
        cases = cJSON_ParseWithLength(txt, len);
        free(txt);
    }
    CHECK(cJSON_GetArraySize(cases) >= 300, "opensora_clean.json: %d cases", cJSON_GetArraySize(cases));
    int n = 0, bad = 0, raised = 0, mojibake = 0, unlisted = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(c, "in"), *want = cJSON_GetObjectItemCaseSensitive(c, "out"),
                    *nofix = cJSON_GetObjectItemCaseSensitive(c, "out_without_fix_encoding");
        if (!cJSON_IsString(in) || !(cJSON_IsString(want) || cJSON_IsNull(want))) {
            CHECK(0, "case %d: no \"in\" string or \"out\" string/null", n);
            continue;
        }
        n++;
        char *got = NULL;
        dl_status st = dl_text_clean_caption(in->valuestring, &got);
        if (cJSON_IsNull(want)) {
            raised++;
            if (st != DL_ERR_INVALID || got) {
                if (bad++ < 10)
                    fprintf(stderr, "clean_caption(\"%s\"): the reference raises, difflet gave \"%s\"\n",
                            in->valuestring, got ? got : "");
            }
            free(got);
            continue;
        }
        int listed = known_mojibake(in->valuestring);
        if (listed != (nofix != NULL)) {
            if (unlisted++ < 10)
                fprintf(stderr, "\"%s\": %s\n", in->valuestring,
                        listed ? "listed as mojibake, but the reference's repair does not change it"
                               : "the reference's mojibake repair changes it, and it is not listed");
        }
        const char *ref = listed && cJSON_IsString(nofix) ? nofix->valuestring : want->valuestring;
        mojibake += listed;
        if (st != DL_OK || strcmp(got, ref)) {
            if (bad++ < 10)
                fprintf(stderr, "clean_caption(\"%s\")\n  difflet:  \"%s\"\n  Open-Sora: \"%s\"%s\n", in->valuestring,
                        st == DL_OK ? got : dl_last_error(), ref, listed ? " (fix_encoding off)" : "");
        }
        free(got);
    }
    fprintf(stderr, "caption_clean: %d cases, %d where the reference raises, %d known mojibake divergences (compared "
                    "with fix_encoding off)\n", n, raised, mojibake);
    CHECK(bad == 0, "%d of %d results differ from Open-Sora's", bad, n);
    CHECK(unlisted == 0 && mojibake == (int)N_MOJIBAKE, "mojibake list: %d unlisted or wrongly listed, %d of %d found",
          unlisted, mojibake, (int)N_MOJIBAKE);
    CHECK(raised > 0, "the corpus has cases where the reference raises");
    cJSON_Delete(cases);
}

static void test_refusals(void) {
    char *o = (char *)1;
    CHECK(dl_text_clean_caption("\xff", &o) == DL_ERR_INVALID && !o, "invalid UTF-8 refused");
    o = (char *)1;
    CHECK(dl_text_clean_caption("a <![foo[x]]> b", &o) == DL_ERR_INVALID && !o && strstr(dl_last_error(), "<!["),
          "rejected markup: %s", dl_last_error());
    size_t big = DL_TOK_MAX_TEXT + 1;
    char *lg = malloc(big + 1);
    CHECK(lg != NULL, "alloc");
    memset(lg, 'a', big), lg[big] = 0;
    o = (char *)1;
    CHECK(dl_text_clean_caption(lg, &o) == DL_ERR_INVALID && !o, "over-long prompt refused");
    free(lg);
    /* the fox prompt of the OpenSora spec: the identity */
    CHECK(dl_text_clean_caption("a red fox runs through the snow aesthetic score: 6.5.", &o) == DL_OK &&
              !strcmp(o, "a red fox runs through the snow aesthetic score: 6.5."),
          "fox prompt: \"%s\"", o);
    free(o);
}

int main(void) {
    test_corpus();
    test_refusals();
    return test_done("caption_clean");
}
