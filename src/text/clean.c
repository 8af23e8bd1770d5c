/* Prompt cleaning as the diffusers pipelines do it before tokenising:
 *   html.unescape (Python's: HTML5 named references, with the longest-prefix rule
 *   for names without ';'; numeric references with the HTML5 replacement rules),
 *   and WanPipeline's prompt_clean: ftfy.fix_text when ftfy is installed (it is in
 *   the reference environment), unescape twice, str.strip (str.isspace), every run
 *   of Unicode White_Space (the `regex` module's \s) becomes one space, and
 *   str.strip again.
 * ftfy.fix_text (6.3.1, default TextFixerConfig) splits the text after each '\n'
 * (and every 1,000,000 code points) and repeats on each segment, until nothing
 * changes: its own unescape_html (only "&#?[0-9A-Za-z]{1,24};", names ending in
 * ';' plus some all-caps ones; off for this and every later segment once a segment
 * holds '<'), fix_encoding, fix_c1_controls, fix_latin_ligatures,
 * fix_character_width, uncurl_quotes, fix_line_breaks, fix_surrogates,
 * remove_terminal_escapes, remove_control_chars, NFC. All of it is reproduced but
 * fix_encoding, the mojibake repair that re-decodes text misread as Latin-1 /
 * Windows-125x / MacRoman: it acts only on text its detector (badness.is_bad)
 * flags, which needs one of the characters of k_mojibake_chars, so text without
 * them comes out exactly as Python's and text with them is reported
 * (maybe_mojibake). fix_surrogates has nothing to do on valid UTF-8: no reference
 * ftfy decodes yields a surrogate. Tables: ftfy_tables.inc (tools/gen/ftfy_tables.py).
 * NFC is utf8proc's (Unicode 15) where Python 3.11 has Unicode 14: they differ only
 * on characters new in 15. */
#include <stdlib.h>
#include <string.h>

#include "text/text_impl.h"

#include "text/ftfy_tables.inc"
#include "text/html_entities.inc"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static int cmp_entity(const void *k, const void *e) {
    return strcmp(k, ((const struct html_entity *)e)->name);
}

static const char *entity(const char *name) {
    const struct html_entity *e = bsearch(name, k_html5, NELEM(k_html5), sizeof k_html5[0], cmp_entity);
    return e ? e->value : NULL;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'f'); }

/* a numeric reference's replacement (Python's _replace_charref) into b */
static int numeric(sbuf *b, unsigned long long num) {
    for (size_t i = 0; i < NELEM(k_invalid_charrefs); i++)
        if (k_invalid_charrefs[i].code == num) return dl_sbuf_put(b, k_invalid_charrefs[i].value, strlen(k_invalid_charrefs[i].value));
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return dl_sbuf_putc32(b, 0xFFFD);
    for (size_t i = 0; i < NELEM(k_invalid_codepoints); i++)
        if (k_invalid_codepoints[i] == num) return 1; /* dropped */
    return dl_sbuf_putc32(b, (int32_t)num);
}

/* one reference at s (s[0] == '&', n bytes left): appends its replacement and
 * returns the bytes consumed, or 0 when nothing matches (the '&' stays) */
static size_t reference(sbuf *b, const char *s, size_t n, int *ok) {
    size_t i = 1;
    if (i < n && s[i] == '#') {
        int hex = i + 1 < n && (s[i + 1] == 'x' || s[i + 1] == 'X');
        size_t d0 = i + 1 + (size_t)hex, d = d0;
        unsigned long long num = 0;
        int big = 0;
        while (d < n && (hex ? is_hex(s[d]) : (s[d] >= '0' && s[d] <= '9'))) {
            unsigned v = s[d] <= '9' ? (unsigned)(s[d] - '0') : (unsigned)((s[d] | 32) - 'a' + 10);
            if (num > 0x10FFFFull * 16) big = 1; /* past any code point: U+FFFD, as Python's big ints give */
            else num = num * (hex ? 16 : 10) + v;
            d++;
        }
        if (d == d0) return 0; /* "&#" or "&#x" without digits: not a reference */
        if (d < n && s[d] == ';') d++;
        *ok = numeric(b, big ? 0x110000ull : num);
        return d;
    }
    /* a name: up to 32 characters other than \t \n \f space < & # ;, then an optional ';' */
    size_t e = i;
    int chars = 0;
    while (e < n && chars < 32) {
        char c = s[e];
        if (c == '\t' || c == '\n' || c == '\f' || c == ' ' || c == '<' || c == '&' || c == '#' || c == ';') break;
        int32_t cp;
        int k = dl_utf8_next(s + e, n - e, &cp);
        e += (size_t)(k > 0 ? k : 1);
        chars++;
    }
    if (e == i) return 0;
    if (e < n && s[e] == ';') e++;
    char name[160];
    size_t len = e - i;
    if (len >= sizeof name) return 0;
    memcpy(name, s + i, len);
    name[len] = 0;
    const char *v = entity(name);
    if (v) {
        *ok = dl_sbuf_put(b, v, strlen(v));
        return e;
    }
    /* the longest prefix (at least 2 characters) that is a name, the rest kept */
    for (size_t x = len - 1; x >= 2 && x < len; x--) {
        name[x] = 0;
        if ((v = entity(name))) {
            *ok = dl_sbuf_put(b, v, strlen(v)) && dl_sbuf_put(b, s + i + x, len - x);
            return e;
        }
    }
    return 0;
}

static dl_status unescape(const char *in, size_t n, sbuf *out) {
    for (size_t i = 0; i < n;) {
        const char *amp = memchr(in + i, '&', n - i);
        size_t upto = amp ? (size_t)(amp - in) : n;
        if (!dl_sbuf_put(out, in + i, upto - i)) return dl_fail(DL_ERR_NOMEM, "out of memory");
        if (!amp) break;
        int ok = 1;
        size_t used = reference(out, amp, n - upto, &ok);
        if (!ok) return dl_fail(DL_ERR_NOMEM, "out of memory");
        if (!used) {
            if (!dl_sbuf_put(out, "&", 1)) return dl_fail(DL_ERR_NOMEM, "out of memory");
            used = 1;
        }
        i = upto + used;
    }
    return DL_OK;
}

dl_status dl_html_unescape(const char *in, size_t n, char **out) {
    sbuf b = {0};
    dl_status s = unescape(in, n, &b);
    if (s == DL_OK && !dl_sbuf_put(&b, "", 1)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s != DL_OK) {
        dl_sbuf_free(&b);
        return s;
    }
    *out = b.p;
    return DL_OK;
}

/* Python's str.isspace: Unicode White_Space plus the separators U+001C..U+001F */
static int py_space(int32_t cp) { return (cp >= 0x1c && cp <= 0x1f) || dl_uni_is_space(cp); }

/* [a, b) of s without the str.isspace characters at either end */
static void strip(const char *s, size_t n, size_t *a, size_t *b) {
    size_t i = 0, end = 0;
    int seen = 0;
    *a = *b = 0;
    while (i < n) {
        int32_t cp;
        int k = dl_utf8_next(s + i, n - i, &cp);
        if (k <= 0) cp = -1, k = 1;
        if (cp < 0 || !py_space(cp)) {
            if (!seen) *a = i, seen = 1;
            end = i + (size_t)k;
        }
        i += (size_t)k;
    }
    *b = seen ? end : 0;
}

void dl_text_strip(const char *s, size_t n, size_t *a, size_t *b) { strip(s, n, a, b); }

/* ---- ftfy.fix_text without fix_encoding ---- */

static int in_ranges(const struct uni_range *r, size_t n, int32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static int cmp_ftfy_entity(const void *k, const void *e) { return strcmp(k, ((const struct ftfy_entity *)e)->name); }

static int cmp_ftfy_char(const void *k, const void *e) {
    int32_t a = *(const int32_t *)k, b = ((const struct ftfy_char *)e)->cp;
    return (a > b) - (a < b);
}

static int is_alnum(char c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'); }

/* the length of a match of HTML_ENTITY_RE, &#?[0-9A-Za-z]{1,24};, at s (s[0] ==
 * '&'), or 0 */
static size_t entity_match(const char *s, size_t n) {
    size_t i = 1 + (size_t)(n > 1 && s[1] == '#'), run = 0;
    while (i + run < n && run < 25 && is_alnum(s[i + run])) run++;
    return run >= 1 && run <= 24 && i + run < n && s[i + run] == ';' ? i + run + 1 : 0;
}

/* fixes.unescape_html: each match in turn, replaced when it is a name of
 * chardata.HTML_ENTITIES, or a numeric reference html.unescape consumes whole */
static dl_status ftfy_unescape(const char *in, size_t n, sbuf *out) {
    out->n = 0;
    for (size_t i = 0; i < n;) {
        const char *amp = memchr(in + i, '&', n - i);
        size_t at = amp ? (size_t)(amp - in) : n;
        if (!dl_sbuf_put(out, in + i, at - i)) return dl_fail(DL_ERR_NOMEM, "out of memory");
        if (!amp) break;
        size_t len = entity_match(amp, n - at);
        if (!len) {
            if (!dl_sbuf_put(out, "&", 1)) return dl_fail(DL_ERR_NOMEM, "out of memory");
            i = at + 1;
            continue;
        }
        char name[32];
        memcpy(name, amp + 1, len - 1);
        name[len - 1] = 0;
        const struct ftfy_entity *e = bsearch(name, k_ftfy_entities, NELEM(k_ftfy_entities), sizeof k_ftfy_entities[0], cmp_ftfy_entity);
        int ok;
        if (e) {
            ok = dl_sbuf_put(out, e->value, strlen(e->value));
        } else if (name[0] == '#') {
            sbuf r = {0};
            dl_status s = unescape(amp, len, &r);
            if (s != DL_OK) {
                dl_sbuf_free(&r);
                return s;
            }
            /* kept as written when html.unescape leaves a ';' (it did not consume it all) */
            if (r.n && memchr(r.p, ';', r.n)) ok = dl_sbuf_put(out, amp, len);
            else ok = dl_sbuf_put(out, r.p ? r.p : "", r.n);
            dl_sbuf_free(&r);
        } else {
            ok = dl_sbuf_put(out, amp, len);
        }
        if (!ok) return dl_fail(DL_ERR_NOMEM, "out of memory");
        i = at + len;
    }
    return DL_OK;
}

/* fix_c1_controls, fix_latin_ligatures, fix_character_width and uncurl_quotes (one
 * composed table), then fix_line_breaks: in -> out. The generator checks that no
 * replacement holds a line break, so one scan does both. */
static dl_status ftfy_chars(const char *in, size_t n, sbuf *out) {
    out->n = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dl_utf8_next(in + i, n - i, &cp);
        DL_ASSERT(k > 0);
        const struct ftfy_char *m = cp >= 0x80 ? bsearch(&cp, k_ftfy_charmap, NELEM(k_ftfy_charmap), sizeof k_ftfy_charmap[0], cmp_ftfy_char) : NULL;
        int ok;
        if (m) ok = dl_sbuf_put(out, m->to, strlen(m->to));
        else if (cp == '\r' || cp == 0x2028 || cp == 0x2029 || cp == 0x85) ok = dl_sbuf_put(out, "\n", 1);
        else ok = dl_sbuf_put(out, in + i, (size_t)k);
        if (!ok) return dl_fail(DL_ERR_NOMEM, "out of memory");
        i += (size_t)k;
        if (cp == '\r' && i < n && in[i] == '\n') i++; /* CRLF is one break */
    }
    return DL_OK;
}

/* remove_terminal_escapes (ANSI_RE: ESC '[' then \d or ';' (Python's Unicode \d)
 * any number of times, then an ASCII letter), then remove_control_chars: in -> out.
 * One scan gives the same: an ESC that starts no escape is a control character. */
static dl_status ftfy_controls(const char *in, size_t n, sbuf *out) {
    out->n = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dl_utf8_next(in + i, n - i, &cp);
        DL_ASSERT(k > 0);
        if (cp == 0x1b && i + 1 < n && in[i + 1] == '[') {
            size_t j = i + 2;
            int32_t c;
            int l;
            while (j < n && (l = dl_utf8_next(in + j, n - j, &c)) > 0 && (c == ';' || in_ranges(k_py_decimal, NELEM(k_py_decimal), c)))
                j += (size_t)l;
            if (j < n && ((in[j] | 32) >= 'a' && (in[j] | 32) <= 'z')) {
                i = j + 1;
                continue;
            }
        }
        if (!in_ranges(k_ftfy_control, NELEM(k_ftfy_control), cp) && !dl_sbuf_put(out, in + i, (size_t)k))
            return dl_fail(DL_ERR_NOMEM, "out of memory");
        i += (size_t)k;
    }
    return DL_OK;
}

/* 1 when s[0..n) holds a character is_bad() could start from */
static int mojibake_chars(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dl_utf8_next(s + i, n - i, &cp);
        DL_ASSERT(k > 0);
        if (cp >= 0x80 && in_ranges(k_mojibake_chars, NELEM(k_mojibake_chars), cp)) return 1;
        i += (size_t)k;
    }
    return 0;
}

/* fix_and_explain on one segment: its rounds until one changes nothing, appended to
 * out. cur: two scratch buffers. */
static dl_status ftfy_segment(const char *seg, size_t n, int unescape_html, sbuf *out, sbuf cur[2], int *mojibake) {
    sbuf *a = &cur[0], *b = &cur[1];
    a->n = 0;
    if (!dl_sbuf_put(a, seg, n)) return dl_fail(DL_ERR_NOMEM, "out of memory");
    /* Python repeats without bound; a round that changes something either settles
     * the per-character fixes (the first rounds) or decodes a nested reference,
     * which shortens the text, so n + 8 rounds are never reached on real input */
    for (size_t round = 0; round < n + 8; round++) {
        dl_status s;
        const char *src = a->p;
        size_t sn = a->n;
        if (unescape_html) {
            if ((s = ftfy_unescape(src, sn, b)) != DL_OK) return s;
            src = b->p, sn = b->n;
        }
        if (mojibake_chars(src, sn)) *mojibake = 1; /* fix_encoding would look here */
        sbuf t = {0}, u = {0};
        s = ftfy_chars(src ? src : "", sn, &t);
        if (s == DL_OK) s = ftfy_controls(t.p ? t.p : "", t.n, &u);
        if (s == DL_OK) s = dl_normalize(NORM_NFC, NULL, u.p ? u.p : "", u.n, b);
        dl_sbuf_free(&t), dl_sbuf_free(&u);
        if (s != DL_OK) return s;
        if (b->n == a->n && !memcmp(b->p, a->p, a->n)) {
            if (!dl_sbuf_put(out, a->p, a->n)) return dl_fail(DL_ERR_NOMEM, "out of memory");
            return DL_OK;
        }
        sbuf *x = a;
        a = b, b = x;
    }
    return dl_fail(DL_ERR_INVALID, "ftfy's fixes did not settle on the prompt");
}

enum { FTFY_MAX_DECODE = 1000000 }; /* TextFixerConfig.max_decode_length, code points */

/* ftfy.fix_text(s) with fix_encoding left out, into out */
static dl_status ftfy_fix_text(const char *s, size_t n, sbuf *out, int *mojibake) {
    sbuf scratch[2] = {{0}, {0}};
    dl_status st = DL_OK;
    int unescape_html = 1; /* "auto": off for good once a segment holds '<' */
    for (size_t pos = 0; st == DL_OK && pos < n;) {
        size_t end = pos, cps = 0;
        while (end < n && cps < FTFY_MAX_DECODE) {
            int32_t cp;
            int k = dl_utf8_next(s + end, n - end, &cp);
            DL_ASSERT(k > 0);
            end += (size_t)k, cps++;
            if (cp == '\n') break;
        }
        if (memchr(s + pos, '<', end - pos)) unescape_html = 0;
        st = ftfy_segment(s + pos, end - pos, unescape_html, out, scratch, mojibake);
        pos = end;
    }
    dl_sbuf_free(&scratch[0]), dl_sbuf_free(&scratch[1]);
    return st;
}

dl_status dl_text_ftfy_fix(const char *text, char **out, int *maybe_mojibake) {
    *out = NULL;
    int mojibake = 0;
    size_t n = strlen(text);
    if (n > DL_TOK_MAX_TEXT) return dl_fail(DL_ERR_INVALID, "text longer than %u bytes", DL_TOK_MAX_TEXT);
    if (!dl_utf8_valid(text, n)) return dl_fail(DL_ERR_INVALID, "the text is not valid UTF-8");
    sbuf f = {0};
    dl_status s = ftfy_fix_text(text, n, &f, &mojibake);
    if (s == DL_OK && !dl_sbuf_put(&f, "", 1)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s != DL_OK) {
        dl_sbuf_free(&f);
        return s;
    }
    *out = f.p;
    if (maybe_mojibake) *maybe_mojibake = mojibake;
    return DL_OK;
}

dl_status dl_text_clean_wan(const char *text, char **out) { return dl_text_clean_wan_opts(text, 0, out, NULL); }

dl_status dl_text_clean_wan_opts(const char *text, unsigned flags, char **out, int *maybe_mojibake) {
    *out = NULL;
    int mojibake = 0;
    if (maybe_mojibake) *maybe_mojibake = 0;
    size_t n = strlen(text);
    if (n > DL_TOK_MAX_TEXT) return dl_fail(DL_ERR_INVALID, "prompt longer than %u bytes", DL_TOK_MAX_TEXT);
    if (!dl_utf8_valid(text, n)) return dl_fail(DL_ERR_INVALID, "the prompt is not valid UTF-8");
    sbuf f = {0}, a = {0}, b = {0}, c = {0};
    dl_status s = DL_OK;
    if (!(flags & DL_CLEAN_NO_FTFY)) {
        s = ftfy_fix_text(text, n, &f, &mojibake);
        text = f.p ? f.p : "", n = f.n;
    }
    if (s == DL_OK) s = unescape(text, n, &a);
    if (s == DL_OK) s = unescape(a.p ? a.p : "", a.n, &b);
    /* basic_clean's strip, then whitespace_clean: `regex` \s+ (White_Space) -> " ", strip */
    size_t lo, hi;
    strip(b.p ? b.p : "", b.n, &lo, &hi);
    for (size_t i = lo; s == DL_OK && i < hi;) {
        int32_t cp;
        int k = dl_utf8_next(b.p + i, hi - i, &cp);
        if (k <= 0) cp = -1, k = 1; /* a reference made something odd: kept as it is */
        if (cp >= 0 && dl_uni_is_space(cp)) {
            while (i < hi && (k = dl_utf8_next(b.p + i, hi - i, &cp)) > 0 && dl_uni_is_space(cp)) i += (size_t)k;
            if (!dl_sbuf_put(&c, " ", 1)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
            continue;
        }
        if (!dl_sbuf_put(&c, b.p + i, (size_t)k)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
        i += (size_t)k;
    }
    if (s == DL_OK) { /* the final strip */
        strip(c.p ? c.p : "", c.n, &lo, &hi);
        if (lo) memmove(c.p, c.p + lo, hi - lo);
        c.n = hi - lo;
        if (!dl_sbuf_put(&c, "", 1)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    dl_sbuf_free(&f), dl_sbuf_free(&a), dl_sbuf_free(&b);
    if (s != DL_OK) {
        dl_sbuf_free(&c);
        return s;
    }
    *out = c.p;
    if (maybe_mojibake) *maybe_mojibake = mojibake;
    return DL_OK;
}
