/* difflet programs: each component (text encoder, denoiser, VAE decoder) compiled
 * once for a fixed key and cached on disk as an artifact: manifest.json (every key
 * field in clear text, the tensor table with offsets, bytes, layout and checksum,
 * the activation arena size, compile time) and one 64-byte aligned weight blob with
 * the weights already converted and packed in the layout oneDNN chose. Loading maps
 * the blob read-only and builds the primitives over it: no conversion, no reorder,
 * no copy. Runtime settings (steps, guidance, seed, prompt, caching) are not in the
 * key: changing them recompiles nothing. */
#ifndef DIFFLET_PROGRAM_H
#define DIFFLET_PROGRAM_H

#include "difflet/artifact.h"
#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- program keys and the cache ------------------------------------------------------ */

/* The cache root: $DIFFLET_CACHE, else ~/.cache/difflet. */
const char *dl_cache_dir(void);

/* Content hash of a component's checkpoint (every tensor's name, dtype, shape, bytes),
 * remembered in the cache per (file path, size, mtime) so it is computed once. */
dl_status dl_component_hash(dl_model_dir *dir, const char *component, uint64_t *hash);

/* The canonical key JSON of a component: fields sorted, no whitespace; `shape` is a
 * JSON object string with the component's shape fields. *id: 16 hex digits. */
dl_status dl_program_key(dl_model_dir *dir, const char *component, const char *shape_json, dl_dtype dt, dl_quant quant,
                         int probe, char **key_json, char id[17]);
/* The same for one rank's part of a split component: `parallel` is the layout
 * (dl_par_format), `rank` the rank's place in it (tp_rank + tp * cp_rank). */
dl_status dl_program_key_par(dl_model_dir *dir, const char *component, const char *shape_json, dl_dtype dt,
                             dl_quant quant, int probe, const char *parallel, int rank, char **key_json, char id[17]);

/* Statistics of program use in this process (tests: "changing the seed compiles nothing"). */
typedef struct {
    int compiles, loads;
} dl_program_stats;
dl_program_stats dl_program_stats_get(void);

typedef enum {
    DL_CACHE_USE = 0,               /* load on a hit, compile and cache on a miss */
    DL_CACHE_OFF,                   /* build from the checkpoint, write nothing */
    DL_CACHE_RECOMPILE_ON_MISMATCH, /* a corrupt or mismatched artifact is rebuilt */
    DL_CACHE_NO_COMPILE,            /* a miss is an error naming the program */
} dl_cache_mode;

/* Open the cached program `id` (whose key is key_json) for a component, or compile
 * it and cache it. `build(ctx, ws)` loads the model through ws (from the checkpoint
 * while recording, or from the artifact); `build(ctx, NULL)` releases the model it
 * built. A compile releases the model built from the checkpoint and loads the
 * program it wrote, so the process runs from the mapping as every later one will
 * (and holds one component's weights on the heap at a time, not all of them). On
 * success the model is the caller's and *keep the artifact it maps (close it after
 * the model; with DL_CACHE_OFF, NULL).
 * Concurrent compiles of one key are serialised by a lock; a compile killed at any
 * point leaves nothing a later load accepts. Logs one line per compile. */
typedef dl_status (*dl_program_build_fn)(void *ctx, dl_wsrc *ws);
/* `quant`: the int8 scheme of the component's linears (dl_wsrc.quant); DL_QUANT_NONE
 * for the others and for components that stay in f32/bf16. */
dl_status dl_program_get(dl_model_dir *dir, const char *component, const char *key_json, const char *id,
                         dl_cache_mode mode, dl_quant quant, dl_program_build_fn build, void *ctx, dl_artifact **keep);

/* `difflet cache ls | verify | rm` */
typedef struct {
    char id[17];
    int ok;
    size_t weight_bytes, arena_bytes;
    char key[2048];
} dl_cache_entry;
dl_status dl_cache_list(dl_cache_entry **entries, int *n); /* caller frees *entries */
dl_status dl_cache_verify(const char *id);                  /* every checksum */
dl_status dl_cache_remove(const char *id);


#ifdef __cplusplus
}
#endif
#endif
