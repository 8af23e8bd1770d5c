/* OpenSora 1.2's prompt cleaning: text_preprocessing, i.e. the DeepFloyd IF /
 * PixArt caption cleaner run twice, as Open-Sora v1.2.0 runs it on Python 3.11
 * (Unicode 14) with ftfy 6.3.1 and beautifulsoup4 4.15.0.
 *
 * The text is held as code points, as Python holds a str. Each regular-expression
 * substitution of the reference is a hand-written matcher that finds the match
 * Python's re.sub finds (leftmost start, greedy quantifiers backing off in order),
 * with Python's Unicode classes: \w is str.isalnum() or '_' (letters and numbers),
 * \d the decimal digits (Nd), \s str.isspace(), \b a change between \w and not
 * \w. A matcher's comment says which backtracking paths of its rule can succeed
 * and why the others cannot. utf8proc 2.8 knows Unicode 15; the letters and
 * digits new in 15 are not \w or \d for Python 3.11, so k_new_in_15 takes them
 * out.
 *
 * BeautifulSoup(text, "html.parser").text is a port of what that computes: the
 * standard library's HTMLParser tokeniser with convert_charrefs off (feed, then
 * close: two passes whose stopping points differ), BeautifulSoup's handlers
 * (character references by the HTML5 rules and Windows-1252, named references
 * without ';' only when the whole name is an HTML5 entity, CDATA sections kept),
 * its tree building as far as .text sees it (the open-tag stack with its pops,
 * void elements closed at once, <pre>/<textarea> keeping whitespace-only strings,
 * <script>, <style>, <template>, <rt> and <rp> strings left out of .text) and the
 * whitespace-only strings it turns into one space or newline. Markup the parser
 * rejects (a "<![" that opens no known marked section) makes the reference raise;
 * here it is DL_ERR_INVALID.
 *
 * ftfy.fix_text and html.unescape are clean.c's (dl_text_ftfy_fix,
 * dl_html_unescape): ftfy's mojibake repair is not reproduced, see text.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/text_impl.h"

#define NOPE SIZE_MAX /* a matcher's "no match here" */

/* ---- code point strings ---- */

typedef struct {
    int32_t *c;
    size_t n, cap;
} ustr;

static int u_add(ustr *u, const int32_t *c, size_t n) {
    if (u->n + n > u->cap) {
        size_t cap = u->cap ? u->cap : 64;
        while (cap < u->n + n) cap *= 2;
        int32_t *p = realloc(u->c, cap * sizeof *p);
        if (!p) return 0;
        u->c = p, u->cap = cap;
    }
    if (n) memcpy(u->c + u->n, c, n * sizeof *c);
    u->n += n;
    return 1;
}

static int u_put(ustr *u, int32_t c) { return u_add(u, &c, 1); }

static int u_lit(ustr *u, const char *ascii) {
    for (; *ascii; ascii++)
        if (!u_put(u, (unsigned char)*ascii)) return 0;
    return 1;
}

/* UTF-8 (valid) appended as code points */
static int u_utf8(ustr *u, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int32_t c;
        int k = dl_utf8_next(s + i, n - i, &c);
        DL_ASSERT(k > 0);
        if (!u_put(u, c)) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* ---- Python's character classes ---- */

/* letters and digits utf8proc 2.8 has from Unicode 15, unknown to Python 3.11 */
static const int32_t k_new_in_15[][2] = {
    {0x1123f, 0x11240}, {0x11f02, 0x11f02}, {0x11f04, 0x11f10}, {0x11f12, 0x11f33}, {0x11f50, 0x11f59},
    {0x1342f, 0x1342f}, {0x13441, 0x13446}, {0x1b132, 0x1b132}, {0x1b155, 0x1b155}, {0x1d2c0, 0x1d2d3},
    {0x1df25, 0x1df2a}, {0x1e030, 0x1e06d}, {0x1e4d0, 0x1e4eb}, {0x1e4f0, 0x1e4f9}, {0x2b739, 0x2b739},
    {0x31350, 0x323af}};

static int new_in_15(int32_t c) {
    if (c < 0x1123f) return 0;
    for (size_t i = 0; i < sizeof k_new_in_15 / sizeof k_new_in_15[0]; i++)
        if (c >= k_new_in_15[i][0] && c <= k_new_in_15[i][1]) return 1;
    return 0;
}

static int is_space(int32_t c) { return (c >= 0x1c && c <= 0x1f) || dl_uni_is_space(c); } /* str.isspace */
static int is_digit(int32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return utf8proc_category(c) == UTF8PROC_CATEGORY_ND && !new_in_15(c);
}
static int is_word(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') || c == '_';
    return (dl_uni_is_letter(c) || dl_uni_is_number(c)) && !new_in_15(c);
}
static int is_alpha(int32_t c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; } /* [a-zA-Z] */
static int is_alnum(int32_t c) { return is_alpha(c) || (c >= '0' && c <= '9'); }
static int is_hex(int32_t c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'f'); }
static int is_alpha_or_digit(int32_t c) { return is_alpha(c) || is_digit(c); } /* [a-zA-Z\d] */
static int not_space(int32_t c) { return !is_space(c); }

/* \b at p */
static int at_b(const int32_t *s, size_t n, size_t p) {
    return (p > 0 && is_word(s[p - 1])) != (p < n && is_word(s[p]));
}

/* the end of the run of class members from p */
static size_t run(const int32_t *s, size_t n, size_t p, int (*cls)(int32_t)) {
    while (p < n && cls(s[p])) p++;
    return p;
}

/* s[p..] starts with the ASCII word w */
static int lit(const int32_t *s, size_t n, size_t p, const char *w) {
    for (; *w; w++, p++)
        if (p >= n || s[p] != (unsigned char)*w) return 0;
    return 1;
}

/* the same, ASCII letters in either case */
static int lit_ci(const int32_t *s, size_t n, size_t p, const char *w) {
    for (; *w; w++, p++) {
        if (p >= n) return 0;
        int32_t c = s[p];
        if (c != (unsigned char)*w && !(is_alpha(c) && (c | 32) == (unsigned char)*w)) return 0;
    }
    return 1;
}

static size_t find(const int32_t *s, size_t n, size_t p, int32_t c) {
    for (; p < n; p++)
        if (s[p] == c) return p;
    return NOPE;
}

/* ---- str.lower(), with Python's Final_Sigma rule ---- */

static int cased(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) return 1;
    if (utf8proc_tolower(c) != c || utf8proc_toupper(c) != c) return 1;
    /* Other_Lowercase / Other_Uppercase characters without a case mapping */
    return c == 0xaa || c == 0xba || (c >= 0x1f130 && c <= 0x1f149) || (c >= 0x1f150 && c <= 0x1f169) ||
           (c >= 0x1f170 && c <= 0x1f189);
}

static int case_ignorable(int32_t c) {
    static const int32_t mid[] = {0x27,   0x2e,   0x3a,   0xb7,   0x387,  0x55f,  0x5f4,  0x2018, 0x2019,
                                  0x2024, 0x2027, 0xfe13, 0xfe52, 0xfe55, 0xff07, 0xff0e, 0xff1a};
    utf8proc_category_t k = utf8proc_category(c);
    if (k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_CF ||
        k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK)
        return 1;
    for (size_t i = 0; i < sizeof mid / sizeof mid[0]; i++)
        if (c == mid[i]) return 1;
    return 0;
}

/* U+03A3 at i becomes final sigma after a cased letter (case-ignorable ones
 * skipped) when no cased letter follows (the same skipping) */
static int final_sigma(const int32_t *s, size_t n, size_t i) {
    size_t j = i;
    while (j > 0 && case_ignorable(s[j - 1])) j--;
    if (j == 0 || !cased(s[j - 1])) return 0;
    j = i + 1;
    while (j < n && case_ignorable(s[j])) j++;
    return j == n || !cased(s[j]);
}

static int py_lower(const int32_t *s, size_t n, ustr *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t c = s[i];
        int ok;
        if (c == 0x130) ok = u_put(out, 'i') && u_put(out, 0x307); /* the one longer mapping */
        else if (c == 0x3a3) ok = u_put(out, final_sigma(s, n, i) ? 0x3c2 : 0x3c3);
        else ok = u_put(out, utf8proc_tolower(c));
        if (!ok) return 0;
    }
    return 1;
}

/* str.strip() of in into out */
static int py_strip(const ustr *in, ustr *out) {
    size_t a = 0, b = in->n;
    while (a < b && is_space(in->c[a])) a++;
    while (b > a && is_space(in->c[b - 1])) b--;
    return u_add(out, in->c + a, b - a);
}

/* ---- urllib.parse.unquote_plus ---- */

/* bytes.decode("utf-8", "replace"): one U+FFFD per maximal invalid subpart */
static int utf8_replace(const uint8_t *b, size_t n, ustr *out) {
    for (size_t i = 0; i < n;) {
        uint8_t c = b[i];
        int need = c < 0x80                ? 0  /* continuation bytes a lead byte needs; -1: no lead byte */
                   : c >= 0xc2 && c <= 0xdf ? 1
                   : c >= 0xe0 && c <= 0xef ? 2
                   : c >= 0xf0 && c <= 0xf4 ? 3
                                            : -1;
        if (need <= 0) {
            if (!u_put(out, need == 0 ? c : 0xfffd)) return 0;
            i++;
            continue;
        }
        uint8_t lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
        int32_t cp = c & (0x3f >> need);
        size_t k = 1;
        for (; k <= (size_t)need && i + k < n; k++) {
            uint8_t d = b[i + k];
            if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xbf)) break;
            cp = cp << 6 | (d & 0x3f);
        }
        if (!u_put(out, k == (size_t)need + 1 ? cp : 0xfffd)) return 0;
        i += k;
    }
    return 1;
}

static int hexval(int32_t c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

/* '+' to ' ', then each maximal ASCII run's %XX escapes to bytes, decoded as
 * UTF-8 with replacement (unquote works run by run) */
static int unquote_plus(const ustr *in, ustr *out) {
    const int32_t *s = in->c;
    size_t n = in->n;
    int pct = 0;
    for (size_t i = 0; i < n; i++) pct |= s[i] == '%';
    uint8_t *bytes = pct ? malloc(n ? n : 1) : NULL;
    if (pct && !bytes) return 0;
    int ok = 1;
    for (size_t i = 0; ok && i < n;) {
        if (s[i] >= 0x80 || !pct) {
            ok = u_put(out, s[i] == '+' ? ' ' : s[i]);
            i++;
            continue;
        }
        size_t e = i, nb = 0;
        while (e < n && s[e] < 0x80) e++;
        for (size_t j = i; j < e;) {
            if (s[j] == '%' && j + 2 < e && is_hex(s[j + 1]) && is_hex(s[j + 2])) {
                bytes[nb++] = (uint8_t)(hexval(s[j + 1]) << 4 | hexval(s[j + 2]));
                j += 3;
            } else {
                bytes[nb++] = (uint8_t)(s[j] == '+' ? ' ' : s[j]);
                j++;
            }
        }
        ok = utf8_replace(bytes, nb, out);
        i = e;
    }
    free(bytes);
    return ok;
}

/* ---- BeautifulSoup(text, "html.parser").text ---- */

enum { K_VOID = 1, K_PRESERVE = 2, K_CONTAINER = 4, K_CDATA = 8 }; /* what a tag name is to bs4 */
enum { STR_TEXT, STR_CDATA, STR_SKIP };                          /* the kinds of string .text sees */

/* a leftmost search from `from` that found `at` (NOPE: nothing up to the end),
 * whose match ends at `end`: the answer for any start in [from, at] too. These
 * keep text that opens many constructs it never closes ("<a<a<a...") linear. */
typedef struct {
    size_t from, at, end;
} search_cache;

static int cache_hit(const search_cache *c, size_t p) {
    return c->from != NOPE && p >= c->from && (c->at == NOPE || p <= c->at);
}

/* a distinct tag name: its first occurrence in the text, how many are open, how
 * many void elements of the name were closed at once (an end tag then closes
 * nothing) */
typedef struct {
    size_t off, len;
    uint32_t hash;
    int open, closed;
    unsigned kind;
} tname;

typedef struct {
    const int32_t *s;
    size_t n, base;  /* html.parser's rawdata is s[base..n) */
    ustr *out;       /* .text */
    ustr cur;        /* data since the last endData */
    int have;        /* handle_data was called since then (even with "") */
    tname *names;    /* [nnames] */
    size_t nnames, names_cap;
    uint32_t *tab;   /* open addressing over names: index + 1, 0 empty; [tab_cap] */
    size_t tab_cap;
    int *stack;      /* open tags (names index), the document root left out */
    size_t depth, stack_cap;
    int *containers; /* stack positions of open string-container tags */
    size_t ncont;
    int preserve;    /* open <pre> / <textarea> */
    int cdata;       /* script/style raw text: that name's index, else -1 */
    int rejected, oom;
    search_cache gt, comment, section[2], name_run; /* '>', --\s*>, ]\s*]\s*> and ]\s*>, tag-name runs */
    size_t *chain; /* [n + 1]: where the attributes from a position end, + 1 (0: not known yet) */
} soup;

static const char *const k_void[] = {"area", "base", "basefont", "bgsound", "br", "col", "command", "embed",
                                      "frame", "hr", "image", "img", "input", "isindex", "keygen", "link",
                                      "menuitem", "meta", "nextid", "param", "source", "spacer", "track", "wbr"};
static const char *const k_container[] = {"rt", "rp", "style", "script", "template"};

static int name_is(const int32_t *s, size_t len, const char *w) { return strlen(w) == len && lit(s, len, 0, w); }

static unsigned name_kind(const int32_t *s, size_t len) {
    unsigned k = 0;
    for (size_t i = 0; i < sizeof k_void / sizeof k_void[0]; i++)
        if (name_is(s, len, k_void[i])) k |= K_VOID;
    for (size_t i = 0; i < sizeof k_container / sizeof k_container[0]; i++)
        if (name_is(s, len, k_container[i])) k |= K_CONTAINER;
    if (name_is(s, len, "pre") || name_is(s, len, "textarea")) k |= K_PRESERVE;
    if (name_is(s, len, "script") || name_is(s, len, "style")) k |= K_CDATA;
    return k;
}

static uint32_t name_hash(const int32_t *s, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint32_t)s[i]) * 16777619u;
    return h;
}

/* the index of the tag name s[a..b), added when new; -1 on allocation failure */
static int intern(soup *b, size_t a, size_t e) {
    const int32_t *nm = b->s + a;
    size_t len = e - a;
    uint32_t h = name_hash(nm, len);
    if (2 * (b->nnames + 1) > b->tab_cap) {
        size_t cap = b->tab_cap ? 2 * b->tab_cap : 64;
        uint32_t *t = calloc(cap, sizeof *t);
        if (!t) return -1;
        for (size_t i = 0; i < b->nnames; i++) {
            size_t j = b->names[i].hash & (cap - 1);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = (uint32_t)i + 1;
        }
        free(b->tab);
        b->tab = t, b->tab_cap = cap;
    }
    size_t j = h & (b->tab_cap - 1);
    for (; b->tab[j]; j = (j + 1) & (b->tab_cap - 1)) {
        const tname *t = &b->names[b->tab[j] - 1];
        if (t->hash == h && t->len == len && !memcmp(b->s + t->off, nm, len * sizeof *nm)) return (int)(b->tab[j] - 1);
    }
    if (b->nnames == b->names_cap) {
        size_t cap = b->names_cap ? 2 * b->names_cap : 16;
        tname *p = realloc(b->names, cap * sizeof *p);
        if (!p) return -1;
        b->names = p, b->names_cap = cap;
    }
    b->names[b->nnames] = (tname){a, len, h, 0, 0, name_kind(nm, len)};
    b->tab[j] = (uint32_t)b->nnames + 1;
    return (int)b->nnames++;
}

static void data(soup *b, const int32_t *c, size_t n) {
    if (!u_add(&b->cur, c, n)) b->oom = 1;
    b->have = 1;
}

static int is_ascii_ws(int32_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\f' || c == '\r'; }

/* BeautifulSoup.endData: the pending data becomes one string of kind k (a plain
 * string is its innermost string container's kind); outside <pre>/<textarea> a
 * string of ASCII whitespace only (or empty) becomes "\n" when it holds one, else
 * " ". Plain strings and CDATA go to .text. */
static void end_data(soup *b, int k) {
    if (!b->have) return;
    b->have = 0;
    ustr *c = &b->cur;
    if (!b->preserve && run(c->c, c->n, 0, is_ascii_ws) == c->n) {
        int nl = find(c->c, c->n, 0, '\n') != NOPE;
        c->n = 0;
        if (!u_put(c, nl ? '\n' : ' ')) b->oom = 1;
    }
    if (k == STR_TEXT && b->ncont) k = STR_SKIP;
    if (k != STR_SKIP && !u_add(b->out, c->c, c->n)) b->oom = 1;
    c->n = 0;
}

static void push_tag(soup *b, int id) {
    if (b->depth == b->stack_cap) {
        size_t cap = b->stack_cap ? 2 * b->stack_cap : 32;
        int *p = realloc(b->stack, cap * sizeof *p), *q = realloc(b->containers, cap * sizeof *q);
        if (p) b->stack = p;
        if (q) b->containers = q;
        if (!p || !q) {
            b->oom = 1;
            return;
        }
        b->stack_cap = cap;
    }
    tname *t = &b->names[id];
    t->open++;
    if (t->kind & K_PRESERVE) b->preserve++;
    if (t->kind & K_CONTAINER) b->containers[b->ncont++] = (int)b->depth;
    b->stack[b->depth++] = id;
}

/* _popToTag: pop up to and including the most recent open tag of that name */
static void pop_to(soup *b, int id) {
    while (b->depth && b->names[id].open) {
        int t = b->stack[--b->depth];
        tname *x = &b->names[t];
        x->open--;
        if (x->kind & K_PRESERVE) b->preserve--;
        if (x->kind & K_CONTAINER) b->ncont--;
        if (t == id) break;
    }
}

/* a start tag (startend: written <x/>) */
static void start_tag(soup *b, int id, int startend) {
    end_data(b, STR_TEXT);
    push_tag(b, id);
    if (startend || (b->names[id].kind & K_VOID)) {
        end_data(b, STR_TEXT);
        pop_to(b, id);
        if (!startend) b->names[id].closed++;
    }
}

static void end_tag(soup *b, int id) {
    if (b->names[id].closed) {
        b->names[id].closed--;
        return;
    }
    end_data(b, STR_TEXT);
    pop_to(b, id);
}

/* a comment, declaration or processing instruction: its text is no part of .text */
static void skipped_markup(soup *b) { end_data(b, STR_TEXT); }

/* &name; as BeautifulSoup resolves it: the HTML5 entity of exactly that name,
 * else the text "&name" (the ';' html.parser consumed is lost). html.unescape of
 * "&name;" gives the entity's value when the whole name is one; otherwise its
 * result ends with the ';' (longest-prefix rule, or nothing replaced). Only
 * "semi" has a value that ends with ';'. */
static void entity_ref(soup *b, size_t a, size_t e) {
    char buf[40];
    size_t len = e - a;
    if (len <= 31) {
        buf[0] = '&';
        for (size_t i = 0; i < len; i++) buf[1 + i] = (char)b->s[a + i];
        buf[len + 1] = ';';
        buf[len + 2] = 0;
        char *r = NULL;
        if (dl_html_unescape(buf, len + 2, &r) != DL_OK) {
            b->oom = 1;
            return;
        }
        size_t rl = strlen(r);
        if (rl && (r[rl - 1] != ';' || !strcmp(buf, "&semi;"))) {
            if (!u_utf8(&b->cur, r, rl)) b->oom = 1;
            b->have = 1;
            free(r);
            return;
        }
        free(r);
    }
    int32_t amp = '&';
    data(b, &amp, 1);
    data(b, b->s + a, len);
}

/* &#digits; / &#xhex; as BeautifulSoup resolves it: U+FFFD for 0, surrogates and
 * past U+10FFFF, Windows-1252 for 0x80..0x9F (html.unescape's table, which is the
 * same), else the code point itself */
static void char_ref(soup *b, size_t a, size_t e, int hex) {
    uint64_t v = 0;
    int big = 0;
    for (size_t i = a; i < e; i++) {
        if (v > 0x10ffff) big = 1;
        else v = v * (hex ? 16 : 10) + (uint64_t)hexval(b->s[i]);
    }
    int32_t c = (int32_t)v;
    if (big || v > 0x10ffff || v == 0 || (v >= 0xd800 && v <= 0xdfff)) {
        c = 0xfffd;
    } else if (v >= 0x80 && v <= 0x9f) {
        char buf[16], *r = NULL;
        size_t len = (size_t)snprintf(buf, sizeof buf, "&#%u;", (unsigned)v);
        if (dl_html_unescape(buf, len, &r) != DL_OK || !u_utf8(&b->cur, r, strlen(r))) b->oom = 1;
        free(r);
        b->have = 1;
        return;
    }
    data(b, &c, 1);
}

/* [^\t\n\r\f />\x00]: what continues a tag name */
static int name_char(int32_t c) {
    return !(c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == ' ' || c == '/' || c == '>' || c == 0);
}

static size_t next_gt(soup *b, size_t p) {
    if (!cache_hit(&b->gt, p)) b->gt = (search_cache){p, find(b->s, b->n, p, '>'), 0};
    return b->gt.at;
}

/* the end of the tag-name run from p */
static size_t name_run(soup *b, size_t p) {
    if (!cache_hit(&b->name_run, p)) b->name_run = (search_cache){p, run(b->s, b->n, p, name_char), 0};
    return b->name_run.at;
}

/* (?:\s|/(?!>))* */
static size_t skip_ws_slash(const int32_t *s, size_t n, size_t q) {
    while (q < n && (is_space(s[q]) || (s[q] == '/' && !(q + 1 < n && s[q + 1] == '>')))) q++;
    return q;
}

/* an attribute value at b: '...', "...", or a bare run of neither '>' nor \s
 * that does not start with a quote (so an unclosed quote is no value) */
static size_t attr_value_at(const int32_t *s, size_t n, size_t b) {
    if (b < n && (s[b] == '\'' || s[b] == '"')) {
        size_t q = find(s, n, b + 1, s[b]);
        return q == NOPE ? NOPE : q + 1;
    }
    size_t r = b;
    while (r < n && s[r] != '>' && !is_space(s[r])) r++;
    return r;
}

/* \s*=+\s*VALUE at q, backing off the '=' and space runs in the order re does:
 * with all the '=' the last space before an unclosed quote gives an empty bare
 * value; with one '=' fewer the bare value takes the last '=' and what follows */
static size_t attr_eq_value(const int32_t *s, size_t n, size_t q) {
    size_t a = run(s, n, q, is_space);
    if (a >= n || s[a] != '=') return NOPE;
    size_t eq = a;
    while (eq < n && s[eq] == '=') eq++;
    for (size_t e = eq; e > a; e--) {
        size_t sp = run(s, n, e, is_space);
        for (size_t b = sp + 1; b-- > e;) {
            size_t r = attr_value_at(s, n, b);
            if (r != NOPE) return r;
        }
    }
    return NOPE;
}

/* one attribute of html.parser's attrfind_tolerant (the same as the attribute part
 * of locatestarttagend_tolerant): after a quote, \s or '/', a name of [^\s/>]
 * then [^\s/=>]*, an optional =value, then (?:\s|/(?!>))* */
static size_t attr(const int32_t *s, size_t n, size_t p) {
    if (p == 0 || p >= n) return NOPE;
    int32_t pc = s[p - 1];
    if (!(pc == '\'' || pc == '"' || pc == '/' || is_space(pc))) return NOPE;
    if (is_space(s[p]) || s[p] == '/' || s[p] == '>') return NOPE;
    size_t q = p + 1;
    while (q < n && !is_space(s[q]) && s[q] != '/' && s[q] != '=' && s[q] != '>') q++;
    size_t v = attr_eq_value(s, n, q);
    return skip_ws_slash(s, n, v != NOPE ? v : q);
}

/* where a run of attributes from p ends. A position's run does not depend on
 * how it was reached, so each one is worked out once: text like "<a <b <c ..."
 * (every "<x" an attribute of the tags before it) stays linear. */
static size_t attr_chain(soup *b, size_t p) {
    if (!b->chain && !(b->chain = calloc(b->n + 1, sizeof *b->chain))) {
        b->oom = 1;
        return p;
    }
    size_t e = p;
    for (size_t m; !b->chain[e] && (m = attr(b->s, b->n, e)) != NOPE;) e = m;
    e = b->chain[e] ? b->chain[e] - 1 : e;
    for (size_t q = p; !b->chain[q];) {
        size_t m = attr(b->s, b->n, q);
        b->chain[q] = e + 1;
        if (m == NOPE) break;
        q = m;
    }
    return e;
}

/* check_for_whole_start_tag: the end of the start tag at i ('<' + letter), or
 * NOPE when it may still be incomplete */
static size_t whole_start_tag(soup *b, size_t i) {
    const int32_t *s = b->s;
    size_t n = b->n, j = name_run(b, i + 2);
    while (j < n && (is_space(s[j]) || s[j] == '/')) j++;
    j = run(s, n, attr_chain(b, j), is_space);
    if (j >= n) return NOPE;
    if (s[j] == '>') return j + 1;
    if (s[j] == '/') return j + 1 < n && s[j + 1] == '>' ? j + 2 : NOPE;
    if (is_alpha(s[j]) || s[j] == '=') return NOPE;
    return j > i ? j : i + 1;
}

static size_t parse_starttag(soup *b, size_t i) {
    const int32_t *s = b->s;
    size_t n = b->n, endpos = whole_start_tag(b, i);
    if (endpos == NOPE) return NOPE;
    size_t name_end = name_run(b, i + 2), k = skip_ws_slash(s, n, name_end);
    while (k < endpos) {
        size_t m = attr(s, n, k);
        if (m == NOPE) break;
        k = m;
    }
    /* what is left before endpos, stripped, must be ">" or "/>" */
    size_t a = k < endpos ? k : endpos, e = endpos;
    while (a < e && is_space(s[a])) a++;
    while (e > a && is_space(s[e - 1])) e--;
    int gt = e - a == 1 && s[a] == '>', slash_gt = e - a == 2 && s[a] == '/' && s[a + 1] == '>';
    if (!gt && !slash_gt) {
        data(b, s + i, endpos - i);
        return endpos;
    }
    int id = intern(b, i + 1, name_end);
    if (id < 0) {
        b->oom = 1;
        return endpos;
    }
    start_tag(b, id, slash_gt);
    if (gt && (b->names[id].kind & K_CDATA)) b->cdata = id;
    return endpos;
}

static size_t parse_bogus_comment(soup *b, size_t i) {
    size_t g = next_gt(b, i + 2);
    if (g == NOPE) return NOPE;
    skipped_markup(b);
    return g + 1;
}

static size_t parse_endtag(soup *b, size_t i) {
    const int32_t *s = b->s;
    size_t n = b->n, gt = next_gt(b, i + 1);
    if (gt == NOPE) return NOPE;
    gt++;
    /* endtagfind: </ \s* [a-zA-Z][-.a-zA-Z0-9:_]* \s* > */
    size_t na = run(s, n, i + 2, is_space), nb = NOPE;
    if (na < n && is_alpha(s[na])) {
        size_t q = na + 1;
        while (q < n && (is_alnum(s[q]) || s[q] == '-' || s[q] == '.' || s[q] == ':' || s[q] == '_')) q++;
        size_t r = run(s, n, q, is_space);
        if (r < n && s[r] == '>') nb = q;
    }
    if (nb == NOPE) {
        if (b->cdata >= 0) {
            data(b, s + i, gt - i);
            return gt;
        }
        if (!(i + 2 < n && is_alpha(s[i + 2]))) return i + 2 < n && s[i + 2] == '>' ? i + 3 : parse_bogus_comment(b, i);
        size_t q = name_run(b, i + 3);
        int id = intern(b, i + 2, q);
        if (id < 0) {
            b->oom = 1;
            return gt;
        }
        size_t g = next_gt(b, skip_ws_slash(s, n, q));
        DL_ASSERT(g != NOPE);
        end_tag(b, id);
        return g + 1;
    }
    int id = intern(b, na, nb);
    if (id < 0) {
        b->oom = 1;
        return gt;
    }
    if (b->cdata >= 0 && id != b->cdata) {
        data(b, s + i, gt - i);
        return gt;
    }
    end_tag(b, id);
    b->cdata = -1;
    return gt;
}

static size_t parse_comment(soup *b, size_t i) {
    const int32_t *s = b->s;
    size_t n = b->n;
    if (!cache_hit(&b->comment, i + 4)) {
        b->comment = (search_cache){i + 4, NOPE, NOPE};
        for (size_t q = i + 4; q + 1 < n; q++) {
            if (s[q] != '-' || s[q + 1] != '-') continue;
            size_t r = run(s, n, q + 2, is_space);
            if (r < n && s[r] == '>') {
                b->comment.at = q, b->comment.end = r + 1;
                break;
            }
        }
    }
    if (b->comment.at == NOPE) return NOPE;
    skipped_markup(b);
    return b->comment.end;
}

/* "<![name ...": the standard sections end at ]\s*]\s*>, Microsoft's at ]\s*>;
 * a CDATA section's text is a string of .text. Anything else there makes
 * _markupbase raise, which BeautifulSoup turns into ParserRejectedMarkup. */
static size_t parse_marked_section(soup *b, size_t i) {
    const int32_t *s = b->s;
    size_t n = b->n, p = i + 3;
    if (p == n) return NOPE;
    if (!is_alpha(s[p])) {
        b->rejected = 1;
        return NOPE;
    }
    size_t q = p + 1;
    while (q < n && (is_alnum(s[q]) || s[q] == '-' || s[q] == '_' || s[q] == '.')) q++;
    if (run(s, n, q, is_space) == n) return NOPE;
    static const char *const std[] = {"temp", "cdata", "ignore", "include", "rcdata"};
    static const char *const ms[] = {"if", "else", "endif"};
    int twice = -1;
    for (size_t k = 0; k < 5; k++)
        if (q - p == strlen(std[k]) && lit_ci(s, n, p, std[k])) twice = 1;
    for (size_t k = 0; k < 3; k++)
        if (q - p == strlen(ms[k]) && lit_ci(s, n, p, ms[k])) twice = 0;
    if (twice < 0) {
        b->rejected = 1;
        return NOPE;
    }
    search_cache *c = &b->section[twice];
    if (!cache_hit(c, p)) {
        *c = (search_cache){p, NOPE, NOPE};
        for (size_t m = p; m < n; m++) {
            if (s[m] != ']') continue;
            size_t r = run(s, n, m + 1, is_space);
            if (twice) {
                if (r >= n || s[r] != ']') continue;
                r = run(s, n, r + 1, is_space);
            }
            if (r < n && s[r] == '>') {
                c->at = m, c->end = r + 1;
                break;
            }
        }
    }
    if (c->at == NOPE) return NOPE;
    end_data(b, STR_TEXT);
    if (c->at - p >= 6 && lit_ci(s, n, p, "cdata[")) {
        data(b, s + p + 6, c->at - p - 6);
        end_data(b, STR_CDATA);
    }
    return c->end;
}

static size_t parse_html_declaration(soup *b, size_t i) {
    const int32_t *s = b->s;
    size_t n = b->n;
    if (lit(s, n, i, "<!--")) return parse_comment(b, i);
    if (lit(s, n, i, "<![")) return parse_marked_section(b, i);
    if (lit_ci(s, n, i, "<!doctype")) {
        size_t g = next_gt(b, i + 9);
        if (g == NOPE) return NOPE;
        skipped_markup(b);
        return g + 1;
    }
    return parse_bogus_comment(b, i);
}

/* in script/style raw text: the next </\s*name\s*> */
static size_t cdata_close(const soup *b, size_t i) {
    const int32_t *s = b->s;
    size_t n = b->n;
    const tname *t = &b->names[b->cdata];
    const char *w = t->len == 6 ? "script" : "style";
    for (size_t q = i; q + 1 < n; q++) {
        if (s[q] != '<' || s[q + 1] != '/') continue;
        size_t r = run(s, n, q + 2, is_space);
        if (!lit_ci(s, n, r, w)) continue;
        r = run(s, n, r + strlen(w), is_space);
        if (r < n && s[r] == '>') return q;
    }
    return NOPE;
}

/* &... outside raw text: returns the new position, or NOPE to stop this pass */
static size_t ampersand(soup *b, size_t i, int end) {
    const int32_t *s = b->s;
    size_t n = b->n;
    if (i + 1 < n && s[i + 1] == '#') {
        /* &#[0-9]+ or &#[xX][0-9a-fA-F]+, then a character that is no hex digit */
        size_t d = i + 2, t = NOPE;
        int hex = 0;
        while (d < n && s[d] >= '0' && s[d] <= '9') d++;
        if (d > i + 2 && d < n && !is_hex(s[d])) t = d;
        else if (i + 2 < n && (s[i + 2] == 'x' || s[i + 2] == 'X')) {
            d = run(s, n, i + 3, is_hex);
            if (d > i + 3 && d < n && !is_hex(s[d])) t = d, hex = 1;
        }
        if (t != NOPE) {
            char_ref(b, i + 2 + (size_t)hex, t, hex);
            return s[t] == ';' ? t + 1 : t;
        }
        if (find(s, n, i, ';') != NOPE) {
            data(b, s + i, 2);
            b->base = i + 2;
        } else {
            b->base = i;
        }
        return NOPE;
    }
    if (i + 1 < n && is_alpha(s[i + 1])) {
        /* &[a-zA-Z][-.a-zA-Z0-9]* then a character that is not alphanumeric: at the
         * end of the text the name backs off to its last '-' or '.' */
        size_t e = i + 2, t = NOPE;
        while (e < n && (is_alnum(s[e]) || s[e] == '-' || s[e] == '.')) e++;
        if (e < n) t = e;
        else
            for (size_t q = e; q-- > i + 2;)
                if (s[q] == '-' || s[q] == '.') {
                    t = q;
                    break;
                }
        if (t != NOPE) {
            entity_ref(b, i + 1, t);
            return s[t] == ';' ? t + 1 : t;
        }
        b->base = end && n - i == 2 ? i + 1 : i; /* "&x" closing the text loses its '&' */
        return NOPE;
    }
    if (i + 1 < n) {
        data(b, s + i, 1);
        return i + 1;
    }
    b->base = i;
    return NOPE;
}

/* HTMLParser.goahead: one pass from base; end is close()'s pass */
static void goahead(soup *b, int end) {
    const int32_t *s = b->s;
    size_t n = b->n, i = b->base;
    while (i < n && !b->rejected && !b->oom) {
        size_t j;
        if (b->cdata >= 0) {
            j = cdata_close(b, i);
            if (j == NOPE) break;
        } else {
            for (j = i; j < n && s[j] != '<' && s[j] != '&';) j++;
        }
        if (i < j) data(b, s + i, j - i);
        i = j;
        if (i == n) break;
        if (s[i] == '&') {
            size_t k = ampersand(b, i, end);
            if (k == NOPE) {
                i = b->base;
                break;
            }
            i = k;
            continue;
        }
        size_t k;
        if (i + 1 < n && is_alpha(s[i + 1])) k = parse_starttag(b, i);
        else if (lit(s, n, i, "</")) k = parse_endtag(b, i);
        else if (lit(s, n, i, "<!--")) k = parse_comment(b, i);
        else if (lit(s, n, i, "<?")) k = parse_bogus_comment(b, i); /* a processing instruction: to '>' */
        else if (lit(s, n, i, "<!")) k = parse_html_declaration(b, i);
        else if (i + 1 < n) {
            data(b, s + i, 1);
            k = i + 1;
        } else
            break;
        if (b->rejected) return;
        if (k == NOPE) {
            if (!end) break;
            /* close(): the unfinished construct is text up to the next '>' (kept) or '<' */
            k = next_gt(b, i + 1);
            if (k == NOPE) {
                k = find(s, n, i + 1, '<');
                if (k == NOPE) k = i + 1;
            } else {
                k++;
            }
            data(b, s + i, k - i);
        }
        i = k;
    }
    if (end && i < n && b->cdata < 0) {
        data(b, s + i, n - i);
        i = n;
    }
    b->base = i;
}

/* BeautifulSoup(in, features="html.parser").text into out */
static dl_status soup_text(const ustr *in, ustr *out) {
    soup b = {.s = in->c, .n = in->n, .out = out, .cdata = -1};
    b.gt.from = b.comment.from = b.section[0].from = b.section[1].from = b.name_run.from = NOPE;
    goahead(&b, 0);
    if (!b.rejected && !b.oom) goahead(&b, 1);
    end_data(&b, STR_TEXT);
    free(b.cur.c), free(b.names), free(b.tab), free(b.stack), free(b.containers), free(b.chain);
    if (b.rejected)
        return dl_fail(DL_ERR_INVALID, "the prompt holds a \"<![\" that opens no known marked section: "
                                       "Open-Sora's HTML parser rejects it (ParserRejectedMarkup)");
    return b.oom ? dl_fail(DL_ERR_NOMEM, "out of memory") : DL_OK;
}

/* ---- the substitutions ---- */

/* A matcher: the end of the match that starts at p, or NOPE. None matches empty. */
typedef size_t (*matcher)(const int32_t *s, size_t n, size_t p, void *st);

/* re.sub: every leftmost match, scanning on from the end of the last one, becomes
 * rep (ASCII) */
static int sub(const ustr *in, ustr *out, matcher m, void *st, const char *rep) {
    size_t last = 0;
    for (size_t p = 0; p < in->n;) {
        size_t e = m(in->c, in->n, p, st);
        if (e == NOPE) {
            p++;
            continue;
        }
        DL_ASSERT(e > p);
        if (!u_add(out, in->c + last, p - last) || !u_lit(out, rep)) return 0;
        p = last = e;
    }
    return u_add(out, in->c + last, in->n - last);
}

/* runs of one class: each run of at least min members becomes rep (NULL: deleted) */
static int sub_runs(const ustr *in, ustr *out, int (*cls)(int32_t), size_t min, const char *rep) {
    const int32_t *s = in->c;
    size_t n = in->n;
    for (size_t i = 0; i < n;) {
        size_t e = run(s, n, i, cls);
        if (e == i) {
            if (!u_put(out, s[i++])) return 0;
            continue;
        }
        if (e - i < min ? !u_add(out, s + i, e - i) : rep && !u_lit(out, rep)) return 0;
        i = e;
    }
    return 1;
}

/* https?: or www: (the two URL rules), then 1-3 slashes or one [a-zA-Z0-9%] */
static size_t url_scheme(const int32_t *s, size_t n, size_t p, int www) {
    size_t q;
    if (www) {
        if (!lit(s, n, p, "www:")) return NOPE;
        q = p + 4;
    } else {
        if (!lit(s, n, p, "http")) return NOPE;
        q = p + 4; /* s? backs off to nothing only to find the ':' there, where the 's' is */
        if (lit(s, n, q, "s:")) q += 2;
        else if (lit(s, n, q, ":")) q += 1;
        else return NOPE;
    }
    if (q < n && s[q] == '/') {
        size_t e = q + 1;
        while (e < n && e < q + 3 && s[e] == '/') e++;
        return e;
    }
    return q < n && (is_alnum(s[q]) || s[q] == '%') ? q + 1 : NOPE;
}

static int url_host(int32_t c) { return is_alnum(c) || c == '.' || c == '-'; } /* [a-zA-Z0-9.\-] */
static int url_path(int32_t c) { return is_word(c) || c == '/' || c == '-'; }  /* [\w/-] */

/* the URL rules' host alternative after its [.] at d: a top-level domain (tried
 * in the rule's order), [\w/-]* backing off until \b holds, then \/? and no '@'
 * next. Depends on d only, not on where the host started. */
static size_t url_after_dot(const int32_t *s, size_t n, size_t d) {
    static const char *const tld[] = {"com", "co", "ru", "net", "org", "edu", "gov", "it"};
    for (size_t k = 0; k < sizeof tld / sizeof tld[0]; k++) {
        if (!lit(s, n, d + 1, tld[k])) continue;
        size_t e = d + 1 + strlen(tld[k]), m = run(s, n, e, url_path);
        for (size_t q = m + 1; q-- > e;) {
            if (!at_b(s, n, q)) continue;
            if (q < n && s[q] == '/' && !(q + 1 < n && s[q + 1] == '@')) return q + 1;
            if (!(q < n && s[q] == '@')) return q;
        }
    }
    return NOPE;
}

/* the host alternative's answer for the current [a-zA-Z0-9.\-] run: the largest
 * dot with a match after it (the greedy run backs off from the right), found once
 * per run from its first start; a later start in the run only loses the dots
 * before it */
typedef struct {
    int www;
    size_t run_start, run_end, dot, end;
} url_state;

/* \b((?:SCHEME(?:\/{1,3}|[a-zA-Z0-9%])|[a-zA-Z0-9.\-]+[.](?:com|co|...)[\w/-]*\b\/?(?!@))) */
static size_t m_url(const int32_t *s, size_t n, size_t p, void *vst) {
    url_state *st = vst;
    if (!at_b(s, n, p)) return NOPE;
    size_t e = url_scheme(s, n, p, st->www);
    if (e != NOPE) return e;
    if (!url_host(s[p])) return NOPE;
    if (st->run_end == NOPE || p < st->run_start || p >= st->run_end) {
        st->run_start = p, st->run_end = run(s, n, p, url_host), st->dot = NOPE;
        for (size_t d = st->run_end; d-- > p + 1;)
            if (s[d] == '.' && (st->end = url_after_dot(s, n, d)) != NOPE) {
                st->dot = d;
                break;
            }
    }
    return st->dot != NOPE && st->dot > p ? st->end : NOPE;
}

/* @[\w\d]+\b: the greedy run ends where \b holds */
static size_t m_nick(const int32_t *s, size_t n, size_t p, void *st) {
    return s[p] == '@' && p + 1 < n && is_word(s[p + 1]) ? run(s, n, p + 1, is_word) : NOPE;
}

static int is_dash(int32_t c) {
    static const int32_t d[] = {0x2d, 0x58a, 0x5be, 0x1400, 0x1806, 0x2e17, 0x2e1a, 0x2e3a, 0x2e3b,
                                0x2e40, 0x301c, 0x3030, 0x30a0, 0xfe31, 0xfe32, 0xfe58, 0xfe63, 0xff0d};
    if (c >= 0x2010 && c <= 0x2015) return 1;
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (c == d[i]) return 1;
    return 0;
}

static size_t m_quot(const int32_t *s, size_t n, size_t p, void *st) { /* &quot;? */
    return lit(s, n, p, "&quot") ? p + 5 + (p + 5 < n && s[p + 5] == ';') : NOPE;
}

static size_t m_amp(const int32_t *s, size_t n, size_t p, void *st) { return lit(s, n, p, "&amp") ? p + 4 : NOPE; }

/* \d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}: the first three groups must be whole digit
 * runs of 1-3 (a '.' must follow), the last takes up to 3 */
static size_t m_ip(const int32_t *s, size_t n, size_t p, void *st) {
    size_t q = p;
    for (int g = 0;; g++) {
        size_t r = q;
        while (r < n && r < q + 3 && is_digit(s[r])) r++;
        if (r == q) return NOPE;
        if (g == 3) return r;
        if (!(r < n && s[r] == '.')) return NOPE;
        q = r + 1;
    }
}

static size_t m_backslash_n(const int32_t *s, size_t n, size_t p, void *st) { /* the two characters \n */
    return lit(s, n, p, "\\n") ? p + 2 : NOPE;
}

/* #\d{lo,hi}\b: \b only holds after the whole digit run, so its length decides */
typedef struct {
    size_t lo, hi;
} span;

static size_t m_hash_num(const int32_t *s, size_t n, size_t p, void *vst) {
    const span *sp = vst;
    if (s[p] != '#') return NOPE;
    size_t r = run(s, n, p + 1, is_digit);
    return r - p - 1 >= sp->lo && r - p - 1 <= sp->hi && !(r < n && is_word(s[r])) ? r : NOPE;
}

/* \b\d{6,}\b */
static size_t m_long_num(const int32_t *s, size_t n, size_t p, void *st) {
    if (!is_digit(s[p]) || !at_b(s, n, p)) return NOPE;
    size_t r = run(s, n, p, is_digit);
    return r - p >= 6 && !(r < n && is_word(s[r])) ? r : NOPE;
}

static const char *const k_ext[] = {"png", "jpg", "jpeg", "bmp", "webp", "eps", "pdf", "apk", "mp4"};

/* one of the extensions at p, in the rule's order: its end */
static size_t ext_at(const int32_t *s, size_t n, size_t p) {
    for (size_t k = 0; k < sizeof k_ext / sizeof k_ext[0]; k++)
        if (lit(s, n, p, k_ext[k])) return p + strlen(k_ext[k]);
    return NOPE;
}

/* [\S]+\.(?:png|jpg|...): in each run of non-space the greedy [\S]+ backs off from
 * the right to the last dot an extension follows (not the run's first character);
 * no later start in the run finds another, so each run is cut at most once */
static int sub_filenames(const ustr *in, ustr *out) {
    const int32_t *s = in->c;
    size_t n = in->n;
    for (size_t i = 0; i < n;) {
        if (is_space(s[i])) {
            if (!u_put(out, s[i++])) return 0;
            continue;
        }
        size_t e = run(s, n, i, not_space), cut = i;
        for (size_t d = e; d-- > i + 1;) {
            size_t x;
            if (s[d] == '.' && (x = ext_at(s, n, d + 1)) != NOPE) {
                cut = x;
                break;
            }
        }
        if (!u_add(out, s + cut, e - cut)) return 0;
        i = e;
    }
    return 1;
}

static int is_quote(int32_t c) { return c == '"' || c == '\''; }
static int is_dot(int32_t c) { return c == '.'; }

static int is_bad_punct(int32_t c) {
    static const int32_t b[] = {'#', 0xae, 0x2022, 0xa9, 0x2122, '&', '@', 0xb7, 0xba, 0xbd, 0xbe, 0xbf, 0xa1,
                                0xa7, '~', ')', '(', ']', '[', '}', '{', '|', '\\', '/', '*'};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (c == b[i]) return 1;
    return 0;
}

/* \s+\.\s+ -> " ": the first \s+ can only end where the '.' is, so a run of
 * spaces either starts a match or no start inside it does */
static int sub_spaced_dot(const ustr *in, ustr *out) {
    const int32_t *s = in->c;
    size_t n = in->n;
    for (size_t i = 0; i < n;) {
        size_t a = run(s, n, i, is_space), b;
        if (a == i) {
            if (!u_put(out, s[i++])) return 0;
        } else if (a < n && s[a] == '.' && (b = run(s, n, a + 1, is_space)) > a + 1) {
            if (!u_put(out, ' ')) return 0;
            i = b;
        } else {
            if (!u_add(out, s + i, a - i)) return 0;
            i = a;
        }
    }
    return 1;
}

/* \b[a-zA-Z]{1,3}\d{3,15}\b: the letters must be the whole run of them (a digit
 * follows), the digits too (\b) */
static size_t m_code(const int32_t *s, size_t n, size_t p, void *st) {
    if (!is_alpha(s[p]) || !at_b(s, n, p)) return NOPE;
    size_t a = run(s, n, p, is_alpha), r = run(s, n, a, is_digit);
    return a - p <= 3 && r - a >= 3 && r - a <= 15 && !(r < n && is_word(s[r])) ? r : NOPE;
}

/* \b[a-zA-Z]+\d+[a-zA-Z]+\b (letters first) or \b\d+[a-zA-Z]+\d+\b: every run is
 * taken whole, the next one needs the other class */
static size_t m_sandwich(const int32_t *s, size_t n, size_t p, void *vst) {
    int digits_first = *(const int *)vst;
    int (*outer)(int32_t) = digits_first ? is_digit : is_alpha, (*inner)(int32_t) = digits_first ? is_alpha : is_digit;
    if (!outer(s[p]) || !at_b(s, n, p)) return NOPE;
    size_t a = run(s, n, p, outer), b = run(s, n, a, inner), c = run(s, n, b, outer);
    return b > a && c > b && !(c < n && is_word(s[c])) ? c : NOPE;
}

/* WORD\s+ at p: its end, or NOPE (the \s+ can only end at the run's end) */
static size_t word_spaces(const int32_t *s, size_t n, size_t p, const char *w) {
    if (!lit(s, n, p, w)) return NOPE;
    size_t q = p + strlen(w), r = run(s, n, q, is_space);
    return r > q ? r : NOPE;
}

/* (worldwide\s+)?(free\s+)?shipping, the optional groups tried first */
static size_t m_shipping(const int32_t *s, size_t n, size_t p, void *st) {
    size_t w = word_spaces(s, n, p, "worldwide"), f;
    if (w != NOPE) {
        if ((f = word_spaces(s, n, w, "free")) != NOPE && lit(s, n, f, "shipping")) return f + 8;
        if (lit(s, n, w, "shipping")) return w + 8;
    }
    if ((f = word_spaces(s, n, p, "free")) != NOPE && lit(s, n, f, "shipping")) return f + 8;
    return lit(s, n, p, "shipping") ? p + 8 : NOPE;
}

/* (free\s)?download(\sfree)? */
static size_t m_download(const int32_t *s, size_t n, size_t p, void *st) {
    size_t e;
    if (lit(s, n, p, "free") && p + 4 < n && is_space(s[p + 4]) && lit(s, n, p + 5, "download")) e = p + 13;
    else if (lit(s, n, p, "download")) e = p + 8;
    else return NOPE;
    return e < n && is_space(s[e]) && lit(s, n, e + 1, "free") ? e + 5 : e;
}

/* \bclick\b\s(?:for|on)\s\w+ */
static size_t m_click(const int32_t *s, size_t n, size_t p, void *st) {
    if (!lit(s, n, p, "click") || !at_b(s, n, p) || !(p + 5 < n && is_space(s[p + 5]))) return NOPE;
    size_t q = p + 6, w;
    if (lit(s, n, q, "for") && q + 3 < n && is_space(s[q + 3])) w = q + 4;
    else if (lit(s, n, q, "on") && q + 2 < n && is_space(s[q + 2])) w = q + 3;
    else return NOPE;
    size_t r = run(s, n, w, is_word);
    return r > w ? r : NOPE;
}

/* \b(?:png|jpg|...)(\simage[s]?)? (no \b after: "pngs" loses "png") */
static size_t m_ext_word(const int32_t *s, size_t n, size_t p, void *st) {
    if (!is_alpha(s[p]) || !at_b(s, n, p)) return NOPE;
    size_t e = ext_at(s, n, p);
    if (e == NOPE || !(e < n && is_space(s[e]) && lit(s, n, e + 1, "image"))) return e;
    e += 6;
    return e < n && s[e] == 's' ? e + 1 : e;
}

/* \bpage\s+\d+\b */
static size_t m_page(const int32_t *s, size_t n, size_t p, void *st) {
    if (!at_b(s, n, p)) return NOPE;
    size_t q = word_spaces(s, n, p, "page");
    if (q == NOPE) return NOPE;
    size_t r = run(s, n, q, is_digit);
    return r > q && !(r < n && is_word(s[r])) ? r : NOPE;
}

/* \b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b: each run up to the last is whole
 * (the next needs the other class); the tail ends at the end of [a-zA-Z\d], where
 * \b needs a non-word character, and backing off finds no other \b */
static size_t m_mixed(const int32_t *s, size_t n, size_t p, void *st) {
    if (!at_b(s, n, p)) return NOPE;
    size_t q = run(s, n, p, is_digit);
    for (int k = 0; k < 4; k++) {
        size_t r = run(s, n, q, k % 2 ? is_digit : is_alpha);
        if (r == q) return NOPE;
        q = r;
    }
    q = run(s, n, q, is_alpha_or_digit);
    return q < n && is_word(s[q]) ? NOPE : q;
}

static int is_times(int32_t c) { return c == 'x' || c == 0x445 || c == 0xd7; } /* [xх×] */

/* \b\d+\.?\d*[xх×]\d+\.?\d*\b. Before the x: the digits, and when a '.' follows,
 * the digits after it (any shorter split puts a digit or the '.' where the x
 * must be). After it: digits to c; with a '.' at c the match ends after the
 * digits that follow it when \b holds there, else just after the '.' when a
 * digit follows it, else before the '.'; without one only at c, before a
 * non-word character. */
static size_t m_dims(const int32_t *s, size_t n, size_t p, void *st) {
    if (!is_digit(s[p]) || !at_b(s, n, p)) return NOPE;
    size_t x = run(s, n, p, is_digit);
    if (x < n && s[x] == '.') x = run(s, n, x + 1, is_digit);
    if (!(x < n && is_times(s[x]))) return NOPE;
    size_t c = run(s, n, x + 1, is_digit);
    if (c == x + 1) return NOPE;
    if (c < n && s[c] == '.') {
        size_t e = run(s, n, c + 1, is_digit);
        return at_b(s, n, e) ? e : e > c + 1 ? c + 1 : c;
    }
    return c < n && is_word(s[c]) ? NOPE : c;
}

/* \b\s+\:\s+ -> ": " (the \b is after a word character) */
static size_t m_colon(const int32_t *s, size_t n, size_t p, void *st) {
    if (!is_space(s[p]) || !at_b(s, n, p)) return NOPE;
    size_t a = run(s, n, p, is_space);
    if (!(a < n && s[a] == ':')) return NOPE;
    size_t b = run(s, n, a + 1, is_space);
    return b > a + 1 ? b : NOPE;
}

/* (\D[,\./])\b -> "\1 ": a space after , . or / between a non-digit and a word
 * character */
static int sub_punct_space(const ustr *in, ustr *out) {
    const int32_t *s = in->c;
    size_t n = in->n;
    for (size_t p = 0; p < n;) {
        int32_t c = p + 1 < n ? s[p + 1] : 0;
        if (!is_digit(s[p]) && (c == ',' || c == '.' || c == '/') && p + 2 < n && is_word(s[p + 2])) {
            if (!u_add(out, s + p, 2) || !u_put(out, ' ')) return 0;
            p += 2;
        } else if (!u_put(out, s[p++])) {
            return 0;
        }
    }
    return 1;
}

/* ---- clean_caption ---- */

/* ftfy.fix_text, html.unescape twice, str.strip (basic_clean). U+0000 goes
 * first: fix_text removes it anyway, and dl_text_ftfy_fix takes a C string. */
static dl_status basic_clean(const ustr *in, ustr *out) {
    sbuf u = {0};
    int ok = dl_sbuf_put(&u, "", 0);
    for (size_t i = 0; ok && i < in->n; i++)
        if (in->c[i]) ok = dl_sbuf_putc32(&u, in->c[i]);
    if (!ok) {
        dl_sbuf_free(&u);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    char *f = NULL, *h1 = NULL, *h2 = NULL;
    dl_status st = dl_text_ftfy_fix(u.p, &f, NULL);
    dl_sbuf_free(&u);
    if (st == DL_OK) st = dl_html_unescape(f, strlen(f), &h1);
    if (st == DL_OK) st = dl_html_unescape(h1, strlen(h1), &h2);
    if (st == DL_OK) {
        size_t a, b;
        dl_text_strip(h2, strlen(h2), &a, &b);
        if (!u_utf8(out, h2 + a, b - a)) st = dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    free(f), free(h1), free(h2);
    return st;
}

/* One step of clean_caption, in -> out; 0 on allocation failure. */
typedef enum {
    S_UNQUOTE, S_STRIP_LOWER, S_PERSON, S_URL, S_WWW, S_HTML, S_NICK, S_CJK, S_DASH, S_QUOTES, S_AMP_QUOT, S_AMP,
    S_IP, S_ARTICLE, S_BACKSLASH_N, S_HASH3, S_HASH5, S_NUM6, S_FILES, S_QUOTE_RUN, S_DOTS, S_BAD_PUNCT,
    S_SPACED_DOT, S_DASHED_WORDS, S_BASIC_CLEAN, S_CODE, S_LDL, S_DLD, S_SHIPPING, S_DOWNLOAD, S_CLICK,
    S_EXT_WORD, S_PAGE, S_MIXED, S_DIMS, S_COLON, S_PUNCT_SPACE, S_WS, S_UNQUOTE_ENDS, S_LEAD, S_TRAIL,
    S_DOT_WORD, S_FINAL_STRIP, S_COUNT
} step;

static dl_status run_step(step k, const ustr *in, ustr *out) {
    const int32_t *s = in->c;
    size_t n = in->n;
    int ok = 1;
    switch (k) {
    case S_UNQUOTE: ok = unquote_plus(in, out); break;
    case S_STRIP_LOWER: {
        ustr t = {0};
        ok = py_strip(in, &t) && py_lower(t.c, t.n, out);
        free(t.c);
        break;
    }
    case S_PERSON:
        for (size_t i = 0; ok && i < n;)
            if (lit(s, n, i, "<person>")) ok = u_lit(out, "person"), i += 8;
            else ok = u_put(out, s[i++]);
        break;
    case S_URL:
    case S_WWW: {
        url_state st = {k == S_WWW, 0, NOPE, NOPE, NOPE};
        ok = sub(in, out, m_url, &st, "");
        break;
    }
    case S_HTML: return soup_text(in, out);
    case S_NICK: ok = sub(in, out, m_nick, NULL, ""); break;
    case S_CJK: /* the seven CJK block removals together: U+31C0..U+9FFF */
        for (size_t i = 0; ok && i < n; i++)
            if (s[i] < 0x31c0 || s[i] > 0x9fff) ok = u_put(out, s[i]);
        break;
    case S_DASH: ok = sub_runs(in, out, is_dash, 1, "-"); break;
    case S_QUOTES: /* [`´«»“”¨] -> '"', then [‘’] -> "'" */
        for (size_t i = 0; ok && i < n; i++) {
            int32_t c = s[i];
            if (c == '`' || c == 0xb4 || c == 0xab || c == 0xbb || c == 0x201c || c == 0x201d || c == 0xa8) c = '"';
            else if (c == 0x2018 || c == 0x2019) c = '\'';
            ok = u_put(out, c);
        }
        break;
    case S_AMP_QUOT: ok = sub(in, out, m_quot, NULL, ""); break;
    case S_AMP: ok = sub(in, out, m_amp, NULL, ""); break;
    case S_IP: ok = sub(in, out, m_ip, NULL, " "); break;
    case S_ARTICLE: { /* \d:\d\d\s+$: only just before the trailing whitespace */
        size_t w = n;
        while (w > 0 && is_space(s[w - 1])) w--;
        int hit = w < n && w >= 4 && is_digit(s[w - 4]) && s[w - 3] == ':' && is_digit(s[w - 2]) && is_digit(s[w - 1]);
        ok = u_add(out, s, hit ? w - 4 : n);
        break;
    }
    case S_BACKSLASH_N: ok = sub(in, out, m_backslash_n, NULL, " "); break;
    case S_HASH3: {
        span sp = {1, 3};
        ok = sub(in, out, m_hash_num, &sp, "");
        break;
    }
    case S_HASH5: {
        span sp = {5, SIZE_MAX};
        ok = sub(in, out, m_hash_num, &sp, "");
        break;
    }
    case S_NUM6: ok = sub(in, out, m_long_num, NULL, ""); break;
    case S_FILES: ok = sub_filenames(in, out); break;
    case S_QUOTE_RUN: ok = sub_runs(in, out, is_quote, 2, "\""); break;
    case S_DOTS: ok = sub_runs(in, out, is_dot, 2, " "); break;
    case S_BAD_PUNCT: ok = sub_runs(in, out, is_bad_punct, 1, " "); break;
    case S_SPACED_DOT: ok = sub_spaced_dot(in, out); break;
    case S_DASHED_WORDS: { /* this-is-my-cute-cat: more than three '-' / '_' become spaces */
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += s[i] == '-' || s[i] == '_';
        for (size_t i = 0; ok && i < n; i++) ok = u_put(out, m > 3 && (s[i] == '-' || s[i] == '_') ? ' ' : s[i]);
        break;
    }
    case S_BASIC_CLEAN: return basic_clean(in, out);
    case S_CODE: ok = sub(in, out, m_code, NULL, ""); break;
    case S_LDL:
    case S_DLD: {
        int digits_first = k == S_DLD;
        ok = sub(in, out, m_sandwich, &digits_first, "");
        break;
    }
    case S_SHIPPING: ok = sub(in, out, m_shipping, NULL, ""); break;
    case S_DOWNLOAD: ok = sub(in, out, m_download, NULL, ""); break;
    case S_CLICK: ok = sub(in, out, m_click, NULL, ""); break;
    case S_EXT_WORD: ok = sub(in, out, m_ext_word, NULL, ""); break;
    case S_PAGE: ok = sub(in, out, m_page, NULL, ""); break;
    case S_MIXED: ok = sub(in, out, m_mixed, NULL, " "); break;
    case S_DIMS: ok = sub(in, out, m_dims, NULL, ""); break;
    case S_COLON: ok = sub(in, out, m_colon, NULL, ": "); break;
    case S_PUNCT_SPACE: ok = sub_punct_space(in, out); break;
    case S_WS: ok = sub_runs(in, out, is_space, 1, " "); break;
    case S_UNQUOTE_ENDS: /* ^["']([\w\W]+)["']$ -> \1 (no newline is left for $ to stop before) */
        ok = n >= 3 && is_quote(s[0]) && is_quote(s[n - 1]) ? u_add(out, s + 1, n - 2) : u_add(out, s, n);
        break;
    case S_LEAD: { /* ^['_,\-:;] */
        int cut = n && (s[0] == '\'' || s[0] == '_' || s[0] == ',' || s[0] == '-' || s[0] == ':' || s[0] == ';');
        ok = u_add(out, s + cut, n - (size_t)cut);
        break;
    }
    case S_TRAIL: { /* ['_,\-:+]$ */
        int32_t c = n ? s[n - 1] : 0;
        int cut = n && (c == '\'' || c == '_' || c == ',' || c == '-' || c == ':' || c == '+');
        ok = u_add(out, s, n - (size_t)cut);
        break;
    }
    case S_DOT_WORD: /* ^\.\S+$ */
        ok = n >= 2 && s[0] == '.' && run(s, n, 1, not_space) == n ? 1 : u_add(out, s, n);
        break;
    case S_FINAL_STRIP: ok = py_strip(in, out); break;
    case S_COUNT: DL_ASSERT(0);
    }
    return ok ? DL_OK : dl_fail(DL_ERR_NOMEM, "out of memory");
}

dl_status dl_text_clean_caption(const char *text, char **out) {
    *out = NULL;
    size_t len = strlen(text);
    if (len > DL_TOK_MAX_TEXT) return dl_fail(DL_ERR_INVALID, "prompt longer than %u bytes", DL_TOK_MAX_TEXT);
    if (!dl_utf8_valid(text, len)) return dl_fail(DL_ERR_INVALID, "the prompt is not valid UTF-8");
    ustr a = {0}, b = {0};
    dl_status st = u_utf8(&a, text, len) ? DL_OK : dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int pass = 0; pass < 2 && st == DL_OK; pass++) {
        for (step k = 0; k < S_COUNT && st == DL_OK; k++) {
            b.n = 0;
            st = run_step(k, &a, &b);
            ustr t = a;
            a = b, b = t;
        }
    }
    sbuf r = {0};
    if (st == DL_OK) {
        int ok = dl_sbuf_put(&r, "", 0);
        for (size_t i = 0; ok && i < a.n; i++) ok = dl_sbuf_putc32(&r, a.c[i]);
        if (!ok) st = dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    free(a.c), free(b.c);
    if (st != DL_OK) {
        dl_sbuf_free(&r);
        return st;
    }
    *out = r.p;
    return DL_OK;
}
