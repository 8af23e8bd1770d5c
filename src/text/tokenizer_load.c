/* Reading tokenizer folders: tokenizer.json (the tokenizers library's own format),
 * vocab.json + merges.txt (CLIP, or Qwen2 when tokenizer_config.json says so),
 * spiece.model (a SentencePiece protobuf, parsed field by field), plus
 * tokenizer_config.json / special_tokens_map.json / added_tokens.json for the
 * special tokens. Every error names the file. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "difflet/io.h"
#include "text/text_impl.h"

#define CLIP_PATTERN \
    "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+"
#define QWEN_PATTERN                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
/* Llama 3's: Qwen2's with runs of up to three digits */
#define LLAMA3_PATTERN                                                                                        \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define QWEN_DEFAULT "<|endoftext|>" /* Qwen2Tokenizer's unk, eos and pad when the config names none */
#define META "\xe2\x96\x81"             /* U+2581 ▁ */
enum { MAX_FILE = 64u << 20 };

static dl_status oom(void) { return dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory"); }

static dl_status read_json_file(const char *dir, const char *name, cJSON **out, int required) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *out = NULL;
    if (!dl_file_exists(path))
        return required ? dl_fail(DL_ERR_IO, "`%s` is missing", path) : DL_OK;
    return dl_json_read_object(path, NULL, out);
}

/* A token given as "text" or {"content": "text"} (tokenizer_config.json style). */
static const char *token_text(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static size_t b64_decode(const char *in, uint8_t *out) {
    static const char *tab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (; *in && *in != '='; in++) {
        const char *p = strchr(tab, *in);
        if (!p || !*in) return (size_t)-1;
        acc = (acc << 6) | (uint32_t)(p - tab);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    return n;
}

/* ---- normalizer / pre_tokenizer / post_processor of tokenizer.json ---------------- */

static dl_status add_norm(dl_tokenizer *t, norm_kind k, const char *file) {
    if (t->nnorm == TOK_MAX_NORMS) return dl_fail(DL_ERR_FORMAT, "`%s`: too many normalizers", file);
    t->norms[t->nnorm++] = k;
    return DL_OK;
}

static dl_status parse_normalizer(dl_tokenizer *t, const cJSON *n, const char *file) {
    if (!n || cJSON_IsNull(n)) return DL_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(n, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "?";
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
            dl_status s = parse_normalizer(t, e, file);
            if (s != DL_OK) return s;
        }
        return DL_OK;
    }
    if (!strcmp(type, "NFC")) return add_norm(t, NORM_NFC, file);
    if (!strcmp(type, "NFKC")) return add_norm(t, NORM_NFKC, file);
    if (!strcmp(type, "Lowercase")) return add_norm(t, NORM_LOWER, file);
    if (!strcmp(type, "Strip")) return add_norm(t, NORM_STRIP, file);
    if (!strcmp(type, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(n, "content");
        if (cJSON_IsString(str) && !strcmp(str->valuestring, " ") && cJSON_IsString(content) &&
            !strcmp(content->valuestring, META))
            return add_norm(t, NORM_SPACE_META, file); /* Gemma's */
        if (cJSON_IsString(re) && cJSON_IsString(content) && !strcmp(content->valuestring, " ")) {
            if (!strcmp(re->valuestring, "\\s+")) return add_norm(t, NORM_WS_COLLAPSE, file);
            if (!strcmp(re->valuestring, " {2,}")) return add_norm(t, NORM_SPACES_COLLAPSE, file);
        }
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: Replace normalizer with this pattern is not supported", file);
    }
    if (!strcmp(type, "Precompiled")) {
        const cJSON *cm = cJSON_GetObjectItemCaseSensitive(n, "precompiled_charsmap");
        if (!cJSON_IsString(cm)) return dl_fail(DL_ERR_FORMAT, "`%s`: Precompiled normalizer without a charsmap", file);
        size_t cap = strlen(cm->valuestring) / 4 * 3 + 4;
        uint8_t *blob = malloc(cap);
        if (!blob) return oom();
        size_t len = b64_decode(cm->valuestring, blob);
        dl_status s = len == (size_t)-1 ? dl_fail(DL_ERR_FORMAT, "`%s`: precompiled_charsmap is not base64", file)
                                         : dl_charsmap_parse(&t->cm, blob, len);
        free(blob);
        if (s != DL_OK) return dl_fail(s, "`%s`: %s", file, dl_last_error());
        return add_norm(t, NORM_PRECOMPILED, file);
    }
    return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: normalizer type \"%s\" is not supported", file, type);
}

static dl_status parse_metaspace(dl_tokenizer *t, const cJSON *p, const char *file) {
    const cJSON *rep = cJSON_GetObjectItemCaseSensitive(p, "replacement");
    if (cJSON_IsString(rep) && strcmp(rep->valuestring, "\xe2\x96\x81"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: Metaspace replacement other than U+2581 is not supported", file);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme");
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(p, "split");
    t->metaspace = 1;
    t->meta_prepend = 2;
    if (cJSON_IsString(ps))
        t->meta_prepend = !strcmp(ps->valuestring, "never") ? 0 : !strcmp(ps->valuestring, "first") ? 1 : 2;
    else if (cJSON_IsFalse(aps))
        t->meta_prepend = 0;
    t->meta_split = split ? cJSON_IsTrue(split) : 1;
    return DL_OK;
}

static dl_status parse_pretok(dl_tokenizer *t, const cJSON *p, const char *file) {
    if (!p || cJSON_IsNull(p)) return DL_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "?";
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) {
            dl_status s = parse_pretok(t, e, file);
            if (s != DL_OK) return s;
        }
        return DL_OK;
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        t->ws_split = 1;
        return DL_OK;
    }
    if (!strcmp(type, "Metaspace")) return parse_metaspace(t, p, file);
    if (!strcmp(type, "ByteLevel")) {
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
        if (cJSON_IsTrue(aps))
            return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: ByteLevel with add_prefix_space is not supported", file);
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        t->byte_level = 1;
        t->byte_level_regex = !cJSON_IsFalse(re);
        return DL_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "String");
        const cJSON *inv = cJSON_GetObjectItemCaseSensitive(p, "invert");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (cJSON_IsString(str) && !strcmp(str->valuestring, " ") && !cJSON_IsTrue(inv) && cJSON_IsString(beh) &&
            !strcmp(beh->valuestring, "MergedWithPrevious")) { /* Gemma's */
            t->space_split = 1;
            return DL_OK;
        }
        if (cJSON_IsString(re) && !strcmp(re->valuestring, CLIP_PATTERN) && cJSON_IsTrue(inv) &&
            cJSON_IsString(beh) && !strcmp(beh->valuestring, "Removed")) {
            t->clip_split = 1;
            return DL_OK;
        }
        const int qwen = cJSON_IsString(re) && !strcmp(re->valuestring, QWEN_PATTERN);
        const int llama3 = cJSON_IsString(re) && !strcmp(re->valuestring, LLAMA3_PATTERN);
        if ((qwen || llama3) && cJSON_IsFalse(inv) && cJSON_IsString(beh) && !strcmp(beh->valuestring, "Isolated")) {
            t->qwen_split = 1;
            t->split_digits = llama3 ? 3 : 1;
            return DL_OK;
        }
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "`%s`: Split pre-tokenizer with a pattern other than CLIP's, Qwen2's, Llama 3's or Gemma's is not supported",
                       file);
    }
    return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pre-tokenizer type \"%s\" is not supported", file, type);
}

/* a token id in a file: -1 unless a number in 0..1e9 */
static int32_t json_id(const cJSON *j) {
    return cJSON_IsNumber(j) && j->valuedouble >= 0 && j->valuedouble <= 1e9 ? (int32_t)j->valuedouble : -1;
}

static int32_t special_id(const cJSON *specials, const char *name) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name), "ids");
    return json_id(cJSON_GetArrayItem(ids, 0));
}

static dl_status parse_post(dl_tokenizer *t, const cJSON *p, const char *file) {
    t->bos = t->eos = -1;
    if (!p || cJSON_IsNull(p)) return DL_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "?";
    if (!strcmp(type, "ByteLevel")) return DL_OK; /* it only moves offsets */
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "cls"), 1);
        const cJSON *sep = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "sep"), 1);
        if (json_id(cls) < 0 || json_id(sep) < 0) return dl_fail(DL_ERR_FORMAT, "`%s`: %s without cls/sep ids", file, type);
        t->bos = json_id(cls);
        t->eos = json_id(sep);
        return DL_OK;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens"), *e;
        int seen_a = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "single")) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
            if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
                seen_a = 1;
                continue;
            }
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
            if (!cJSON_IsString(id)) return dl_fail(DL_ERR_FORMAT, "`%s`: bad TemplateProcessing entry", file);
            int32_t v = special_id(specials, id->valuestring);
            if (v < 0) return dl_fail(DL_ERR_FORMAT, "`%s`: special token `%s` has no id", file, id->valuestring);
            if (seen_a) t->eos = v;
            else t->bos = v;
        }
        return DL_OK;
    }
    return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: post-processor type \"%s\" is not supported", file, type);
}

/* ---- the models -------------------------------------------------------------------- */

static dl_status vocab_from_json(const cJSON *vj, dl_strmap **out, int32_t *size, const char *file) {
    if (!cJSON_IsObject(vj)) return dl_fail(DL_ERR_FORMAT, "`%s`: the vocabulary is not a JSON object", file);
    *out = dl_strmap_new((size_t)cJSON_GetArraySize(vj));
    if (!*out) return oom();
    const cJSON *e;
    int32_t mx = -1;
    cJSON_ArrayForEach(e, vj) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e9) {
            dl_strmap_free(*out);
            *out = NULL;
            return dl_fail(DL_ERR_FORMAT, "`%s`: vocabulary entry `%s` has no valid id", file, e->string);
        }
        int32_t id = (int32_t)e->valuedouble;
        if (dl_strmap_put(*out, e->string, strlen(e->string), id) != DL_OK) return oom();
        if (id > mx) mx = id;
    }
    *size = mx + 1;
    return DL_OK;
}

static dl_status make_bpe(dl_tokenizer *t, dl_strmap *vocab, char **merges, size_t nm, const char *unk,
                          const char *suffix) {
    int32_t unk_id = -1;
    if (unk) dl_strmap_get(vocab, unk, strlen(unk), &unk_id);
    t->kind = DL_TOK_BPE;
    return dl_bpe_new(&t->bpe, vocab, merges, nm, unk_id, suffix);
}

/* tokenizer.json's model. `rebuilt`: only the vocabulary and merges are taken, as a
 * class that rebuilds its pipeline does (Qwen2: no unknown token, no suffix). */
static dl_status model_from_json(dl_tokenizer *t, const cJSON *m, const char *file, int rebuilt) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(m, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : "?";
    if (!strcmp(type, "BPE")) {
        dl_strmap *vocab;
        dl_status s = vocab_from_json(cJSON_GetObjectItemCaseSensitive(m, "vocab"), &vocab, &t->vocab_size, file);
        if (s != DL_OK) return s;
        const cJSON *mj = cJSON_GetObjectItemCaseSensitive(m, "merges"), *e;
        size_t nm = (size_t)cJSON_GetArraySize(mj), i = 0;
        char **merges = calloc(nm + 1, sizeof *merges);
        if (!merges) {
            dl_strmap_free(vocab);
            return oom();
        }
        cJSON_ArrayForEach(e, mj) { /* "a b" or ["a", "b"] */
            if (cJSON_IsString(e)) {
                merges[i] = strdup(e->valuestring);
            } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                       cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
                const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
                merges[i] = malloc(strlen(a) + strlen(b) + 2);
                if (merges[i]) sprintf(merges[i], "%s %s", a, b);
            } else {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: merge %zu is neither \"a b\" nor [a, b]", file, i);
                break;
            }
            if (!merges[i++]) {
                s = oom();
                break;
            }
        }
        const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
        const cJSON *suf = cJSON_GetObjectItemCaseSensitive(m, "end_of_word_suffix");
        const cJSON *pre = cJSON_GetObjectItemCaseSensitive(m, "continuing_subword_prefix");
        if (rebuilt) unk = suf = pre = NULL;
        if (s == DL_OK && cJSON_IsString(pre) && *pre->valuestring)
            s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: BPE continuing_subword_prefix is not supported", file);
        if (s == DL_OK) {
            s = make_bpe(t, vocab, merges, i, cJSON_IsString(unk) ? unk->valuestring : NULL,
                         cJSON_IsString(suf) ? suf->valuestring : "");
            if (s == DL_OK && !rebuilt)
                dl_bpe_set_opts(t->bpe, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "byte_fallback")),
                                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "fuse_unk")),
                                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "ignore_merges")));
        } else {
            dl_strmap_free(vocab);
        }
        for (size_t k = 0; k < nm; k++) free(merges[k]);
        free(merges);
        return s;
    }
    if (!strcmp(type, "Unigram")) {
        const cJSON *vj = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *e;
        const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_id");
        const cJSON *bf = cJSON_GetObjectItemCaseSensitive(m, "byte_fallback");
        if (cJSON_IsTrue(bf)) return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: Unigram byte_fallback is not supported", file);
        int32_t n = cJSON_GetArraySize(vj), i = 0;
        char **pieces = calloc((size_t)n + 1, sizeof *pieces);
        double *scores = calloc((size_t)n + 1, sizeof *scores);
        dl_status s = pieces && scores ? DL_OK : oom();
        cJSON_ArrayForEach(e, vj) {
            if (s != DL_OK) break;
            const cJSON *p = cJSON_GetArrayItem(e, 0), *sc = cJSON_GetArrayItem(e, 1);
            if (!cJSON_IsString(p) || !cJSON_IsNumber(sc)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: Unigram vocab entry %d is not [piece, score]", file, i);
                break;
            }
            pieces[i] = p->valuestring; /* borrowed: dl_unigram_new copies */
            scores[i++] = sc->valuedouble;
        }
        t->kind = DL_TOK_UNIGRAM;
        t->vocab_size = n;
        if (s == DL_OK) s = dl_unigram_new(&t->uni, pieces, scores, n, cJSON_IsNumber(unk) ? (int32_t)unk->valuedouble : -1);
        free(pieces);
        free(scores);
        return s;
    }
    return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: model type \"%s\" is not supported (BPE, Unigram)", file, type);
}

static int32_t vocab_id(const dl_tokenizer *t, const char *tok) {
    if (!tok) return -1;
    int32_t id = -1;
    if (t->kind == DL_TOK_BPE) dl_strmap_get(dl_bpe_vocab(t->bpe), tok, strlen(tok), &id);
    else id = dl_unigram_id(t->uni, tok);
    return id;
}

/* pad token: tokenizer_config.json / special_tokens_map.json, else `fallback` */
static void set_pad(dl_tokenizer *t, const cJSON *cfg, const cJSON *smap, int32_t fallback) {
    const char *p = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "pad_token"));
    if (!p) p = token_text(cJSON_GetObjectItemCaseSensitive(smap, "pad_token"));
    int32_t id = vocab_id(t, p);
    for (int i = 0; id < 0 && p && i < t->nadded; i++)
        if (!strcmp(t->added[i].s, p)) id = t->added[i].id;
    t->pad = id >= 0 ? id : fallback;
}

static dl_status load_tokenizer_json(dl_tokenizer *t, const char *dir, const cJSON *cfg, const cJSON *smap) {
    char file[4096];
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    cJSON *tj;
    dl_status s = read_json_file(dir, "tokenizer.json", &tj, 1);
    if (s != DL_OK) return s;
    s = model_from_json(t, cJSON_GetObjectItemCaseSensitive(tj, "model"), file, 0);
    if (s == DL_OK) s = parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(tj, "normalizer"), file);
    if (s == DL_OK) s = parse_pretok(t, cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer"), file);
    if (s == DL_OK) s = parse_post(t, cJSON_GetObjectItemCaseSensitive(tj, "post_processor"), file);
    if (s == DL_OK && t->qwen_split && t->byte_level_regex)
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: Qwen2's Split followed by ByteLevel with use_regex is not supported", file);
    if (s == DL_OK && t->space_split && (t->qwen_split || t->clip_split || t->byte_level || t->metaspace || t->ws_split))
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: Split(\" \") with another pre-tokenizer is not supported", file);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tj, "added_tokens")) {
        if (s != DL_OK) break;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content"), *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *norm = cJSON_GetObjectItemCaseSensitive(e, "normalized");
        if (!cJSON_IsString(c) || json_id(id) < 0) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: bad added_tokens entry", file);
            break;
        }
        s = dl_tok_add_token(t, c->valuestring, json_id(id), cJSON_IsTrue(norm),
                             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip")),
                             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip")),
                             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "single_word")));
    }
    if (s == DL_OK) {
        const cJSON *padj = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "padding"), "pad_id");
        set_pad(t, cfg, smap, json_id(padj) >= 0 ? json_id(padj) : t->eos);
    }
    cJSON_Delete(tj);
    return s;
}

/* vocab.json + merges.txt into *vocab (t->vocab_size set) and *merges[0..*nm),
 * lines borrowed from *txt: free both (not the lines) after dl_bpe_new. */
static dl_status read_vocab_merges(dl_tokenizer *t, const char *dir, dl_strmap **vocab, char ***merges, size_t *nm,
                                   char **txt) {
    char file[4096];
    snprintf(file, sizeof file, "%s/vocab.json", dir);
    cJSON *vj;
    dl_status s = read_json_file(dir, "vocab.json", &vj, 1);
    if (s != DL_OK) return s;
    s = vocab_from_json(vj, vocab, &t->vocab_size, file);
    cJSON_Delete(vj);
    if (s != DL_OK) return s;
    snprintf(file, sizeof file, "%s/merges.txt", dir);
    size_t len;
    if ((s = dl_file_read(file, MAX_FILE, txt, &len)) != DL_OK) {
        dl_strmap_free(*vocab);
        return s;
    }
    size_t cap = 1;
    *nm = 0;
    for (size_t i = 0; i < len; i++) cap += (*txt)[i] == '\n';
    if (!(*merges = calloc(cap + 1, sizeof **merges))) {
        free(*txt);
        dl_strmap_free(*vocab);
        return oom();
    }
    for (char *line = strtok(*txt, "\n"); line; line = strtok(NULL, "\n")) {
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[--l] = 0;
        if (!l || !strncmp(line, "#version", 8)) continue;
        (*merges)[(*nm)++] = line;
    }
    return DL_OK;
}

/* CLIP: vocab.json + merges.txt with CLIP's fixed pipeline. */
static dl_status load_clip_files(dl_tokenizer *t, const char *dir, const cJSON *cfg, const cJSON *smap) {
    dl_strmap *vocab;
    char **merges, *txt;
    size_t nm;
    dl_status s = read_vocab_merges(t, dir, &vocab, &merges, &nm, &txt);
    if (s != DL_OK) return s;
    const char *unk = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "unk_token"));
    const char *bos = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
    const char *eos = token_text(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
    if (!bos) bos = token_text(cJSON_GetObjectItemCaseSensitive(smap, "bos_token"));
    if (!eos) eos = token_text(cJSON_GetObjectItemCaseSensitive(smap, "eos_token"));
    s = make_bpe(t, vocab, merges, nm, unk ? unk : "<|endoftext|>", "</w>");
    free(merges);
    free(txt);
    if (s != DL_OK) return s;
    t->norms[0] = NORM_NFC, t->norms[1] = NORM_WS_COLLAPSE, t->norms[2] = NORM_LOWER;
    t->nnorm = 3;
    t->clip_split = t->byte_level = 1;
    t->bos = vocab_id(t, bos ? bos : "<|startoftext|>");
    t->eos = vocab_id(t, eos ? eos : "<|endoftext|>");
    if (t->bos < 0 || t->eos < 0) return dl_fail(DL_ERR_FORMAT, "`%s/vocab.json`: BOS/EOS tokens are not in the vocabulary", dir);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder")) {
        const char *c = token_text(e);
        if (c && (s = dl_tok_add_special(t, c, (int32_t)atoi(e->string))) != DL_OK) return s;
    }
    if ((s = dl_tok_add_special(t, bos ? bos : "<|startoftext|>", t->bos)) != DL_OK) return s;
    if ((s = dl_tok_add_special(t, eos ? eos : "<|endoftext|>", t->eos)) != DL_OK) return s;
    set_pad(t, cfg, smap, t->eos);
    return DL_OK;
}

/* ---- Qwen2Tokenizer, GemmaTokenizer -----------------------------------------------------
 * GemmaTokenizer is built the same way, with its own pipeline (Replace(" ", "▁"), BPE
 * with byte fallback), tokenizer.json only, and no plain re-adding of special tokens;
 * add_bos_token / add_eos_token in its config replace tokenizer.json's post-processor.
 * Qwen2Tokenizer:
 * transformers 5 builds the pipeline from the class whatever the files say: NFC, Qwen2's
 * Split, ByteLevel without its own pattern, BPE without an unknown token or suffix; of
 * a tokenizer.json it keeps only the vocabulary, merges and post-processor. The added
 * tokens are added in transformers' order, each taking its vocabulary id or the next
 * free one (max(vocabulary entries, highest added id + 1)), whatever id the files give:
 *   the `added_tokens_decoder` of tokenizer_config.json, else added_tokens.json and
 *   tokenizer.json's added_tokens, sorted by id; then the named special tokens (bos,
 *   eos, unk, sep, pad, cls, mask, then other `*_token` keys); then the extra ones.
 * The named and extra special tokens end up without flags (no strip, not normalized). */

typedef struct {
    int64_t id; /* the id the files give: it only orders the tokens */
    size_t seq; /* the order read, breaking ties of id */
    const char *s;
    int normalized, lstrip, rstrip, single_word;
} qtok;

typedef struct {
    qtok *v;
    size_t n, cap;
} qtoks;

static int qtoks_push(qtoks *q, qtok x) {
    if (q->n == q->cap) {
        size_t c = q->cap ? 2 * q->cap : 32;
        qtok *p = realloc(q->v, c * sizeof *p);
        if (!p) return 0;
        q->v = p, q->cap = c;
    }
    q->v[q->n++] = x;
    return 1;
}

/* An AddedToken given as a string (special: not normalized) or as a dict of its fields
 * (normalized defaults to !special, special to `special`). 0 when it is neither. */
static int qtok_of(const cJSON *j, int special, qtok *o) {
    memset(o, 0, sizeof *o);
    if (cJSON_IsString(j)) {
        o->s = j->valuestring;
        o->normalized = !special;
        return 1;
    }
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    if (!cJSON_IsObject(j) || !cJSON_IsString(c)) return 0;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "special"), *nm = cJSON_GetObjectItemCaseSensitive(j, "normalized");
    if (cJSON_IsBool(sp)) special = cJSON_IsTrue(sp);
    o->s = c->valuestring;
    o->normalized = cJSON_IsBool(nm) ? cJSON_IsTrue(nm) : !special;
    o->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "lstrip"));
    o->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "rstrip"));
    o->single_word = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "single_word"));
    return 1;
}

static int cmp_qtok(const void *a, const void *b) {
    const qtok *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int32_t added_id(const dl_tokenizer *t, const char *s) {
    for (int i = 0; s && i < t->nadded; i++)
        if (!strcmp(t->added[i].s, s)) return t->added[i].id;
    return -1;
}

/* The tokenizers library's add_tokens for one token. */
static dl_status qwen_add(dl_tokenizer *t, const qtok *q, int32_t nvocab, int32_t *max_id) {
    if (!q->s || !*q->s || added_id(t, q->s) >= 0) return DL_OK;
    int32_t id = vocab_id(t, q->s);
    if (id < 0) id = *max_id >= nvocab ? *max_id + 1 : nvocab;
    if (id > *max_id) *max_id = id;
    return dl_tok_add_token(t, q->s, id, q->normalized, q->lstrip, q->rstrip, q->single_word);
}

static const char *const NAMED[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
enum { NNAMED = 7 };

/* A class whose pipeline transformers 5 rebuilds: its name and defaults for NAMED. */
typedef struct {
    const char *name;
    const char *defaults[NNAMED];
    int gemma; /* GemmaTokenizer, else Qwen2Tokenizer */
} rebuilt_class;

static const rebuilt_class QWEN2 = {"Qwen2Tokenizer", {NULL, QWEN_DEFAULT, QWEN_DEFAULT, NULL, QWEN_DEFAULT, NULL, NULL}, 0};
static const rebuilt_class GEMMA = {"GemmaTokenizer", {"<bos>", "<eos>", "<unk>", NULL, "<pad>", NULL, "<mask>"}, 1};

/* Named special token k: the config's, special_tokens_map.json's over it when the
 * config has no added_tokens_decoder, the class default where neither names one;
 * q->s NULL when there is none. */
static dl_status qwen_named(const char *dir, const cJSON *cfg, const cJSON *smap, int have_atd, int k, const rebuilt_class *rc,
                            qtok *q) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, NAMED[k]);
    const cJSON *sv = have_atd ? NULL : cJSON_GetObjectItemCaseSensitive(smap, NAMED[k]);
    memset(q, 0, sizeof *q);
    if (sv) v = sv;
    if (!v && rc->defaults[k]) q->s = rc->defaults[k];
    else if (v && !cJSON_IsNull(v) && !qtok_of(v, 1, q))
        return dl_fail(DL_ERR_FORMAT, "`%s/tokenizer_config.json`: %s is neither a string nor a token", dir, NAMED[k]);
    return DL_OK;
}

static int32_t token_id(const dl_tokenizer *t, const char *s) {
    int32_t id = added_id(t, s);
    return id >= 0 ? id : vocab_id(t, s);
}

static dl_status load_rebuilt(dl_tokenizer *t, const char *dir, const cJSON *cfg, const cJSON *smap, int from_json,
                              const rebuilt_class *rc) {
    char file[4200];
    cJSON *tj = NULL, *atj = NULL;
    qtoks dec = {0}, named = {0}, extra = {0};
    dl_status s = DL_OK;
    snprintf(file, sizeof file, "%s/tokenizer_config.json", dir);
    if (!rc->gemma && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_prefix_space")))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: Qwen2Tokenizer with add_prefix_space is not supported", file);
    if (rc->gemma && !from_json)
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: GemmaTokenizer needs tokenizer.json (tokenizer.model alone is not supported)",
                       file);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "split_special_tokens")))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: split_special_tokens is not supported", file);
    if (from_json) {
        snprintf(file, sizeof file, "%s/tokenizer.json", dir);
        if ((s = read_json_file(dir, "tokenizer.json", &tj, 1)) != DL_OK) return s;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(tj, "model");
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
        if (!type || strcmp(type, "BPE"))
            s = dl_fail(DL_ERR_FORMAT, "`%s`: %s needs a BPE model, not \"%s\"", file, rc->name, type ? type : "?");
        if (s == DL_OK) s = model_from_json(t, m, file, 1);
        if (s == DL_OK) s = parse_post(t, cJSON_GetObjectItemCaseSensitive(tj, "post_processor"), file);
    } else {
        dl_strmap *vocab;
        char **merges, *txt;
        size_t nm;
        if ((s = read_vocab_merges(t, dir, &vocab, &merges, &nm, &txt)) != DL_OK) return s;
        s = make_bpe(t, vocab, merges, nm, NULL, "");
        free(merges);
        free(txt);
    }
    if (s == DL_OK) s = read_json_file(dir, "added_tokens.json", &atj, 0);
    if (s != DL_OK) goto done;
    t->clip_split = t->ws_split = t->metaspace = 0;
    if (rc->gemma) {
        /* GemmaTokenizer: Replace(" ", "▁"), Split(" ", merged_with_previous), BPE with
           byte_fallback and fuse_unk and the config's unknown token */
        t->norms[0] = NORM_SPACE_META;
        t->nnorm = 1;
        t->space_split = 1;
        qtok unk;
        int atd = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder") != NULL;
        if ((s = qwen_named(dir, cfg, smap, atd, 2, rc, &unk)) != DL_OK) goto done;
        dl_bpe_set_opts(t->bpe, 1, 1, 0);
        dl_bpe_set_unk(t->bpe, vocab_id(t, unk.s));
    } else {
        t->norms[0] = NORM_NFC;
        t->nnorm = 1;
        t->qwen_split = t->byte_level = 1;
        t->split_digits = 1;
    }

    /* named special tokens: the config's (special_tokens_map.json's over them when the
       config has no added_tokens_decoder), the class's defaults where neither names one */
    const cJSON *atd = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder"), *e;
    int have_atd = atd != NULL;
    for (int k = 0; k < NNAMED && s == DL_OK; k++) {
        qtok q;
        s = qwen_named(dir, cfg, smap, have_atd, k, rc, &q);
        if (s == DL_OK && q.s && !qtoks_push(&named, q)) s = oom();
    }
    cJSON_ArrayForEach(e, cfg) { /* model-specific named tokens: other "*_token" strings */
        size_t l = e->string ? strlen(e->string) : 0;
        int std = 0;
        for (int k = 0; k < NNAMED; k++) std |= !strcmp(e->string, NAMED[k]);
        qtok q = {0};
        if (s == DL_OK && !std && l > 6 && !strcmp(e->string + l - 6, "_token") && cJSON_IsString(e) && qtok_of(e, 1, &q) &&
            !qtoks_push(&named, q))
            s = oom();
    }
    /* extra special tokens: extra_special_tokens, else additional_special_tokens */
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(cfg, "extra_special_tokens");
    if (!cJSON_GetArraySize(ex)) ex = cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens");
    if (!ex && !have_atd) ex = cJSON_GetObjectItemCaseSensitive(smap, "additional_special_tokens");
    const cJSON *exs[2] = {ex, have_atd ? NULL : cJSON_GetObjectItemCaseSensitive(smap, "extra_special_tokens")};
    for (int a = 0; a < 2 && s == DL_OK; a++)
        cJSON_ArrayForEach(e, exs[a]) { /* a dict of them: named tokens */
            qtok q;
            if (!qtok_of(e, 1, &q)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s/tokenizer_config.json`: an extra special token is neither a string nor a token", dir);
                break;
            }
            if (!qtoks_push(cJSON_IsObject(exs[a]) ? &named : &extra, q)) s = oom();
        }
    /* the added tokens the files list with their ids */
    if (have_atd) {
        cJSON_ArrayForEach(e, atd) {
            qtok q;
            if (s != DL_OK) break;
            if (!qtok_of(e, 0, &q) || cJSON_IsString(e)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s/tokenizer_config.json`: added_tokens_decoder entry `%s` is not a token", dir,
                            e->string);
                break;
            }
            q.id = strtoll(e->string, NULL, 10);
            q.seq = dec.n;
            if (!qtoks_push(&dec, q)) s = oom();
        }
    } else {
        cJSON_ArrayForEach(e, atj) { /* added_tokens.json: normalized unless special */
            if (s != DL_OK) break;
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e9) {
                s = dl_fail(DL_ERR_FORMAT, "`%s/added_tokens.json`: `%s` has no valid id", dir, e->string);
                break;
            }
            int special = 0;
            for (size_t i = 0; i < named.n; i++) special |= !strcmp(named.v[i].s, e->string);
            for (size_t i = 0; i < extra.n; i++) special |= !strcmp(extra.v[i].s, e->string);
            qtok q = {(int64_t)e->valuedouble, dec.n, e->string, !special, 0, 0, 0};
            if (!qtoks_push(&dec, q)) s = oom();
        }
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tj, "added_tokens")) {
            qtok q;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
            if (s != DL_OK) break;
            if (!qtok_of(e, 0, &q) || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e9) {
                s = dl_fail(DL_ERR_FORMAT, "`%s/tokenizer.json`: bad added_tokens entry", dir);
                break;
            }
            q.id = (int64_t)id->valuedouble;
            q.seq = dec.n;
            if (!qtoks_push(&dec, q)) s = oom();
        }
    }
    if (s != DL_OK) goto done;
    /* by id; of two with the same id the later (tokenizer.json's) wins */
    if (dec.n) qsort(dec.v, dec.n, sizeof *dec.v, cmp_qtok);
    int32_t nvocab = (int32_t)dl_strmap_count(dl_bpe_vocab(t->bpe)), max_id = -1;
    for (size_t i = 0; i < dec.n && s == DL_OK; i++)
        if (i + 1 == dec.n || dec.v[i + 1].id != dec.v[i].id) s = qwen_add(t, &dec.v[i], nvocab, &max_id);
    for (size_t i = 0; i < named.n && s == DL_OK; i++) s = qwen_add(t, &named.v[i], nvocab, &max_id);
    for (size_t i = 0; i < extra.n && s == DL_OK; i++) s = qwen_add(t, &extra.v[i], nvocab, &max_id);
    if (s != DL_OK) goto done;
    /* Qwen2Tokenizer's own last step adds every named and extra special token again as
       a plain special token, which keeps its id but replaces its flags */
    for (int a = 0; a < t->nadded && !rc->gemma; a++) {
        int plain = 0;
        for (size_t i = 0; i < named.n; i++) plain |= !strcmp(named.v[i].s, t->added[a].s);
        for (size_t i = 0; i < extra.n; i++) plain |= !strcmp(extra.v[i].s, t->added[a].s);
        if (plain) t->added[a].normalized = t->added[a].lstrip = t->added[a].rstrip = t->added[a].single_word = 0;
    }
    if (max_id + 1 > t->vocab_size) t->vocab_size = max_id + 1;
    /* pad; BOS / EOS only when the config asks (the post-processor transformers builds) */
    qtok bos, eos, pad;
    qwen_named(dir, cfg, smap, have_atd, 0, rc, &bos);
    qwen_named(dir, cfg, smap, have_atd, 1, rc, &eos);
    qwen_named(dir, cfg, smap, have_atd, 4, rc, &pad);
    t->pad = token_id(t, pad.s);
    /* GemmaTokenizer: add_bos_token / add_eos_token in the config make the post-processor
       (either missing is false); without both, tokenizer.json's stays */
    int explicit = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token") || cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (!from_json || (rc->gemma && explicit)) {
        t->bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token")) ? token_id(t, bos.s) : -1;
        t->eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token")) ? token_id(t, eos.s) : -1;
    }
done:
    free(dec.v), free(named.v), free(extra.v);
    cJSON_Delete(tj);
    cJSON_Delete(atj);
    return s;
}

/* ---- spiece.model: protobuf wire format, only the fields used -------------------- */

typedef struct {
    const uint8_t *p, *end;
} pb;

static int pb_varint(pb *b, uint64_t *v) {
    *v = 0;
    for (int sh = 0; sh < 64 && b->p < b->end; sh += 7) {
        uint8_t c = *b->p++;
        *v |= (uint64_t)(c & 0x7f) << sh;
        if (!(c & 0x80)) return 1;
    }
    return 0;
}

/* Next field: number, wire type, and for length-delimited a sub-buffer; fixed32
 * values land in *v. Returns 0 at the end, -1 on malformed input. */
static int pb_next(pb *b, uint32_t *field, uint32_t *wt, uint64_t *v, pb *sub) {
    if (b->p >= b->end) return 0;
    uint64_t key;
    if (!pb_varint(b, &key)) return -1;
    *field = (uint32_t)(key >> 3);
    *wt = (uint32_t)(key & 7);
    switch (*wt) {
    case 0: return pb_varint(b, v) ? 1 : -1;
    case 1:
        if (b->end - b->p < 8) return -1;
        b->p += 8;
        return 1;
    case 2:
        if (!pb_varint(b, v) || *v > (uint64_t)(b->end - b->p)) return -1;
        sub->p = b->p;
        sub->end = b->p + *v;
        b->p += *v;
        return 1;
    case 5:
        if (b->end - b->p < 4) return -1;
        *v = (uint64_t)b->p[0] | (uint64_t)b->p[1] << 8 | (uint64_t)b->p[2] << 16 | (uint64_t)b->p[3] << 24;
        b->p += 4;
        return 1;
    }
    return -1;
}

static dl_status load_spiece(dl_tokenizer *t, const char *dir, const cJSON *cfg, const cJSON *smap) {
    char file[4096];
    snprintf(file, sizeof file, "%s/spiece.model", dir);
    char *data;
    size_t len;
    dl_status s = dl_file_read(file, MAX_FILE, &data, &len);
    if (s != DL_OK) return s;
    pb b = {(const uint8_t *)data, (const uint8_t *)data + len}, sub, sub2;
    uint32_t f, wt, f2, wt2;
    uint64_t v, v2;
    int r, n = 0, cap = 0, type_ok = 1;
    char **pieces = NULL;
    double *scores = NULL;
    int *types = NULL;
    int64_t unk = 0, eos = 2, pad = -1, model_type = 1;
    while ((r = pb_next(&b, &f, &wt, &v, &sub)) > 0) {
        if (f == 1 && wt == 2) { /* SentencePiece { piece = 1; score = 2; type = 3 } */
            if (n == cap) {
                cap = cap ? 2 * cap : 1024;
                char **np = realloc(pieces, (size_t)cap * sizeof *np);
                double *ns = realloc(scores, (size_t)cap * sizeof *ns);
                int *nt = realloc(types, (size_t)cap * sizeof *nt);
                if (np) pieces = np;
                if (ns) scores = ns;
                if (nt) types = nt;
                if (!np || !ns || !nt) {
                    s = oom();
                    break;
                }
            }
            pieces[n] = NULL, scores[n] = 0, types[n] = 1;
            while ((r = pb_next(&sub, &f2, &wt2, &v2, &sub2)) > 0) {
                if (f2 == 1 && wt2 == 2) {
                    free(pieces[n]);
                    pieces[n] = strndup((const char *)sub2.p, (size_t)(sub2.end - sub2.p));
                } else if (f2 == 2 && wt2 == 5) {
                    uint32_t u = (uint32_t)v2;
                    float fl;
                    memcpy(&fl, &u, 4);
                    scores[n] = fl;
                } else if (f2 == 3 && wt2 == 0) {
                    types[n] = (int)v2;
                }
            }
            if (r < 0 || !pieces[n]) {
                free(pieces[n]);
                s = r < 0 ? dl_fail(DL_ERR_FORMAT, "`%s`: malformed piece %d", file, n) : oom();
                break;
            }
            n++;
        } else if (f == 2 && wt == 2) { /* TrainerSpec */
            while ((r = pb_next(&sub, &f2, &wt2, &v2, &sub2)) > 0) {
                if (wt2 != 0) continue;
                if (f2 == 3) model_type = (int64_t)v2;
                if (f2 == 40) unk = (int32_t)v2;
                if (f2 == 42) eos = (int32_t)v2;
                if (f2 == 43) pad = (int32_t)v2;
            }
            if (r < 0) s = dl_fail(DL_ERR_FORMAT, "`%s`: malformed trainer_spec", file);
        } else if (f == 3 && wt == 2) { /* NormalizerSpec: precompiled_charsmap = 2 */
            while ((r = pb_next(&sub, &f2, &wt2, &v2, &sub2)) > 0)
                if (f2 == 2 && wt2 == 2 && sub2.end > sub2.p) {
                    dl_charsmap_free(&t->cm);
                    s = dl_charsmap_parse(&t->cm, sub2.p, (size_t)(sub2.end - sub2.p));
                    if (s != DL_OK) s = dl_fail(s, "`%s`: %s", file, dl_last_error());
                }
            if (r < 0 && s == DL_OK) s = dl_fail(DL_ERR_FORMAT, "`%s`: malformed normalizer_spec", file);
        }
        if (s != DL_OK) break;
    }
    if (s == DL_OK && r < 0) s = dl_fail(DL_ERR_FORMAT, "`%s`: not a SentencePiece model (bad protobuf)", file);
    if (s == DL_OK && (n == 0 || model_type != 1))
        s = dl_fail(DL_ERR_FORMAT, "`%s`: not a Unigram SentencePiece model", file);
    if (s == DL_OK && (unk < 0 || unk >= n || eos >= n || pad >= n))
        s = dl_fail(DL_ERR_FORMAT, "`%s`: special token ids out of range", file);
    if (s == DL_OK) {
        t->kind = DL_TOK_UNIGRAM;
        t->vocab_size = n;
        s = dl_unigram_new(&t->uni, pieces, scores, n, (int32_t)unk);
    }
    if (s == DL_OK) { /* the pipeline transformers builds for a SentencePiece T5 model */
        if (t->cm.nunits) t->norms[t->nnorm++] = NORM_PRECOMPILED;
        t->ws_split = t->metaspace = t->meta_split = 1;
        t->meta_prepend = 2;
        t->bos = -1;
        t->eos = (int32_t)eos;
        for (int i = 0; i < n && s == DL_OK; i++) /* control and unknown pieces are special */
            if (types[i] == 2 || types[i] == 3) s = dl_tok_add_special(t, pieces[i], i);
        /* T5's sentinels, as transformers' T5Tokenizer adds them: `extra_ids` (100 when
           the config does not say) tokens <extra_id_i> after the model's pieces, numbered
           from the top (<extra_id_0> is the last id) */
        const cJSON *ex = cJSON_GetObjectItemCaseSensitive(cfg, "extra_ids");
        const char *cls = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class"));
        int extra = cJSON_IsNumber(ex) ? (int)ex->valuedouble : cls && !strncmp(cls, "T5Tokenizer", 11) ? 100 : 0;
        if (extra < 0 || extra > 1000) s = dl_fail(DL_ERR_FORMAT, "`%s`: extra_ids %d is outside 0..1000", file, extra);
        for (int i = 0; i < extra && s == DL_OK; i++) {
            char sent[32];
            snprintf(sent, sizeof sent, "<extra_id_%d>", i);
            s = dl_tok_add_special(t, sent, n + extra - 1 - i);
        }
        if (s == DL_OK) t->vocab_size = n + extra;
        set_pad(t, cfg, smap, pad >= 0 ? (int32_t)pad : 0);
    }
    (void)type_ok;
    for (int i = 0; i < n; i++) free(pieces[i]);
    free(pieces), free(scores), free(types);
    free(data);
    return s;
}

dl_status dl_tokenizer_load(dl_tokenizer **out, const char *dir) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    if (!dl_file_exists(path)) return dl_fail(DL_ERR_IO, "tokenizer folder `%s` does not exist", dir);
    dl_tokenizer *t = dl_tok_alloc();
    if (!t) return oom();
    cJSON *cfg = NULL, *smap = NULL;
    dl_status s = read_json_file(dir, "tokenizer_config.json", &cfg, 0);
    if (s == DL_OK) s = read_json_file(dir, "special_tokens_map.json", &smap, 0);
    if (s == DL_OK) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        char p2[4200], p3[4200];
        snprintf(p2, sizeof p2, "%s/vocab.json", dir);
        snprintf(p3, sizeof p3, "%s/spiece.model", dir);
        const char *cls = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class"));
        int qwen2 = cls && (!strcmp(cls, "Qwen2Tokenizer") || !strcmp(cls, "Qwen2TokenizerFast"));
        int gemma = cls && (!strcmp(cls, "GemmaTokenizer") || !strcmp(cls, "GemmaTokenizerFast"));
        if (qwen2 && (dl_file_exists(path) || dl_file_exists(p2))) {
            s = load_rebuilt(t, dir, cfg, smap, dl_file_exists(path), &QWEN2);
        } else if (gemma) {
            s = load_rebuilt(t, dir, cfg, smap, dl_file_exists(path), &GEMMA);
        } else if (dl_file_exists(path)) {
            s = load_tokenizer_json(t, dir, cfg, smap);
            /* transformers 5 rebuilds a T5 tokenizer's pipeline from the model instead of
               taking a file's own (older files collapse spaces and split without
               WhitespaceSplit): the charsmap, WhitespaceSplit + Metaspace(always, split) */
            if (s == DL_OK && t->kind == DL_TOK_UNIGRAM && cls && (!strcmp(cls, "T5Tokenizer") || !strcmp(cls, "T5TokenizerFast"))) {
                t->nnorm = 0;
                if (t->cm.nunits) t->norms[t->nnorm++] = NORM_PRECOMPILED;
                t->ws_split = t->metaspace = t->meta_split = 1;
                t->meta_prepend = 2;
            }
        }
        else if (dl_file_exists(p2)) s = load_clip_files(t, dir, cfg, smap);
        else if (dl_file_exists(p3)) s = load_spiece(t, dir, cfg, smap);
        else s = dl_fail(DL_ERR_IO, "`%s`: no tokenizer.json, vocab.json + merges.txt or spiece.model", dir);
    }
    cJSON_Delete(cfg);
    cJSON_Delete(smap);
    if (s == DL_OK) s = dl_tok_index_added(t);
    if (s != DL_OK) {
        dl_tokenizer_free(t);
        return s;
    }
    *out = t;
    return DL_OK;
}
