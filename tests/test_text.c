/* Tokenizers against the Python reference: for every string of tests/data/tok/
 * corpus.json (1,000 strings: punctuation, digits, emoji, accents, full-width,
 * CJK, odd whitespace, special-token literals, long prompts) the ids must equal
 * those of transformers / tokenizers exactly, truncated at 512: CLIP BPE trained
 * here (tokenizer.json) and CLIP's real vocabulary (vocab.json + merges.txt); T5
 * Unigram trained here through tokenizer.json, through spiece.model alone, and
 * with the older tokenizer.json pipeline published T5 checkpoints ship; Qwen2
 * byte-level BPE (Qwen-Image's) from tokenizer.json and from vocab.json +
 * merges.txt, on the corpus plus strings aimed at its pattern (qwen.json); Gemma's
 * BPE with byte fallback (LTX-2's text encoder) on the corpus plus strings aimed at
 * its pipeline, and left-padded, truncated as LTX2Pipeline encodes (gemma.json). */
#include <cjson/cJSON.h>
#include <limits.h>
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

/* ---- Qwen2Tokenizer (tests/data/tok/qwen.json, make_qwen_tokenizer_vectors.py) ------ */

static uint64_t fnv_ids(const int32_t *ids, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (((uint32_t)ids[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    return h;
}

/* a reference row's text: its own, or the corpus entry it names */
static const char *row_text(const cJSON *row) {
    const cJSON *ci = cJSON_GetObjectItemCaseSensitive(row, "corpus");
    return cJSON_IsNumber(ci) ? cJSON_GetObjectItem(cJSON_GetArrayItem(g_corpus, ci->valueint), "text")->valuestring
                              : cJSON_GetObjectItemCaseSensitive(row, "text")->valuestring;
}

/* a row whose ids differ, on stderr: `label (dir)`, the text, the first 40 ids got (n of
 * them, status st), want_n and the first `cap` of the reference ids `want` (may be NULL) */
static void print_mismatch(const char *label, const char *dir, const char *text, dl_status st, const int32_t *ids,
                           int n, int want_n, const cJSON *want, int cap) {
    fprintf(stderr, "%s (%s): \"%s\"\n  got %d ids:", label, dir, text, n);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n want %d ids:", want_n);
    for (int i = 0; want && i < cJSON_GetArraySize(want) && i < cap; i++)
        fprintf(stderr, " %d", (int)cJSON_GetArrayItem(want, i)->valuedouble);
    fprintf(stderr, "%s%s\n", st == DL_OK ? "" : " ", st == DL_OK ? "" : dl_last_error());
}

/* Every row of qwen.json through `dir` against reference `key` ([n, fnv] and, for
 * "q", the ids themselves when short); returns the number of exact matches. */
static int qwen_rows(const cJSON *rows, const char *dir, const char *key, int *total) {
    dl_tokenizer *t;
    *total = 0;
    if (dl_tokenizer_load(&t, dir) != DL_OK) {
        CHECK(0, "load %s: %s", dir, dl_last_error());
        return 0;
    }
    int good = 0, bad = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        const char *text = row_text(row);
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(row, key), *want = cJSON_GetObjectItemCaseSensitive(row, "ids");
        size_t len = strlen(text);
        int max_len = (int)(len * 4 + 16), n = 0;
        int32_t *ids = malloc((size_t)max_len * sizeof *ids);
        (*total)++;
        dl_status st = ids ? dl_tokenizer_encode(t, text, len, max_len, 0, ids, &n) : DL_ERR_NOMEM;
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)fnv_ids(ids, st == DL_OK ? n : 0));
        int same = st == DL_OK && n == cJSON_GetArrayItem(ref, 0)->valueint && !strcmp(h, cJSON_GetArrayItem(ref, 1)->valuestring);
        if (same && want && !strcmp(key, "q"))
            for (int i = 0; i < n; i++) same &= ids[i] == (int32_t)cJSON_GetArrayItem(want, i)->valuedouble;
        good += same;
        if (!same && bad++ < 5)
            print_mismatch(key, dir, text, st, ids, n, cJSON_GetArrayItem(ref, 0)->valueint, want, INT_MAX);
        free(ids);
    }
    dl_tokenizer_free(t);
    CHECK(bad == 0, "%s (%s): %d of %d strings differ from transformers", key, dir, bad, *total);
    return good;
}

/* a folder /tmp/difflet_qwen_XXXXXX holding `files` (name, content pairs) plus
   tests/data/qwenimage/tok's or qwen_tiny_vocab's files copied by `cp` */
static int qwen_folder(char *dir, const char *cp, const char *const *files, int nfiles) {
    char cmd[1200], path[600];
    strcpy(dir, "/tmp/difflet_qwen_XXXXXX");
    if (!mkdtemp(dir)) return 0;
    snprintf(cmd, sizeof cmd, "cp %s %s/", cp, dir);
    if (cp && system(cmd) != 0) return 0;
    for (int i = 0; i < nfiles; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[2 * i]);
        if (dl_file_write_atomic(path, files[2 * i + 1], strlen(files[2 * i + 1])) != DL_OK) return 0;
    }
    return 1;
}

static void rm_folder(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Loading a Qwen-sized vocabulary (151,643 tokens, 151,387 merges, built here) must
 * stay quick: the real file cannot be part of the tests. */
static void qwen_large_vocab(void) {
    char dir[64];
    if (!qwen_folder(dir, NULL, NULL, 0)) {
        CHECK(0, "tmp folder");
        return;
    }
    enum { NTOK = 151643 };
    char **tok = calloc(NTOK, sizeof *tok), path[128];
    FILE *fv, *fm;
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    fv = fopen(path, "w");
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    fm = fopen(path, "w");
    CHECK(tok && fv && fm, "large vocabulary files");
    if (!tok || !fv || !fm) return;
    /* the 256 byte-level characters, then tokens made by merging earlier ones */
    int n = 0;
    for (int b = 0, extra = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        int cp = keep ? b : 256 + extra++;
        char u[3] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xc0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3f));
        tok[n++] = strdup(u);
    }
    fprintf(fm, "#version: 0.2\n");
    uint64_t r = 88172645463325252ull;
    dl_strmap *seen = dl_strmap_new(NTOK);
    for (int i = 0; seen && i < n; i++) dl_strmap_put(seen, tok[i], strlen(tok[i]), i);
    while (seen && n < NTOK) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const char *a = tok[r % (uint64_t)n], *b = tok[(r >> 32) % 256];
        if (strlen(a) > 24) a = tok[(r >> 20) % 256];
        char *ab = malloc(strlen(a) + strlen(b) + 1);
        sprintf(ab, "%s%s", a, b);
        int32_t dup;
        if (dl_strmap_get(seen, ab, strlen(ab), &dup) || dl_strmap_put(seen, ab, strlen(ab), n) != DL_OK) {
            free(ab);
            continue;
        }
        fprintf(fm, "%s %s\n", a, b);
        tok[n++] = ab;
    }
    fprintf(fv, "{");
    for (int i = 0; i < n; i++) {
        fprintf(fv, "%s\"", i ? "," : "");
        for (const char *c = tok[i]; *c; c++) fprintf(fv, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
        fprintf(fv, "\":%d", i);
    }
    fprintf(fv, "}");
    fclose(fv), fclose(fm);
    dl_strmap_free(seen);
    const char *cfg = "{\"tokenizer_class\": \"Qwen2Tokenizer\", \"eos_token\": \"<|im_end|>\", \"pad_token\": \"<|endoftext|>\","
                      " \"unk_token\": null, \"additional_special_tokens\": [\"<|im_start|>\", \"<|im_end|>\"]}";
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK(dl_file_write_atomic(path, cfg, strlen(cfg)) == DL_OK, "config");
    double t0 = dl_now();
    dl_tokenizer *t = NULL;
    dl_status st = dl_tokenizer_load(&t, dir);
    double t1 = dl_now();
    CHECK(st == DL_OK, "large vocabulary: %s", dl_last_error());
    if (st == DL_OK) {
        char prompt[8192] = "";
        for (int i = 0; i < 100; i++) strcat(prompt, "<|im_start|>user A cosy kitchen, two cats bake a cake.<|im_end|>\n");
        int32_t *ids = malloc(sizeof(int32_t) * 8192);
        int nid = 0;
        double t2 = dl_now();
        st = dl_tokenizer_encode(t, prompt, strlen(prompt), 8192, 0, ids, &nid);
        double t3 = dl_now();
        /* added in transformers' order: eos <|im_end|>, pad <|endoftext|>, then <|im_start|> */
        CHECK(st == DL_OK && nid > 200 && ids[0] == NTOK + 2 && dl_tokenizer_pad_id(t) == NTOK + 1 &&
                  dl_tokenizer_vocab_size(t) == NTOK + 3,
              "large vocabulary: <|endoftext|> %d, <|im_start|> %d, %d ids", dl_tokenizer_pad_id(t), ids[0], nid);
        fprintf(stderr, "qwen: a %d-token vocabulary with %d merges loads in %.2f s; a %zu-byte prompt encodes in %.1f ms\n", NTOK,
                NTOK - 256, t1 - t0, strlen(prompt), 1e3 * (t3 - t2));
        CHECK(t1 - t0 < 30, "loading took %.1f s", t1 - t0);
        free(ids);
    }
    dl_tokenizer_free(t);
    for (int i = 0; i < n; i++) free(tok[i]);
    free(tok);
    rm_folder(dir);
}

static void test_qwen(void) {
    cJSON *q;
    if (dl_json_read_object(DATA_DIR "/tok/qwen.json", NULL, &q) != DL_OK) {
        CHECK(0, "qwen.json: %s", dl_last_error());
        return;
    }
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(q, "rows");
    CHECK(cJSON_GetArraySize(rows) >= 1000, "qwen.json: %d strings", cJSON_GetArraySize(rows));
    static const char *const dirs[][3] = {
        {"q", SOURCE_DIR "/tests/data/qwenimage/tok", "tokenizer.json"},
        {"q", DATA_DIR "/tok/qwen_tiny_vocab", "vocab.json + merges.txt"},
        {"l", DATA_DIR "/tok/qwen_tiny_legacy", "vocab.json + merges.txt, added_tokens.json, no added_tokens_decoder"},
        {"f", DATA_DIR "/tok/qwen_tiny_flags", "vocab.json + merges.txt, added tokens with flags and id gaps"}};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        int total, good = qwen_rows(rows, dirs[i][1], dirs[i][0], &total);
        fprintf(stderr, "qwen: %d of %d strings exact (%s)\n", good, total, dirs[i][2]);
    }
    /* the same tokenizer.json read as the file says (no class: no rebuilt pipeline) */
    char dir[64];
    const char *noclass[] = {"tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\", \"pad_token\": \"<|endoftext|>\"}"};
    if (qwen_folder(dir, SOURCE_DIR "/tests/data/qwenimage/tok/tokenizer.json", noclass, 1)) {
        int total, good = qwen_rows(rows, dir, "q", &total);
        fprintf(stderr, "qwen: %d of %d strings exact (tokenizer.json's own pipeline, no tokenizer_class)\n", good, total);
    } else {
        CHECK(0, "tmp folder");
    }
    rm_folder(dir);

    dl_tokenizer *t = NULL;
    if (dl_tokenizer_load(&t, DATA_DIR "/tok/qwen_tiny_vocab") == DL_OK) {
        int32_t ids[8];
        int n;
        char **pieces;
        int32_t np;
        CHECK(dl_tokenizer_kind(t) == DL_TOK_BPE && dl_tokenizer_vocab_size(t) == 574 && dl_tokenizer_pad_id(t) == 561 &&
                  dl_tokenizer_bos_id(t) == -1 && dl_tokenizer_eos_id(t) == -1,
              "Qwen2: 574 ids, pad <|endoftext|> 561, no BOS/EOS added");
        CHECK(dl_tokenizer_encode(t, "<|im_start|>", 12, 8, 1, ids, &n) == DL_OK && n == 1 && ids[0] == 562 && ids[1] == 561 &&
                  ids[7] == 561,
              "special token alone, then padding with <|endoftext|>");
        CHECK(dl_tokenizer_encode(t, "\xe4\xb8", 2, 8, 0, ids, &n) == DL_ERR_INVALID, "invalid UTF-8 refused");
        CHECK(dl_tokenizer_pieces(t, &pieces, &np) == DL_OK && np == 574 && !strcmp(pieces[562], "<|im_start|>") &&
                  !strcmp(pieces[198], "\xc4\x8a"),
              "token strings");
        dl_tokenizer_pieces_free(pieces, np);
    } else {
        CHECK(0, "%s", dl_last_error());
    }
    dl_tokenizer_free(t);

    /* refused: what transformers would read differently, and malformed files */
    static const char *const vcp = DATA_DIR "/tok/qwen_tiny_vocab/vocab.json " DATA_DIR "/tok/qwen_tiny_vocab/merges.txt";
    static const struct {
        const char *cp, *files[4];
        dl_status want;
        const char *msg;
    } bad[] = {
        {vcp, {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2Tokenizer\", \"add_prefix_space\": true}"}, DL_ERR_UNSUPPORTED,
         "add_prefix_space"},
        {vcp, {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2TokenizerFast\", \"split_special_tokens\": true}"},
         DL_ERR_UNSUPPORTED, "split_special_tokens"},
        {vcp, {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2Tokenizer\", \"added_tokens_decoder\": {\"600\": \"<x>\"}}"},
         DL_ERR_FORMAT, "added_tokens_decoder"},
        {vcp, {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2Tokenizer\", \"eos_token\": 5}"}, DL_ERR_FORMAT, "eos_token"},
        {DATA_DIR "/tok/qwen_tiny_vocab/vocab.json", {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2Tokenizer\"}"},
         DL_ERR_IO, "merges.txt"},
        {DATA_DIR "/tok/qwen_tiny_vocab/merges.txt",
         {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2Tokenizer\"}", "vocab.json", "[\"a\", \"b\"]"}, DL_ERR_FORMAT,
         "vocab.json"},
        {vcp, {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2Tokenizer\"}", "added_tokens.json", "{\"<x>\": \"1\"}"},
         DL_ERR_FORMAT, "added_tokens.json"},
        {DATA_DIR "/tok/t5_tiny/tokenizer.json", {"tokenizer_config.json", "{\"tokenizer_class\": \"Qwen2Tokenizer\"}"},
         DL_ERR_FORMAT, "needs a BPE model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int nf = bad[i].files[2] ? 2 : 1;
        if (!qwen_folder(dir, bad[i].cp, bad[i].files, nf)) {
            CHECK(0, "tmp folder");
            continue;
        }
        dl_status st = dl_tokenizer_load(&t, dir);
        CHECK(st == bad[i].want && !t && strstr(dl_last_error(), bad[i].msg), "case %zu: status %d, \"%s\"", i, st,
              st == DL_OK ? "" : dl_last_error());
        dl_tokenizer_free(t);
        rm_folder(dir);
    }
    /* a tokenizer.json with Qwen2's Split but ByteLevel's own pattern too: refused */
    cJSON *tj;
    if (dl_json_read_object(SOURCE_DIR "/tests/data/qwenimage/tok/tokenizer.json", NULL, &tj) == DL_OK) {
        cJSON *bl = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "pre_tokenizer"), "pretokenizers"), 1);
        cJSON_ReplaceItemInObject(bl, "use_regex", cJSON_CreateTrue());
        char *js = cJSON_PrintUnformatted(tj);
        const char *files[] = {"tokenizer.json", js};
        if (qwen_folder(dir, NULL, files, 1)) {
            dl_status st = dl_tokenizer_load(&t, dir);
            CHECK(st == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "use_regex"), "Qwen2 Split + ByteLevel use_regex: %d", st);
            dl_tokenizer_free(t);
        }
        rm_folder(dir);
        free(js);
        cJSON_Delete(tj);
    }
    /* an unknown class keeps today's reading: vocab.json + merges.txt are CLIP's */
    const char *other[] = {"tokenizer_config.json", "{\"tokenizer_class\": \"GPT2Tokenizer\"}"};
    if (qwen_folder(dir, vcp, other, 1)) {
        dl_status st = dl_tokenizer_load(&t, dir);
        CHECK(st == DL_ERR_FORMAT && strstr(dl_last_error(), "BOS/EOS"), "unknown class read as CLIP: %d", st);
        dl_tokenizer_free(t);
    }
    rm_folder(dir);
    qwen_large_vocab();
    cJSON_Delete(q);
}

/* ---- GemmaTokenizer (tests/data/tok/gemma.json, make_gemma_tokenizer_vectors.py) --- */

/* Every row of gemma.json through `dir`: the number of ids, their FNV-1a and, when
 * short, the ids must be transformers'; where a row has `alt` ([n, fnv]), those.
 * Returns the number of exact matches. */
static int gemma_rows(const cJSON *rows, const char *dir, const char *alt, int32_t pad, int *total) {
    dl_tokenizer *t;
    *total = 0;
    if (dl_tokenizer_load(&t, dir) != DL_OK) {
        CHECK(0, "load %s: %s", dir, dl_last_error());
        return 0;
    }
    CHECK(dl_tokenizer_kind(t) == DL_TOK_BPE && dl_tokenizer_bos_id(t) == 2 && dl_tokenizer_eos_id(t) == -1 &&
              dl_tokenizer_pad_id(t) == pad,
          "%s: BPE, BOS <bos> 2 added, no EOS, pad %d (bos %d eos %d pad %d)", dir, pad, dl_tokenizer_bos_id(t),
          dl_tokenizer_eos_id(t), dl_tokenizer_pad_id(t));
    int good = 0, bad = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        const char *text = row_text(row);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(row, "ids");
        int want_n = cJSON_GetObjectItemCaseSensitive(row, "n")->valueint;
        const char *want_h = cJSON_GetObjectItemCaseSensitive(row, "fnv")->valuestring;
        const cJSON *a = alt ? cJSON_GetObjectItemCaseSensitive(row, alt) : NULL;
        if (a) {
            want = NULL;
            want_n = cJSON_GetArrayItem(a, 0)->valueint;
            want_h = cJSON_GetArrayItem(a, 1)->valuestring;
        }
        size_t len = strlen(text);
        int max_len = (int)(len * 4 + 16), n = 0; /* byte fallback: up to one id per byte, + BOS */
        int32_t *ids = malloc((size_t)max_len * sizeof *ids);
        (*total)++;
        dl_status st = ids ? dl_tokenizer_encode_opts(t, text, len, max_len, 0, ids, &n) : DL_ERR_NOMEM;
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)fnv_ids(ids, st == DL_OK ? n : 0));
        int same = st == DL_OK && n == want_n && !strcmp(h, want_h);
        for (int i = 0; same && want && i < n; i++) same = ids[i] == (int32_t)cJSON_GetArrayItem(want, i)->valuedouble;
        good += same;
        if (!same && bad++ < 5) print_mismatch("gemma", dir, text, st, ids, n, want_n, want, 40);
        free(ids);
    }
    dl_tokenizer_free(t);
    CHECK(bad == 0, "gemma (%s): %d of %d strings differ from transformers", dir, bad, *total);
    return good;
}

/* LTX2Pipeline's call: tokenizer(prompt.strip(), padding="max_length", max_length=N,
 * truncation=True) with padding_side "left"; every id of every case must be equal. */
static void gemma_padded(const cJSON *cases, const char *dir) {
    dl_tokenizer *t;
    if (dl_tokenizer_load(&t, dir) != DL_OK) {
        CHECK(0, "load %s: %s", dir, dl_last_error());
        return;
    }
    int bad = 0, total = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        int m = cJSON_GetObjectItemCaseSensitive(c, "max_length")->valueint, n = -1, npad = 0;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "ids");
        int32_t ids[128];
        total++;
        dl_status st = m <= 128 ? dl_tokenizer_encode_opts(t, text, strlen(text), m, DL_TOK_PAD_LEFT, ids, &n) : DL_ERR_INVALID;
        int same = st == DL_OK && cJSON_GetArraySize(want) == m;
        for (int i = 0; same && i < m; i++) same = ids[i] == (int32_t)cJSON_GetArrayItem(want, i)->valuedouble;
        while (npad < m && (int32_t)cJSON_GetArrayItem(want, npad)->valuedouble == 0) npad++;
        same = same && n == m - npad; /* *n_valid: the ids after the padding (none of them is <pad> here) */
        if (!same && bad++ < 5) {
            fprintf(stderr, "gemma left padding (%s), max_length %d: \"%s\"\n  got n=%d:", dir, m, text, n);
            for (int i = 0; st == DL_OK && i < m; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "%s%s\n", st == DL_OK ? "" : " ", st == DL_OK ? "" : dl_last_error());
        }
    }
    CHECK(bad == 0 && total >= 40, "gemma (%s): %d of %d left-padded cases differ from transformers", dir, bad, total);
    /* the same text padded right, and unpadded: the same ids, moved */
    int32_t l[16], r[16], u[16];
    int nl, nr, nu;
    for (int i = 0; i < 16; i++) u[i] = -7;
    CHECK(dl_tokenizer_encode_opts(t, "a red fox", 9, 16, DL_TOK_PAD_LEFT, l, &nl) == DL_OK &&
              dl_tokenizer_encode_opts(t, "a red fox", 9, 16, DL_TOK_PAD, r, &nr) == DL_OK &&
              dl_tokenizer_encode_opts(t, "a red fox", 9, 16, 0, u, &nu) == DL_OK && nl == nr && nl == nu && nl < 16 &&
              !memcmp(l + 16 - nl, r, (size_t)nl * sizeof *l) && !memcmp(u, r, (size_t)nl * sizeof *l) && r[15] == 0 &&
              l[0] == 0 && u[nu] == -7,
          "left, right and no padding agree (n %d %d %d)", nl, nr, nu);
    CHECK(dl_tokenizer_encode_opts(t, "x", 1, 16, DL_TOK_PAD | DL_TOK_PAD_LEFT, l, &nl) == DL_ERR_INVALID, "both pads refused");
    CHECK(dl_tokenizer_encode_opts(t, "x", 1, 0, 0, l, &nl) == DL_ERR_INVALID, "max_len 0 refused");
    CHECK(dl_tokenizer_encode(t, "x", 1, 1, 1, l, &nl) == DL_ERR_INVALID, "dl_tokenizer_encode still refuses max_len 1");
    CHECK(dl_tokenizer_encode_opts(t, "\xff", 1, 16, DL_TOK_PAD_LEFT, l, &nl) == DL_ERR_INVALID, "invalid UTF-8 refused");
    dl_tokenizer_free(t);
}

static void test_gemma(void) {
    cJSON *g;
    if (dl_json_read_object(DATA_DIR "/tok/gemma.json", NULL, &g) != DL_OK) {
        CHECK(0, "gemma.json: %s", dl_last_error());
        return;
    }
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(g, "rows"), *e;
    int total = 0, good;
    /* Gemma 3's layout (config with added_tokens_decoder and add_bos_token) */
    good = gemma_rows(rows, DATA_DIR "/tok/gemma_tiny", NULL, 0, &total);
    fprintf(stderr, "gemma: %d of %d strings give transformers' ids (GemmaTokenizer, tokenizer_config with "
                    "added_tokens_decoder)\n", good, total);
    CHECK(total >= 1300, "gemma.json has %d strings", total);
    /* as transformers 5 saves it, class GemmaTokenizerFast: tokenizer.json's post-processor */
    good = gemma_rows(rows, DATA_DIR "/tok/gemma_tiny_fast", NULL, 0, &total);
    fprintf(stderr, "gemma: %d of %d (GemmaTokenizerFast, tokenizer.json's post-processor and added tokens)\n", good, total);
    /* tokenizer.json alone: its own pipeline (Replace, Split(" "), BPE byte_fallback); no
       config, so no pad token (the file sets no padding) */
    char dir[64];
    if (qwen_folder(dir, DATA_DIR "/tok/gemma_tiny/tokenizer.json", NULL, 0)) {
        good = gemma_rows(rows, dir, NULL, -1, &total);
        fprintf(stderr, "gemma: %d of %d (tokenizer.json alone)\n", good, total);
        rm_folder(dir);
    } else {
        CHECK(0, "tmp folder");
    }
    /* a byte token missing: <unk> for characters with that byte, fused, and a pending
       one after later byte tokens (ids of the tokenizers library) */
    int nb = 0;
    cJSON_ArrayForEach(e, rows) nb += cJSON_GetObjectItemCaseSensitive(e, "nb") != NULL;
    good = gemma_rows(rows, DATA_DIR "/tok/gemma_tiny_nobytes", "nb", -1, &total);
    fprintf(stderr, "gemma: %d of %d (<0x9F> missing; %d strings change)\n", good, total, nb);
    CHECK(nb >= 100, "only %d strings reach the missing byte token", nb);
    gemma_padded(cJSON_GetObjectItemCaseSensitive(g, "padded"), DATA_DIR "/tok/gemma_tiny");
    /* Gemma has no pre-tokenizer: a whole prompt is one BPE word, so merging must not be
       quadratic in its length (a 1 MB prompt, DL_TOK_MAX_TEXT, half of it byte fallback) */
    dl_tokenizer *t = NULL;
    size_t big = DL_TOK_MAX_TEXT, k = 0;
    char *p = malloc(big + 1);
    int32_t *ids = malloc((big + 2) * sizeof *ids);
    if (p && ids && dl_tokenizer_load(&t, DATA_DIR "/tok/gemma_tiny") == DL_OK) {
        static const char *const parts[] = {"a red fox ", "\xf0\x9f\x90\xb1 ", "runs  through ", "\xe6\x9d\xb1 snow, "};
        for (int i = 0; k + 16 < big; i++) {
            size_t l = strlen(parts[i % 4]);
            memcpy(p + k, parts[i % 4], l);
            k += l;
        }
        int n = 0;
        double t0 = dl_now();
        dl_status st = dl_tokenizer_encode_opts(t, p, k, (int)big + 2, 0, ids, &n);
        double dt = dl_now() - t0;
        fprintf(stderr, "gemma: a %zu-byte prompt encodes to %d ids in %.2f s\n", k, n, dt);
        CHECK(st == DL_OK && n > (int)(k / 8) && dt < 10.0, "1 MB Gemma prompt: %s, %d ids, %.2f s", st == DL_OK ? "ok" : dl_last_error(), n, dt);
        dl_tokenizer_free(t);
        t = NULL;
    } else {
        CHECK(0, "1 MB prompt setup: %s", dl_last_error());
    }
    free(p);
    free(ids);
    /* what is not read is refused by name */
    static const char *const no_json[] = {"tokenizer_config.json", "{\"tokenizer_class\": \"GemmaTokenizer\"}",
                                          "tokenizer.model", "x"};
    if (qwen_folder(dir, NULL, no_json, 2)) {
        CHECK(dl_tokenizer_load(&t, dir) == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "tokenizer.json"), "%s",
              dl_last_error());
        rm_folder(dir);
    }
    cJSON_Delete(g);
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
    test_qwen();
    test_gemma();
    cJSON_Delete(g_corpus);
    return test_done("test_text");
}
