/* Program artifacts: weights.bin (tensors at 64-byte aligned offsets) and
 * manifest.json (key, tensor table with offset / bytes / layout / xxh3 checksum,
 * arena size, compile time). Written by streaming, read by mmap. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/artifact.h"

typedef struct {
    char *name, *layout;
    size_t off, bytes;
    uint64_t sum;
} entry;

struct dl_artifact_writer {
    char *dir;
    FILE *f;
    size_t off;
    entry *e;
    int n, cap;
};

static dl_status oom(void) { return dl_fail(DL_ERR_NOMEM, "out of memory"); }

dl_status dl_artifact_writer_open(dl_artifact_writer **out, const char *dir) {
    *out = NULL;
    dl_artifact_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return oom();
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/weights.bin", dir);
    w->f = fopen(path, "wb");
    if (!w->f) {
        dl_status s = dl_fail(DL_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        free(w->dir), free(w);
        return s;
    }
    *out = w;
    return DL_OK;
}

void dl_artifact_writer_abort(dl_artifact_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    for (int i = 0; i < w->n; i++) free(w->e[i].name), free(w->e[i].layout);
    free(w->e), free(w->dir), free(w);
}

dl_status dl_artifact_writer_add(dl_artifact_writer *w, const char *name, const char *layout, const void *data,
                                 size_t bytes) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->e[i].name, name) && !strcmp(w->e[i].layout, layout))
            return dl_fail(DL_ERR_INVALID, "artifact: tensor `%s` (%s) recorded twice", name, layout);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 256;
        entry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e) return oom();
        w->e = e, w->cap = cap;
    }
    static const uint8_t zeros[DL_ALIGN];
    size_t pad = dl_align_up(w->off, DL_ALIGN) - w->off;
    if ((pad && fwrite(zeros, 1, pad, w->f) != pad) || (bytes && fwrite(data, 1, bytes, w->f) != bytes))
        return dl_fail(DL_ERR_IO, "artifact: write %s/weights.bin: %s", w->dir, strerror(errno));
    entry *e = &w->e[w->n];
    e->name = strdup(name), e->layout = strdup(layout);
    if (!e->name || !e->layout) {
        free(e->name), free(e->layout);
        return oom();
    }
    e->off = w->off + pad;
    e->bytes = bytes;
    e->sum = dl_hash64(data, bytes, 0);
    w->off = e->off + bytes;
    w->n++;
    dl_fault_after_tensor(w->n);
    return DL_OK;
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

dl_status dl_artifact_writer_finish(dl_artifact_writer *w, const char *key_json, size_t arena_bytes,
                                    double compile_seconds) {
    dl_status s = DL_OK;
    char path[4096];
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) s = dl_fail(DL_ERR_IO, "artifact: flush weights: %s", strerror(errno));
    fclose(w->f);
    w->f = NULL;
    cJSON *root = cJSON_CreateObject(), *key = cJSON_Parse(key_json), *tab = cJSON_CreateArray();
    if (s == DL_OK && (!root || !key || !tab)) s = dl_fail(DL_ERR_INVALID, "artifact: bad key JSON");
    if (s == DL_OK) {
        cJSON_AddItemToObject(root, "key", key);
        key = NULL;
        cJSON_AddNumberToObject(root, "format", 1);
        cJSON_AddNumberToObject(root, "weight_bytes", (double)w->off);
        cJSON_AddNumberToObject(root, "arena_bytes", (double)arena_bytes);
        cJSON_AddNumberToObject(root, "compile_seconds", compile_seconds);
        for (int i = 0; i < w->n; i++) {
            cJSON *e = cJSON_CreateObject();
            char sum[17];
            snprintf(sum, sizeof sum, "%016llx", (unsigned long long)w->e[i].sum);
            cJSON_AddStringToObject(e, "name", w->e[i].name);
            cJSON_AddStringToObject(e, "layout", w->e[i].layout);
            cJSON_AddNumberToObject(e, "offset", (double)w->e[i].off);
            cJSON_AddNumberToObject(e, "bytes", (double)w->e[i].bytes);
            cJSON_AddStringToObject(e, "xxh3", sum);
            cJSON_AddItemToArray(tab, e);
        }
        cJSON_AddItemToObject(root, "tensors", tab);
        tab = NULL;
        char *txt = cJSON_Print(root);
        snprintf(path, sizeof path, "%s/manifest.json", w->dir);
        if (!txt) s = oom();
        else s = dl_file_write_atomic(path, txt, strlen(txt));
        free(txt);
        snprintf(path, sizeof path, "%s/weights.bin", w->dir);
        if (s == DL_OK && fsync_path(path) != 0) s = dl_fail(DL_ERR_IO, "artifact: fsync %s", path);
    }
    cJSON_Delete(key);
    cJSON_Delete(tab);
    cJSON_Delete(root);
    dl_artifact_writer_abort(w);
    return s;
}

/* ---- reading ------------------------------------------------------------------------ */

struct dl_artifact {
    dl_mmap map;
    entry *e;
    int n;
    char *key;
    size_t weight_bytes, arena_bytes;
};

void dl_artifact_close(dl_artifact *a) {
    if (!a) return;
    dl_mmap_close(&a->map);
    for (int i = 0; i < a->n; i++) free(a->e[i].name), free(a->e[i].layout);
    free(a->e), free(a->key), free(a);
}

static int num_field(const cJSON *o, const char *k, double *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(j) || j->valuedouble < 0) return 0;
    *v = j->valuedouble;
    return 1;
}

dl_status dl_artifact_open(dl_artifact **out, const char *dir, int verify) {
    *out = NULL;
    char path[4096], *txt;
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    dl_status s = dl_file_read(path, 256u << 20, &txt, &len);
    if (s != DL_OK) return s;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    dl_artifact *a = calloc(1, sizeof *a);
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(root, "key");
    const cJSON *tab = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    double wb, ab;
    if (!a) {
        cJSON_Delete(root);
        return oom();
    }
    if (!cJSON_IsObject(key) || !cJSON_IsArray(tab) || !num_field(root, "weight_bytes", &wb) ||
        !num_field(root, "arena_bytes", &ab)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s` is truncated or malformed", path);
        goto done;
    }
    a->key = cJSON_PrintUnformatted(key);
    a->weight_bytes = (size_t)wb;
    a->arena_bytes = (size_t)ab;
    snprintf(path, sizeof path, "%s/weights.bin", dir);
    if ((s = dl_mmap_open(&a->map, path)) != DL_OK) goto done;
    if (a->map.len != a->weight_bytes) {
        s = dl_fail(DL_ERR_FORMAT, "`%s` is %zu bytes, the manifest says %zu: truncated", path, a->map.len, a->weight_bytes);
        goto done;
    }
    a->n = cJSON_GetArraySize(tab);
    a->e = calloc((size_t)a->n + 1, sizeof *a->e);
    if (!a->e) {
        s = oom();
        goto done;
    }
    for (int i = 0; i < a->n; i++) {
        const cJSON *e = cJSON_GetArrayItem(tab, i);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"), *ly = cJSON_GetObjectItemCaseSensitive(e, "layout");
        const cJSON *sm = cJSON_GetObjectItemCaseSensitive(e, "xxh3");
        double off, by;
        if (!cJSON_IsString(nm) || !cJSON_IsString(ly) || !cJSON_IsString(sm) || !num_field(e, "offset", &off) ||
            !num_field(e, "bytes", &by) || off + by > (double)a->map.len || (size_t)off % DL_ALIGN) {
            s = dl_fail(DL_ERR_FORMAT, "%s/manifest.json: tensor entry %d is malformed or outside weights.bin", dir, i);
            goto done;
        }
        a->e[i].name = strdup(nm->valuestring);
        a->e[i].layout = strdup(ly->valuestring);
        a->e[i].off = (size_t)off;
        a->e[i].bytes = (size_t)by;
        a->e[i].sum = strtoull(sm->valuestring, NULL, 16);
        if (!a->e[i].name || !a->e[i].layout) {
            s = oom();
            goto done;
        }
        if (verify && dl_hash64(a->map.data + a->e[i].off, a->e[i].bytes, 0) != a->e[i].sum) {
            s = dl_fail(DL_ERR_FORMAT, "%s: tensor `%s` fails its checksum: the artifact is corrupt", dir, a->e[i].name);
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    if (s != DL_OK) {
        dl_artifact_close(a);
        return s;
    }
    *out = a;
    return DL_OK;
}

const void *dl_artifact_get(const dl_artifact *a, const char *name, const char *layout, size_t *bytes) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->e[i].name, name) && !strcmp(a->e[i].layout, layout)) {
            *bytes = a->e[i].bytes;
            return a->map.data + a->e[i].off;
        }
    return NULL;
}

const char *dl_artifact_key(const dl_artifact *a) { return a->key; }
size_t dl_artifact_weight_bytes(const dl_artifact *a) { return a->weight_bytes; }
size_t dl_artifact_arena_bytes(const dl_artifact *a) { return a->arena_bytes; }

/* Test hook for the atomicity test: DIFFLET_FAULT_KILL_COMPILE=N kills the process
 * (SIGKILL, like an OOM kill or power cut) after N tensors of a compile. */
void dl_fault_after_tensor(int written) {
    static int limit = -2;
    if (limit == -2) {
        const char *e = getenv("DIFFLET_FAULT_KILL_COMPILE");
        limit = e ? atoi(e) : -1;
    }
    if (limit >= 0 && written >= limit) raise(SIGKILL);
}
