/* Normalisers as the tokenizers library applies them: NFC / NFKC, per-character
 * lower case (full mapping), whitespace collapsing, strip, Gemma's space -> U+2581
 * replacement, and SentencePiece's
 * precompiled map, which tokenizers applies per extended grapheme cluster: a
 * cluster shorter than 6 bytes is replaced whole by the first (shortest) prefix
 * match of the map, otherwise each character is looked up alone. */
#include <string.h>
#include <utf8proc.h>

#include "text/text_impl.h"

#define OOM() dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory")

dl_status dl_charsmap_parse(charsmap *c, const uint8_t *blob, size_t len) {
    memset(c, 0, sizeof *c);
    if (len < 4) return dl_fail(DL_ERR_FORMAT, "precompiled_charsmap is %zu bytes: too short", len);
    uint32_t tsize = (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24;
    if (tsize % 4 || tsize > len - 4 || tsize == 0)
        return dl_fail(DL_ERR_FORMAT, "precompiled_charsmap: trie size %u does not fit its %zu bytes", tsize, len);
    c->nunits = tsize / 4;
    c->units = malloc(tsize);
    c->norm_len = len - 4 - tsize;
    c->norm = malloc(c->norm_len + 1);
    if (!c->units || !c->norm) {
        dl_charsmap_free(c);
        return OOM();
    }
    for (size_t i = 0; i < c->nunits; i++) {
        const uint8_t *u = blob + 4 + 4 * i;
        c->units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    }
    memcpy(c->norm, blob + 4 + tsize, c->norm_len);
    c->norm[c->norm_len] = 0;
    return DL_OK;
}

void dl_charsmap_free(charsmap *c) {
    free(c->units);
    free(c->norm);
    memset(c, 0, sizeof *c);
}

/* darts-clone unit fields */
static inline uint32_t u_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
static inline uint32_t u_label(uint32_t u) { return u & ((1u << 31) | 0xffu); }
static inline int u_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static inline uint32_t u_value(uint32_t u) { return u & ((1u << 31) - 1); }

/* The replacement for the shortest prefix of key[0..n) in the map, or NULL. Every
 * index is checked against the array, so a corrupt map cannot read out of bounds. */
static const char *charsmap_first(const charsmap *c, const char *key, size_t n, size_t *out_len) {
    size_t pos = 0;
    if (!c->nunits) return NULL;
    pos ^= u_offset(c->units[0]);
    for (size_t i = 0; i < n; i++) {
        pos ^= (uint8_t)key[i];
        if (pos >= c->nunits) return NULL;
        uint32_t u = c->units[pos];
        if (u_label(u) != (uint8_t)key[i]) return NULL;
        pos ^= u_offset(u);
        if (pos >= c->nunits) return NULL;
        if (u_has_leaf(u)) {
            uint32_t v = u_value(c->units[pos]);
            if (v >= c->norm_len) return NULL;
            *out_len = strlen(c->norm + v);
            return c->norm + v;
        }
    }
    return NULL;
}

static dl_status precompiled(const charsmap *cm, const char *in, size_t n, sbuf *out) {
    size_t i = 0;
    utf8proc_int32_t state = 0;
    while (i < n) { /* one extended grapheme cluster [i, j) per iteration */
        int32_t cp, next;
        int k = dl_utf8_next(in + i, n - i, &cp);
        if (k < 0) return dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
        size_t j = i + (size_t)k;
        state = 0;
        while (j < n) {
            int k2 = dl_utf8_next(in + j, n - j, &next);
            if (k2 < 0) return dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
            if (utf8proc_grapheme_break_stateful(cp, next, &state)) break;
            cp = next;
            j += (size_t)k2;
        }
        size_t rl;
        const char *r = j - i < 6 ? charsmap_first(cm, in + i, j - i, &rl) : NULL;
        if (r) {
            if (!dl_sbuf_put(out, r, rl)) return OOM();
        } else {
            for (size_t p = i; p < j;) { /* each character alone */
                int kc = dl_utf8_next(in + p, j - p, &cp);
                const char *rc = charsmap_first(cm, in + p, (size_t)kc, &rl);
                if (!(rc ? dl_sbuf_put(out, rc, rl) : dl_sbuf_put(out, in + p, (size_t)kc))) return OOM();
                p += (size_t)kc;
            }
        }
        i = j;
    }
    return DL_OK;
}

dl_status dl_normalize(norm_kind k, const charsmap *cm, const char *in, size_t n, sbuf *out) {
    out->n = 0;
    if (!dl_sbuf_put(out, "", 0)) return OOM();
    switch (k) {
    case NORM_NFC:
    case NORM_NFKC: {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (k == NORM_NFKC ? UTF8PROC_COMPAT : 0);
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &dst, opt);
        if (r < 0) return dl_fail(DL_ERR_INVALID, "text: %s", utf8proc_errmsg(r));
        int ok = dl_sbuf_put(out, dst, (size_t)r);
        free(dst);
        return ok ? DL_OK : OOM();
    }
    case NORM_LOWER:
        for (size_t i = 0; i < n;) {
            int32_t cp;
            int l = dl_utf8_next(in + i, n - i, &cp);
            if (l < 0) return dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
            i += (size_t)l;
            if (cp == 0x130) { /* the one full lower-case mapping longer than one character */
                if (!dl_sbuf_putc32(out, 'i') || !dl_sbuf_putc32(out, 0x307)) return OOM();
            } else if (!dl_sbuf_putc32(out, utf8proc_tolower(cp))) {
                return OOM();
            }
        }
        return DL_OK;
    case NORM_WS_COLLAPSE:
    case NORM_SPACES_COLLAPSE:
        for (size_t i = 0; i < n;) {
            int32_t cp;
            int l = dl_utf8_next(in + i, n - i, &cp);
            if (l < 0) return dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
            int sp = k == NORM_WS_COLLAPSE ? dl_uni_is_space(cp) : cp == ' ';
            if (!sp) {
                if (!dl_sbuf_put(out, in + i, (size_t)l)) return OOM();
                i += (size_t)l;
                continue;
            }
            size_t j = i + (size_t)l, run = 1; /* the run of spaces starting at i */
            while (j < n) {
                int l2 = dl_utf8_next(in + j, n - j, &cp);
                if (l2 < 0 || !(k == NORM_WS_COLLAPSE ? dl_uni_is_space(cp) : cp == ' ')) break;
                j += (size_t)l2;
                run++;
            }
            /* \s+ -> " " replaces every run; " {2,}" -> " " only runs of two or more */
            if (!(k == NORM_WS_COLLAPSE || run >= 2 ? dl_sbuf_put(out, " ", 1) : dl_sbuf_put(out, in + i, j - i)))
                return OOM();
            i = j;
        }
        return DL_OK;
    case NORM_STRIP: {
        size_t b = 0, e = n;
        int32_t cp;
        while (b < e) {
            int l = dl_utf8_next(in + b, e - b, &cp);
            if (l < 0 || !dl_uni_is_space(cp)) break;
            b += (size_t)l;
        }
        while (e > b) { /* step back one character */
            size_t s = e - 1;
            while (s > b && ((uint8_t)in[s] & 0xc0) == 0x80) s--;
            int l = dl_utf8_next(in + s, e - s, &cp);
            if (l < 0 || !dl_uni_is_space(cp)) break;
            e = s;
        }
        return dl_sbuf_put(out, in + b, e - b) ? DL_OK : OOM();
    }
    case NORM_SPACE_META: /* Replace(" ", "▁"): only U+0020, byte by byte (UTF-8 safe) */
        for (size_t i = 0; i < n; i++)
            if (!(in[i] == ' ' ? dl_sbuf_put(out, "\xe2\x96\x81", 3) : dl_sbuf_put(out, in + i, 1))) return OOM();
        return DL_OK;
    case NORM_PRECOMPILED: return precompiled(cm, in, n, out);
    }
    return dl_fail(DL_ERR_INVALID, "unknown normaliser");
}
