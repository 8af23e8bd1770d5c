/* Arena: one aligned block sliced by bump allocation. Sizes are planned before the
 * arena is made, so running out is a planning bug reported as an error, never a
 * silent reallocation. */
#include "difflet/base.h"

#include <stdlib.h>
#include <string.h>

struct dl_arena {
    uint8_t *base;
    size_t cap;
    size_t used;
};

void *dl_aligned_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = DL_ALIGN;
    if (posix_memalign(&p, DL_ALIGN, dl_align_up(bytes, DL_ALIGN)) != 0) return NULL;
    return p;
}

void dl_aligned_free(void *p) { free(p); }

dl_status dl_arena_new(dl_arena **out, size_t capacity) {
    *out = NULL;
    dl_arena *a = calloc(1, sizeof *a);
    if (!a) return dl_fail(DL_ERR_NOMEM, "arena: cannot allocate its header");
    a->cap = dl_align_up(capacity, DL_ALIGN);
    a->base = dl_aligned_alloc(a->cap);
    if (!a->base) {
        free(a);
        return dl_fail(DL_ERR_NOMEM, "arena: cannot allocate %zu bytes", capacity);
    }
    *out = a;
    return DL_OK;
}

void dl_arena_free(dl_arena *a) {
    if (!a) return;
    dl_aligned_free(a->base);
    free(a);
}

void *dl_arena_alloc(dl_arena *a, size_t bytes) {
    size_t n = dl_align_up(bytes ? bytes : 1, DL_ALIGN);
    if (n > a->cap - a->used) {
        dl_fail(DL_ERR_NOMEM, "arena: %zu bytes requested, %zu of %zu free", bytes,
                a->cap - a->used, a->cap);
        return NULL;
    }
    void *p = a->base + a->used;
    a->used += n;
    return p;
}

size_t dl_arena_used(const dl_arena *a) { return a->used; }
size_t dl_arena_capacity(const dl_arena *a) { return a->cap; }
void dl_arena_reset(dl_arena *a) { a->used = 0; }
