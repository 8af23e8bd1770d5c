/* difflet gguf: a reader for GGUF files (llama.cpp's format, versions 2 and 3,
 * little-endian) and dequantization of the common ggml block types to f32.
 *
 * The file is mapped read-only and validated whole at open: header, every metadata
 * value (all 13 value types, nested arrays included), every tensor's dims, type,
 * offset and size. A malformed file is an error naming the file and what is wrong,
 * never a crash. Tensors of types difflet cannot dequantize (IQ*, Q2_K, ...) open
 * fine and are refused by name only when read. */
#ifndef DIFFLET_GGUF_H
#define DIFFLET_GGUF_H

#include "difflet/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml type ids as they appear in files (GGML_TYPE_*); the ones difflet names. */
enum {
    DL_GGUF_F32 = 0, DL_GGUF_F16 = 1, DL_GGUF_Q4_0 = 2, DL_GGUF_Q4_1 = 3, DL_GGUF_Q5_0 = 6,
    DL_GGUF_Q5_1 = 7, DL_GGUF_Q8_0 = 8, DL_GGUF_Q8_1 = 9, DL_GGUF_Q2_K = 10, DL_GGUF_Q3_K = 11,
    DL_GGUF_Q4_K = 12, DL_GGUF_Q5_K = 13, DL_GGUF_Q6_K = 14, DL_GGUF_Q8_K = 15, DL_GGUF_BF16 = 30,
};

#define DL_GGUF_MAX_DIMS 4

/* An open, mmapped, validated GGUF file. */
typedef struct dl_gguf dl_gguf;

typedef struct {
    const char *name;
    uint32_t type;         /* ggml type id as in the file */
    int ndim;              /* 1..4 */
    int64_t shape[DL_GGUF_MAX_DIMS]; /* row-major, outermost first (the file's ne[] reversed), like torch */
    int64_t numel;
    const uint8_t *data;   /* inside the mapping; its file offset is a multiple of general.alignment */
    size_t nbytes;
} dl_gguf_tensor;

/* Map and validate `path`. Errors name the file and what is wrong ("`m.gguf`:
 * tensor `blk.0.w` ends at byte 9000 of a 4096-byte data section: truncated?"). */
dl_status dl_gguf_open(dl_gguf **out, const char *path);
void dl_gguf_free(dl_gguf *g);

/* Tensors in file order. */
int dl_gguf_count(const dl_gguf *g);
const dl_gguf_tensor *dl_gguf_at(const dl_gguf *g, int i);
/* NULL when absent. */
const dl_gguf_tensor *dl_gguf_find(const dl_gguf *g, const char *name);
/* The string metadata value `key` (e.g. "general.architecture"), NUL-terminated and
 * owned by g; NULL when absent or not a string. */
const char *dl_gguf_get_str(const dl_gguf *g, const char *key);
const char *dl_gguf_path(const dl_gguf *g);

/* "Q8_0", ...; "type 99" for an id this build does not know (a static buffer per
 * thread, valid until the next such call). */
const char *dl_gguf_type_name(uint32_t type);
/* 1 when dl_gguf_dequant handles `type`: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K. */
int dl_gguf_type_supported(uint32_t type);
/* Elements per block (1 for F32/F16/BF16, 32 for Q8_0, 256 for K-quants) and bytes
 * per block; 0 for an unknown type. */
int64_t dl_gguf_block_elems(uint32_t type);
size_t dl_gguf_block_bytes(uint32_t type);

/* `n` consecutive elements of a tensor of `type` starting at `src` (n, and the start,
 * a multiple of the block), into dst as f32. `src` needs no alignment. Bit-identical
 * to gguf-py's gguf.quants.dequantize (ggml's reference dequantization). An
 * unsupported type is DL_ERR_UNSUPPORTED naming it and the supported ones. */
dl_status dl_gguf_dequant(uint32_t type, const void *src, int64_t n, float *dst);

/* The whole tensor `t` of g into dst (t->numel floats), with errors naming the file
 * and tensor ("`m.gguf`: tensor `x` is of GGUF type IQ2_XS, which difflet cannot
 * read (supported: ...)"). */
dl_status dl_gguf_read(const dl_gguf *g, const dl_gguf_tensor *t, float *dst);

#ifdef __cplusplus
}
#endif
#endif
