/* Content hashing with XXH3-64 (libxxhash): program keys and checkpoint identity. */
#include "difflet/base.h"

#include <xxhash.h>

uint64_t dl_hash64(const void *data, size_t len, uint64_t seed) {
    return (uint64_t)XXH3_64bits_withSeed(data, len, (XXH64_hash_t)seed);
}

struct dl_hasher {
    XXH3_state_t *st;
};

dl_hasher *dl_hasher_new(uint64_t seed) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return NULL;
    XXH3_64bits_reset_withSeed(st, (XXH64_hash_t)seed);
    return (dl_hasher *)st;
}

void dl_hasher_update(dl_hasher *h, const void *data, size_t len) {
    XXH3_64bits_update((XXH3_state_t *)h, data, len);
}

uint64_t dl_hasher_digest(const dl_hasher *h) {
    return (uint64_t)XXH3_64bits_digest((const XXH3_state_t *)h);
}

void dl_hasher_free(dl_hasher *h) { XXH3_freeState((XXH3_state_t *)h); }
