/* Tokenizers against the Python reference: for every string of tests/data/tok/
 * corpus.json (1,000 strings: punctuation, digits, emoji, accents, full-width,
 * CJK, odd whitespace, special-token literals, long prompts) the ids must equal
 * those of transformers / tokenizers exactly, truncated at 512: CLIP BPE trained
 * here (tokenizer.json) and CLIP's real vocabulary (vocab.json + merges.txt); T5
 * Unigram trained here through tokenizer.json, through spiece.model alone, and
 * with the older tokenizer.json pipeline published T5 checkpoints ship. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/io.h"
#include "difflet/text.h"
#include "test_util.h"

static cJSON *g_corpus;

static void compare_rows(const cJSON *rows, const char *dir, const char *key);

static void compare(const char *dir, const char *key) { compare_rows(g_corpus, dir, key); }

static void compare_rows(const cJSON *rows, const char *dir, const char *key) {
    dl_tokenizer *t;
    if (dl_tokenizer_load(&t, dir) != DL_OK) {
        CHECK(0, "load %s: %s", dir, dl_last_error());
        return;
    }
    int32_t ids[512];
    int bad = 0, total = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        const char *text = cJSON_GetObjectItem(row, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(row, key);
        int n;
        total++;
        dl_status s = dl_tokenizer_encode(t, text, strlen(text), 512, 0, ids, &n);
        int same = s == DL_OK && n == cJSON_GetArraySize(want);
        for (int i = 0; same && i < n; i++) same = ids[i] == (int32_t)cJSON_GetArrayItem(want, i)->valuedouble;
        if (!same && bad++ < 5) {
            fprintf(stderr, "%s: \"%s\"\n  got ", key, text);
            for (int i = 0; i < n && i < 40; i++) fprintf(stderr, "%d ", ids[i]);
            fprintf(stderr, "\n want ");
            for (int i = 0; i < cJSON_GetArraySize(want) && i < 40; i++)
                fprintf(stderr, "%d ", (int)cJSON_GetArrayItem(want, i)->valuedouble);
            fprintf(stderr, "%s\n", s == DL_OK ? "" : dl_last_error());
        }
    }
    CHECK(bad == 0, "%s (%s): %d of %d strings differ from the reference", key, dir, bad, total);
    dl_tokenizer_free(t);
}

static void test_padding_and_limits(void) {
    dl_tokenizer *t;
    if (dl_tokenizer_load(&t, DATA_DIR "/tok/clip_real") != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    int32_t ids[77];
    int n;
    CHECK(dl_tokenizer_encode(t, "a photo of a cat", 16, 77, 1, ids, &n) == DL_OK, "%s", dl_last_error());
    CHECK(n == 7 && ids[0] == 49406 && ids[6] == 49407 && ids[7] == dl_tokenizer_pad_id(t) && ids[76] == dl_tokenizer_pad_id(t),
          "BOS ... EOS then padding to 77 (n=%d)", n);
    char longp[4000];
    longp[0] = 0;
    for (int i = 0; i < 300; i++) strcat(longp, "cat ");
    CHECK(dl_tokenizer_encode(t, longp, strlen(longp), 77, 1, ids, &n) == DL_OK && n == 77 && ids[76] == 49407,
          "truncated to 77 keeping EOS");
    CHECK(dl_tokenizer_encode(t, "\xff\xfe", 2, 77, 1, ids, &n) == DL_ERR_INVALID, "invalid UTF-8 refused");
    CHECK(dl_tokenizer_encode(t, "a", 1, 1, 1, ids, &n) == DL_ERR_INVALID, "max_len below the special tokens refused");
    dl_tokenizer_free(t);
    CHECK(dl_tokenizer_load(&t, "/nonexistent") == DL_ERR_IO && strstr(dl_last_error(), "does not exist"), "%s", dl_last_error());
}

/* html.unescape, ftfy.fix_text (6.3.1) and WanPipeline's prompt_clean without
 * ftfy and with it, against Python on tests/data/tok/clean.json
 * (tools/parity/make_clean_vectors.py). Cases marked "mojibake" are those ftfy's
 * mojibake repair changes, which difflet does not reproduce: they are skipped, but
 * each must be reported as maybe_mojibake; every other case must match. */
static void test_clean(void) {
    cJSON *cases = NULL;
    char *txt;
    size_t len;
    if (dl_file_read(DATA_DIR "/tok/clean.json", 8u << 20, &txt, &len) == DL_OK) {
        cases = cJSON_ParseWithLength(txt, len);
        free(txt);
    }
    CHECK(cJSON_GetArraySize(cases) >= 700, "clean.json: %d cases", cJSON_GetArraySize(cases));
    int bad = 0, n = 0, nftfy = 0, skipped = 0, unflagged = 0, flagged = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *in = cJSON_GetObjectItemCaseSensitive(c, "in")->valuestring;
        const char *un = cJSON_GetObjectItemCaseSensitive(c, "unescape")->valuestring;
        const char *wan = cJSON_GetObjectItemCaseSensitive(c, "wan")->valuestring;
        const cJSON *wf = cJSON_GetObjectItemCaseSensitive(c, "wan_ftfy");
        const cJSON *ff = cJSON_GetObjectItemCaseSensitive(c, "ftfy");
        CHECK(cJSON_IsString(wf) && cJSON_IsString(ff), "case %d has wan_ftfy and ftfy", n);
        int mojibake = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "mojibake"));
        char *got = NULL, *got2 = NULL, *got3 = NULL, *fx = NULL;
        int maybe = -1, maybe2 = -1;
        n++;
        if (dl_html_unescape(in, strlen(in), &got) != DL_OK || strcmp(got, un)) {
            if (bad++ < 5) fprintf(stderr, "unescape(\"%s\"): got \"%s\", Python \"%s\"\n", in, got ? got : "(error)", un);
        }
        if (dl_text_clean_wan_opts(in, DL_CLEAN_NO_FTFY, &got2, &maybe2) != DL_OK || strcmp(got2, wan) || maybe2 != 0) {
            if (bad++ < 5) fprintf(stderr, "prompt_clean(\"%s\") without ftfy: got \"%s\", diffusers \"%s\"\n", in, got2 ? got2 : "(error)", wan);
        }
        if (dl_text_clean_wan_opts(in, 0, &got3, &maybe) != DL_OK) {
            if (bad++ < 5) fprintf(stderr, "prompt_clean(\"%s\") with ftfy: %s\n", in, dl_last_error());
        } else if (mojibake) {
            skipped++;
            if (!maybe && unflagged++ < 5) fprintf(stderr, "prompt_clean(\"%s\"): mojibake not flagged\n", in);
        } else if (dl_text_ftfy_fix(in, &fx, NULL) != DL_OK || strcmp(fx, ff->valuestring)) {
            if (bad++ < 5) fprintf(stderr, "ftfy.fix_text(\"%s\"): got \"%s\", ftfy \"%s\"\n", in, fx ? fx : "(error)", ff->valuestring);
        } else if (strcmp(got3, wf->valuestring)) {
            if (bad++ < 5) fprintf(stderr, "prompt_clean(\"%s\") with ftfy: got \"%s\", diffusers \"%s\"\n", in, got3, wf->valuestring);
        } else {
            nftfy++;
            flagged += maybe;
            char *d = NULL; /* dl_text_clean_wan is the ftfy path */
            if (dl_text_clean_wan(in, &d) != DL_OK || strcmp(d, got3)) bad++;
            free(d);
        }
        free(got), free(got2), free(got3), free(fx);
    }
    fprintf(stderr, "clean: %d cases; with ftfy %d exact (%d of them flagged maybe_mojibake), "
                    "%d skipped where ftfy's mojibake repair changes the result\n", n, nftfy, flagged, skipped);
    CHECK(bad == 0, "%d cleaning results differ from Python", bad);
    CHECK(skipped > 0 && unflagged == 0, "%d of %d mojibake cases not flagged maybe_mojibake", unflagged, skipped);
    CHECK(nftfy + skipped == n && flagged < nftfy, "ftfy cases: %d exact + %d skipped of %d", nftfy, skipped, n);
    /* fix_text cuts a line every 1,000,000 code points (max_decode_length): a
     * reference across the cut stays, '<' turns unescaping off from its segment on
     * (outcomes taken from ftfy 6.3.1 in Python) */
    size_t big = 1000010;
    char *lg = malloc(big + 1), *o = NULL;
    CHECK(lg != NULL, "alloc");
    memset(lg, 'a', big), strcpy(lg + 999998, "&amp;");
    CHECK(dl_text_ftfy_fix(lg, &o, NULL) == DL_OK && !strcmp(o + strlen(o) - 6, "a&amp;"), "reference across the cut kept");
    free(o), memset(lg, 'a', big), strcpy(lg + 999990, "&amp;");
    CHECK(dl_text_ftfy_fix(lg, &o, NULL) == DL_OK && !strcmp(o + strlen(o) - 3, "aa&"), "reference before the cut decoded");
    free(o), memset(lg, 'a', big), memcpy(lg, "x&lt;", 5), strcpy(lg + 1000000, "<&lt;");
    CHECK(dl_text_ftfy_fix(lg, &o, NULL) == DL_OK && !strncmp(o, "x<a", 3) && !strcmp(o + strlen(o) - 5, "<&lt;"),
          "'<' in the second segment leaves the first one unescaped");
    free(o), memset(lg, 'a', big), lg[0] = '<', strcpy(lg + 1000000, "&lt;");
    CHECK(dl_text_ftfy_fix(lg, &o, NULL) == DL_OK && !strcmp(o + strlen(o) - 4, "&lt;"), "'<' keeps later segments escaped");
    free(o), free(lg), o = NULL;
    CHECK(dl_text_clean_wan("\xff", &o) == DL_ERR_INVALID && !o, "invalid UTF-8 refused");
    CHECK(dl_text_clean_wan_opts("\xff", DL_CLEAN_NO_FTFY, &o, NULL) == DL_ERR_INVALID && !o, "invalid UTF-8 refused");
    cJSON_Delete(cases);
}

int main(void) {
    test_clean();
    char *txt;
    size_t len;
    if (dl_file_read(DATA_DIR "/tok/corpus.json", 64u << 20, &txt, &len) != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    g_corpus = cJSON_ParseWithLength(txt, len);
    free(txt);
    CHECK(cJSON_GetArraySize(g_corpus) >= 1000, "corpus has %d strings", cJSON_GetArraySize(g_corpus));
    compare(DATA_DIR "/tok/clip_tiny", "clip_tiny");
    compare(DATA_DIR "/tok/clip_real", "clip_real");
    compare(DATA_DIR "/tok/t5_tiny", "t5_tiny");
    compare(DATA_DIR "/tok/t5_tiny_legacy", "t5_tiny_legacy");
    /* the same T5 model from spiece.model alone */
    char dir[] = "/tmp/difflet_spm_XXXXXX", cmd[512];
    if (mkdtemp(dir)) {
        snprintf(cmd, sizeof cmd, "cp %s/tok/t5_tiny/spiece.model %s/", DATA_DIR, dir);
        if (system(cmd) == 0) compare(dir, "t5_tiny");
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    /* the classes transformers 5 reads in its own way (extra.json, make_tokenizer_extra.py):
       special tokens in other cases, control-only strings, trailing whitespace, ... */
    cJSON *extra;
    if (dl_json_read_object(DATA_DIR "/tok/extra.json", NULL, &extra) == DL_OK) {
        const cJSON *cases = cJSON_GetObjectItemCaseSensitive(extra, "cases");
        static const char *const dirs[][2] = {{"clip_tiny", DATA_DIR "/tok/clip_tiny"}, {"clip_real", DATA_DIR "/tok/clip_real"},
                                              {"t5_tiny", DATA_DIR "/tok/t5_tiny"}, {"t5_tiny_legacy", DATA_DIR "/tok/t5_tiny_legacy"},
                                              {"tiny_clip", SOURCE_DIR "/models/difflet-tiny/tokenizer"},
                                              {"tiny_t5", SOURCE_DIR "/models/difflet-tiny/tokenizer_2"},
                                              {"clip_tiny_norm", DATA_DIR "/tok/clip_tiny_norm"},
                                              {"t5_tiny_flags", DATA_DIR "/tok/t5_tiny_flags"}};
        CHECK(cJSON_GetArraySize(cases) >= 30, "extra cases: %d", cJSON_GetArraySize(cases));
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) compare_rows(cases, dirs[i][1], dirs[i][0]);
        /* T5 from spiece.model alone with sentinels (the folders the generator made) */
        const cJSON *spm = cJSON_GetObjectItemCaseSensitive(extra, "spm_configs"), *e;
        cJSON_ArrayForEach(e, spm) {
            char d[] = "/tmp/difflet_spmx_XXXXXX", sh[600], cfgp[300];
            if (!mkdtemp(d)) continue;
            snprintf(sh, sizeof sh, "cp %s/tok/t5_tiny/spiece.model %s/", DATA_DIR, d);
            cJSON *cfg = cJSON_Duplicate(e, 1);
            cJSON_AddNumberToObject(cfg, "model_max_length", 512);
            cJSON_AddStringToObject(cfg, "eos_token", "</s>");
            char *js = cJSON_PrintUnformatted(cfg);
            snprintf(cfgp, sizeof cfgp, "%s/tokenizer_config.json", d);
            if (system(sh) == 0 && dl_file_write_atomic(cfgp, js, strlen(js)) == DL_OK) compare_rows(cases, d, e->string);
            else CHECK(0, "cannot build %s", d);
            free(js);
            cJSON_Delete(cfg);
            snprintf(sh, sizeof sh, "rm -rf %s", d);
            if (system(sh) != 0) fprintf(stderr, "could not remove %s\n", d);
        }
        cJSON_Delete(extra);
    } else {
        CHECK(0, "extra.json: %s", dl_last_error());
    }
    test_padding_and_limits();
    cJSON_Delete(g_corpus);
    return test_done("test_text");
}
