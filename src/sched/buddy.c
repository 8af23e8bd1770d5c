/* Buddy allocator over devices grouped in nodes: groups are power-of-two sized and
 * aligned inside one node (a parallel group never spans the slow link between
 * nodes). A bitmap holds which devices are free; freeing needs no merge step since
 * alignment alone defines the buddies. dl_buddy_alloc_any drops the alignment (any
 * devices of one node) for the static-DoP decoupling ablation. */
#include <string.h>

#include "difflet/sched.h"

static int is_free(const dl_buddy *b, int d) { return (b->free_mask[d >> 6] >> (d & 63)) & 1; }
static void set_free(dl_buddy *b, int d, int f) {
    if (f) b->free_mask[d >> 6] |= 1ull << (d & 63);
    else b->free_mask[d >> 6] &= ~(1ull << (d & 63));
}

int dl_buddy_is_free(const dl_buddy *b, int d) { return is_free(b, d); }

dl_status dl_buddy_init(dl_buddy *b, int nodes, int per_node) {
    memset(b, 0, sizeof *b);
    if (nodes < 1 || per_node < 1 || (per_node & (per_node - 1)) || nodes * per_node > 512)
        return dl_fail(DL_ERR_INVALID, "buddy: nodes x devices per node (a power of two) up to 512");
    b->nodes = nodes, b->per_node = per_node;
    for (int d = 0; d < nodes * per_node; d++) set_free(b, d, 1);
    return DL_OK;
}

static int group_free(const dl_buddy *b, int start, int size) {
    for (int d = start; d < start + size; d++)
        if (!is_free(b, d)) return 0;
    return 1;
}

int dl_buddy_alloc(dl_buddy *b, int size) {
    if (size < 1 || size > b->per_node || (size & (size - 1))) return -1;
    int best = -1, best_free = 1 << 30;
    for (int n = 0; n < b->nodes; n++) {
        int nf = 0;
        for (int d = n * b->per_node; d < (n + 1) * b->per_node; d++) nf += is_free(b, d);
        if (nf < size || nf >= best_free) continue;
        for (int s = n * b->per_node; s < (n + 1) * b->per_node; s += size)
            if (group_free(b, s, size)) {
                best = s, best_free = nf;
                break;
            }
    }
    if (best >= 0)
        for (int d = best; d < best + size; d++) set_free(b, d, 0);
    return best;
}

int dl_buddy_alloc_any(dl_buddy *b, int size, uint64_t *mask) {
    *mask = 0;
    if (size < 1 || size > b->per_node || b->per_node > 64) return -1;
    int best = -1, best_free = 1 << 30;
    for (int n = 0; n < b->nodes; n++) {
        int nf = 0;
        for (int d = n * b->per_node; d < (n + 1) * b->per_node; d++) nf += is_free(b, d);
        if (nf >= size && nf < best_free) best = n * b->per_node, best_free = nf;
    }
    for (int d = best, got = 0; best >= 0 && got < size; d++)
        if (is_free(b, d)) set_free(b, d, 0), *mask |= 1ull << (d - best), got++;
    return best;
}

int dl_buddy_grow(dl_buddy *b, int start, int cur, int size) {
    if (size <= cur || size > b->per_node) return -1;
    int base = start / size * size;
    if (base / b->per_node != start / b->per_node) return -1;
    for (int d = base; d < base + size; d++)
        if ((d < start || d >= start + cur) && !is_free(b, d)) return -1;
    for (int d = base; d < base + size; d++) set_free(b, d, 0);
    return base;
}

void dl_buddy_free(dl_buddy *b, int start, int size) {
    for (int d = start; d < start + size; d++) {
        DL_ASSERT(!is_free(b, d)); /* a device freed twice is a scheduler bug */
        set_free(b, d, 1);
    }
}

int dl_buddy_free_count(const dl_buddy *b) {
    int n = 0;
    for (int d = 0; d < b->nodes * b->per_node; d++) n += is_free(b, d);
    return n;
}

int dl_buddy_largest(const dl_buddy *b) {
    for (int size = b->per_node; size >= 1; size /= 2)
        for (int s = 0; s < b->nodes * b->per_node; s += size)
            if ((s % b->per_node) + size <= b->per_node && group_free(b, s, size)) return size;
    return 0;
}
