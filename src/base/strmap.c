/* String -> int32 hash map: linear probing over a power-of-two table of slots that
 * point into one growing key pool. Rebuilt (doubled) at 50% load. */
#include <stdlib.h>
#include <string.h>

#include "difflet/base.h"

typedef struct {
    uint64_t hash;
    size_t off; /* into pool; len == 0 and off == SIZE_MAX marks empty */
    uint32_t len;
    int32_t value;
} slot;

struct dl_strmap {
    slot *slots;
    size_t cap, count;
    char *pool;
    size_t pool_len, pool_cap;
};

static void clear_slots(slot *s, size_t n) {
    for (size_t i = 0; i < n; i++) s[i].off = SIZE_MAX;
}

dl_strmap *dl_strmap_new(size_t expected) {
    dl_strmap *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cap = 16;
    while (m->cap < 2 * expected) m->cap *= 2;
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots) {
        free(m);
        return NULL;
    }
    clear_slots(m->slots, m->cap);
    return m;
}

void dl_strmap_free(dl_strmap *m) {
    if (!m) return;
    free(m->slots);
    free(m->pool);
    free(m);
}

static slot *find_slot(const dl_strmap *m, const char *key, size_t len, uint64_t h) {
    size_t i = (size_t)h & (m->cap - 1);
    for (;;) {
        slot *s = &m->slots[i];
        if (s->off == SIZE_MAX) return s;
        if (s->hash == h && s->len == len && !memcmp(m->pool + s->off, key, len)) return s;
        i = (i + 1) & (m->cap - 1);
    }
}

static int grow(dl_strmap *m) {
    size_t ncap = m->cap * 2;
    slot *ns = malloc(ncap * sizeof *ns);
    if (!ns) return 0;
    clear_slots(ns, ncap);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].off == SIZE_MAX) continue;
        size_t j = (size_t)m->slots[i].hash & (ncap - 1);
        while (ns[j].off != SIZE_MAX) j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 1;
}

dl_status dl_strmap_put(dl_strmap *m, const char *key, size_t len, int32_t value) {
    if (len > UINT32_MAX) return dl_fail(DL_ERR_INVALID, "strmap: key too long");
    if (2 * (m->count + 1) > m->cap && !grow(m)) return dl_fail(DL_ERR_NOMEM, "strmap: out of memory");
    uint64_t h = dl_hash64(key, len, 0);
    slot *s = find_slot(m, key, len, h);
    if (s->off != SIZE_MAX) {
        s->value = value;
        return DL_OK;
    }
    if (m->pool_len + len + 1 > m->pool_cap) {
        size_t nc = m->pool_cap ? m->pool_cap : 4096;
        while (nc < m->pool_len + len + 1) nc *= 2;
        char *np = realloc(m->pool, nc);
        if (!np) return dl_fail(DL_ERR_NOMEM, "strmap: out of memory");
        m->pool = np;
        m->pool_cap = nc;
    }
    memcpy(m->pool + m->pool_len, key, len);
    m->pool[m->pool_len + len] = 0;
    *s = (slot){h, m->pool_len, (uint32_t)len, value};
    m->pool_len += len + 1;
    m->count++;
    return DL_OK;
}

int dl_strmap_get(const dl_strmap *m, const char *key, size_t len, int32_t *value) {
    const slot *s = find_slot(m, key, len, dl_hash64(key, len, 0));
    if (s->off == SIZE_MAX) return 0;
    if (value) *value = s->value;
    return 1;
}

size_t dl_strmap_count(const dl_strmap *m) { return m->count; }

void dl_strmap_foreach(const dl_strmap *m, void (*fn)(void *ctx, const char *key, size_t len, int32_t value), void *ctx) {
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].off != SIZE_MAX) fn(ctx, m->pool + m->slots[i].off, m->slots[i].len, m->slots[i].value);
}
