/* Program artifacts at the io floor: a folder with manifest.json (the key, the tensor
 * table with offsets, bytes, layout and checksum, the activation arena size) and one
 * 64-byte aligned weights.bin, written atomically and mapped read-only; and the
 * weight source a model's load reads through (checkpoint, recording compile, or
 * artifact). Models use this header; keys and the cache are program.h's. */
#ifndef DIFFLET_ARTIFACT_H
#define DIFFLET_ARTIFACT_H

#include "difflet/io.h"
#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- artifacts ---------------------------------------------------------------------- */
typedef struct dl_artifact_writer dl_artifact_writer;
typedef struct dl_artifact dl_artifact;

/* Start an artifact in directory `dir` (which must exist): weights.bin is streamed. */
dl_status dl_artifact_writer_open(dl_artifact_writer **w, const char *dir);
/* Append a tensor: `layout` says what the bytes are ("f32", "onednn") */
dl_status dl_artifact_writer_add(dl_artifact_writer *w, const char *name, const char *layout, const void *data,
                                 size_t bytes);
/* Write manifest.json (key fields `key`, a JSON object string, plus the table and
 * `arena_bytes`, `compile_seconds`), fsync both files. Frees w. */
dl_status dl_artifact_writer_finish(dl_artifact_writer *w, const char *key_json, size_t arena_bytes,
                                    double compile_seconds);
void dl_artifact_writer_abort(dl_artifact_writer *w);

/* Open dir/manifest.json and map dir/weights.bin; with `verify`, every tensor's
 * checksum is checked (a flipped byte is an error naming the tensor). */
dl_status dl_artifact_open(dl_artifact **a, const char *dir, int verify);
void dl_artifact_close(dl_artifact *a);
/* The tensor `name` with `layout`, or NULL. */
const void *dl_artifact_get(const dl_artifact *a, const char *name, const char *layout, size_t *bytes);
/* The manifest's "key" object as canonical JSON text (owned by a). */
const char *dl_artifact_key(const dl_artifact *a);
size_t dl_artifact_weight_bytes(const dl_artifact *a);
size_t dl_artifact_arena_bytes(const dl_artifact *a);

/* ---- weight sources ------------------------------------------------------------------
 * How a model's load gets its weights: from the checkpoint (converting and packing),
 * optionally recording everything it produces into an artifact (compile), or from an
 * artifact (load). Also counts the activation bytes the model allocates. */
typedef struct dl_wsrc dl_wsrc;
struct dl_wsrc {
    dl_checkpoint *ck;         /* checkpoint mode */
    dl_artifact_writer *rec;   /* compile: record every produced tensor */
    const dl_artifact *art;    /* artifact mode (ck NULL) */
    size_t arena;              /* activation bytes allocated by the model */
    int owned;                 /* internal: opened by the model itself */
    dl_quant quant;            /* int8 scheme of the linears built from the checkpoint */
    const char *component;     /* the component's folder (int8 calibration's layer names) */
    const struct cJSON *calib; /* W8A8 compile: the component's layers in int8_calibration.json, or NULL */
};

/* Fault injection for tests (DIFFLET_FAULT_KILL_COMPILE=N: SIGKILL after N tensors). */
void dl_fault_after_tensor(int written);

#ifdef __cplusplus
}
#endif
#endif
