/* The program cache: $DIFFLET_CACHE/programs/<id>/ where id = xxh3 of the canonical
 * key JSON. A compile builds into programs/.tmp-<id>-<pid>/, fsyncs, and renames; a
 * lock file (flock) serialises concurrent compiles of one key. Loads verify every
 * checksum and compare the stored key with the requested one. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/program.h"

static dl_program_stats g_stats;
dl_program_stats dl_program_stats_get(void) { return g_stats; }

const char *dl_cache_dir(void) {
    static char buf[1024];
    const char *e = getenv("DIFFLET_CACHE");
    if (e && *e) snprintf(buf, sizeof buf, "%s", e);
    else snprintf(buf, sizeof buf, "%s/.cache/difflet", getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

dl_status dl_component_hash(dl_model_dir *dir, const char *component, uint64_t *hash) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dl_model_dir_path(dir), component);
    DIR *d = opendir(path);
    if (!d) return dl_fail(DL_ERR_IO, "cannot list %s: %s", path, strerror(errno));
    char *names[1024];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 1024) {
        size_t l = strlen(de->d_name);
        if ((l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) || (l > 5 && !strcmp(de->d_name + l - 5, ".json")) ||
            (l > 5 && !strcmp(de->d_name + l - 5, ".gguf"))) /* every file a checkpoint may be read from */
            names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_str);
    /* which file versions: path, size, mtime of each */
    dl_hasher *h = dl_hasher_new(1);
    for (int i = 0; i < n; i++) {
        struct stat st;
        char fp[8600];
        snprintf(fp, sizeof fp, "%s/%s", path, names[i]);
        if (stat(fp, &st) == 0) {
            int64_t v[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
            dl_hasher_update(h, fp, strlen(fp) + 1);
            dl_hasher_update(h, v, sizeof v);
        }
        free(names[i]);
    }
    uint64_t statkey = dl_hasher_digest(h);
    dl_hasher_free(h);
    char memo[4200];
    snprintf(memo, sizeof memo, "%s/hashes/%016llx", dl_cache_dir(), (unsigned long long)statkey);
    char *txt;
    size_t len;
    if (dl_file_read(memo, 64, &txt, &len) == DL_OK) {
        char *end;
        unsigned long long v = strtoull(txt, &end, 16);
        int ok = end != txt;
        free(txt);
        if (ok) {
            *hash = v;
            return DL_OK;
        }
    }
    dl_checkpoint *ck;
    dl_status s = dl_model_dir_checkpoint(dir, component, &ck);
    if (s != DL_OK) return s;
    *hash = dl_ckpt_content_hash(ck);
    dl_ckpt_free(ck);
    char hex[32];
    snprintf(path, sizeof path, "%s/hashes", dl_cache_dir());
    snprintf(hex, sizeof hex, "%016llx\n", (unsigned long long)*hash);
    if (dl_mkdir_p(path) == DL_OK) dl_file_write_atomic(memo, hex, strlen(hex)); /* a memo: failure is harmless */
    return DL_OK;
}

/* A W8A8 compile's calibration (`difflet calibrate-int8`): the component's layers in
 * <model>/int8_calibration.json. *root (free with cJSON_Delete) and *layers are NULL
 * when there is no file or it names no layer of this component; a file that is not
 * JSON with a "components" object is an error. */
static dl_status calib_layers(dl_model_dir *dir, const char *component, dl_quant quant, cJSON **root,
                              const cJSON **layers) {
    *root = NULL, *layers = NULL;
    if (quant != DL_QUANT_W8A8) return DL_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/int8_calibration.json", dl_model_dir_path(dir));
    if (!dl_file_exists(path)) return DL_OK;
    dl_status s = dl_json_read_object(path, "int8_calibration.json", root);
    if (s != DL_OK) return s;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(*root, "components");
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(*root), *root = NULL;
        return dl_fail(DL_ERR_FORMAT, "`%s`: no \"components\" object (write it with `difflet calibrate-int8`)", path);
    }
    const cJSON *lv = cJSON_GetObjectItemCaseSensitive(*root, "levels");
    if (cJSON_IsNumber(lv) && (int)lv->valuedouble != dl_q8_levels()) { /* measured for another CPU's quantization */
        DL_WARN("`%s` was measured with %d activation levels, this CPU quantizes to %d: not used (run calibrate-int8 here)",
                path, (int)lv->valuedouble, dl_q8_levels());
        cJSON_Delete(*root), *root = NULL;
        return DL_OK;
    }
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(c, component), *e;
    if (!cJSON_IsObject(l)) return DL_OK;
    cJSON_ArrayForEach(e, l) {
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(e, "scheme");
        if (!cJSON_IsString(sc) || (strcmp(sc->valuestring, "int8") && strcmp(sc->valuestring, "int8-wo"))) {
            dl_status s2 = dl_fail(DL_ERR_FORMAT, "`%s`: %s/%s has no scheme \"int8\" or \"int8-wo\"", path, component,
                                   e->string ? e->string : "?");
            cJSON_Delete(*root), *root = NULL;
            return s2;
        }
    }
    *layers = l;
    return DL_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* the calibration's part of the key: the hash of the sorted names of the layers it
 * makes weight-only (0: none), so a new measurement with the same verdicts compiles
 * nothing new */
static uint64_t calib_hash(const cJSON *layers) {
    int n = 0, k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, layers) n++;
    const char **names = n ? malloc((size_t)n * sizeof *names) : NULL;
    cJSON_ArrayForEach(e, layers) {
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(e, "scheme");
        if (names && e->string && !strcmp(sc->valuestring, "int8-wo")) names[k++] = e->string;
    }
    uint64_t h = 0;
    if (k) {
        qsort(names, (size_t)k, sizeof *names, cmp_str);
        for (int i = 0; i < k; i++) h = dl_hash64(names[i], strlen(names[i]) + 1, h); /* the NUL separates */
    }
    free(names);
    return h;
}

dl_status dl_program_key(dl_model_dir *dir, const char *component, const char *shape_json, dl_dtype dt, dl_quant quant,
                         int probe, char **key_json, char id[17]) {
    return dl_program_key_par(dir, component, shape_json, dt, quant, probe, "single", 0, key_json, id);
}

dl_status dl_program_key_par(dl_model_dir *dir, const char *component, const char *shape_json, dl_dtype dt,
                             dl_quant quant, int probe, const char *parallel, int rank, char **key_json, char id[17]) {
    *key_json = NULL;
    char path[4096], hex[32], *cfg;
    size_t len;
    snprintf(path, sizeof path, "%s/%s/config.json", dl_model_dir_path(dir), component);
    dl_status s = dl_file_read(path, 16u << 20, &cfg, &len);
    if (s != DL_OK) return s;
    uint64_t cfg_hash = dl_hash64(cfg, len, 0), ck_hash;
    free(cfg);
    if ((s = dl_component_hash(dir, component, &ck_hash)) != DL_OK) return s;
    cJSON *croot;
    const cJSON *clayers;
    if ((s = calib_layers(dir, component, quant, &croot, &clayers)) != DL_OK) return s;
    const uint64_t chash = clayers ? calib_hash(clayers) : 0;
    cJSON_Delete(croot);
    cJSON *shape = cJSON_Parse(shape_json);
    if (!cJSON_IsObject(shape)) {
        cJSON_Delete(shape);
        return dl_fail(DL_ERR_INVALID, "program key: bad shape JSON");
    }
    /* fields in sorted order: the printed object is canonical */
    cJSON *k = cJSON_CreateObject();
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ck_hash);
    cJSON_AddStringToObject(k, "checkpoint_xxh3", hex);
    const char *cls = dl_model_dir_component_class(dir, component);
    cJSON_AddStringToObject(k, "class", cls ? cls : "");
    cJSON_AddStringToObject(k, "component", component);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)cfg_hash);
    cJSON_AddStringToObject(k, "config_xxh3", hex);
    cJSON_AddStringToObject(k, "dtype", dl_dtype_name(dt));
    cJSON_AddStringToObject(k, "engine", DIFFLET_VERSION);
    cJSON_AddNumberToObject(k, "format", 3); /* 2: packed weights carry their oneDNN layout record; 3: convolution weights for the channel-blocked kernels */
    if (chash) { /* absent without a weight-only verdict: other keys are unchanged */
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)chash);
        cJSON_AddStringToObject(k, "int8_calibration_xxh3", hex);
    }
    cJSON_AddStringToObject(k, "isa", dl_isa_name(dl_kernel_isa()));
    cJSON_AddStringToObject(k, "matmul_isa", dl_onednn_isa());
    cJSON_AddStringToObject(k, "onednn", dl_onednn_version());
    cJSON_AddStringToObject(k, "parallel", parallel);
    cJSON_AddBoolToObject(k, "probe", probe);
    if (quant != DL_QUANT_NONE) /* absent when none: the keys of f32 and bf16 programs are unchanged */
        cJSON_AddStringToObject(k, "quant", dl_quant_scheme_name(quant));
    cJSON_AddNumberToObject(k, "rank", rank);
    cJSON_AddItemToObject(k, "shape", shape);
    *key_json = cJSON_PrintUnformatted(k);
    cJSON_Delete(k);
    if (!*key_json) return dl_fail(DL_ERR_NOMEM, "out of memory");
    snprintf(id, 17, "%016llx", (unsigned long long)dl_hash64(*key_json, strlen(*key_json), 0));
    return DL_OK;
}

/* "field: have X, want Y" for the first field where two keys differ */
static void key_diff(const char *have, const char *want, char *out, size_t n) {
    cJSON *a = cJSON_Parse(have), *b = cJSON_Parse(want);
    snprintf(out, n, "the keys differ");
    const cJSON *e;
    cJSON_ArrayForEach(e, b) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(a, e->string);
        char *x = o ? cJSON_PrintUnformatted(o) : NULL, *y = cJSON_PrintUnformatted(e);
        int same = x && y && !strcmp(x, y);
        if (!same) snprintf(out, n, "%s: compiled for %s, requested %s", e->string, x ? x : "(absent)", y ? y : "?");
        free(x), free(y);
        if (!same) break;
    }
    cJSON_Delete(a), cJSON_Delete(b);
}

/* The cached program of the same component, class and checkpoint whose key differs
 * from `want` in the fewest fields: its first difference, in `out`. */
static void nearest(const char *want, char *out, size_t n) {
    dl_cache_entry *e;
    int cnt;
    out[0] = 0;
    if (dl_cache_list(&e, &cnt) != DL_OK) return;
    cJSON *w = cJSON_Parse(want);
    int best = 1 << 30;
    for (int i = 0; i < cnt; i++) {
        if (!e[i].ok) continue;
        cJSON *h = cJSON_Parse(e[i].key);
        const char *same[] = {"component", "class", "checkpoint_xxh3"};
        int ok = 1, diff = 0;
        for (int k = 0; k < 3 && ok; k++) {
            char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(h, same[k]));
            char *b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(w, same[k]));
            ok = a && b && !strcmp(a, b);
            free(a), free(b);
        }
        const cJSON *f;
        cJSON_ArrayForEach(f, w) {
            char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(h, f->string)), *b = cJSON_PrintUnformatted(f);
            diff += !(a && b && !strcmp(a, b));
            free(a), free(b);
        }
        if (ok && diff < best) {
            best = diff;
            key_diff(e[i].key, want, out, n);
        }
        cJSON_Delete(h);
    }
    cJSON_Delete(w);
    free(e);
}


dl_status dl_cache_remove(const char *id) {
    char p[4096];
    if (strlen(id) != 16 || strspn(id, "0123456789abcdef") != 16) return dl_fail(DL_ERR_INVALID, "`%s` is not a program id", id);
    snprintf(p, sizeof p, "%s/programs/%s", dl_cache_dir(), id);
    if (!dl_file_exists(p)) return dl_fail(DL_ERR_IO, "no program %s in %s/programs", id, dl_cache_dir());
    dl_rm_rf(p);
    return DL_OK;
}

/* Try the cached artifact. DL_OK with *art set; DL_ERR_IO when absent; other
 * errors say why it cannot be used. */
static dl_status try_load(const char *dir, const char *key_json, dl_artifact **art) {
    char mf[2400];
    snprintf(mf, sizeof mf, "%s/manifest.json", dir);
    if (!dl_file_exists(mf)) return DL_ERR_IO;
    dl_status s = dl_artifact_open(art, dir, 1);
    if (s != DL_OK) return s;
    if (strcmp(dl_artifact_key(*art), key_json)) {
        char why[512];
        key_diff(dl_artifact_key(*art), key_json, why, sizeof why);
        dl_artifact_close(*art);
        *art = NULL;
        return dl_fail(DL_ERR_FORMAT, "%s", why);
    }
    return DL_OK;
}

static dl_status program_get(dl_model_dir *mdir, const char *component, const char *key_json, const char *id,
                             dl_cache_mode mode, dl_quant quant, const cJSON *calib, dl_program_build_fn build, void *ctx,
                             dl_artifact **keep) {
    *keep = NULL;
    char root[2048], dir[2200], lock[2200], tmp[2300];
    dl_status s;
    snprintf(root, sizeof root, "%s/programs", dl_cache_dir());
    snprintf(dir, sizeof dir, "%s/%s", root, id);
    if (mode == DL_CACHE_OFF) { /* straight from the checkpoint, nothing written */
        dl_wsrc ws = {.quant = quant, .component = component, .calib = calib};
        if ((s = dl_model_dir_checkpoint(mdir, component, &ws.ck)) != DL_OK) return s;
        s = build(ctx, &ws);
        dl_ckpt_free(ws.ck);
        return s;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        dl_artifact *art = NULL;
        s = try_load(dir, key_json, &art);
        if (s == DL_OK) {
            dl_wsrc ws = {.art = art, .component = component};
            s = build(ctx, &ws);
            if (s == DL_OK) {
                g_stats.loads++;
                *keep = art;
                return DL_OK;
            }
            dl_artifact_close(art);
        }
        if (s != DL_ERR_IO) { /* present but unusable */
            if (mode != DL_CACHE_RECOMPILE_ON_MISMATCH)
                return dl_fail(s, "program %s (%s) cannot be used: %s; run `difflet cache rm %s` or pass --recompile-on-mismatch",
                               component, id, dl_last_error(), id);
            DL_WARN("program %s (%s): %s; recompiling", component, id, dl_last_error());
            dl_rm_rf(dir);
        }
        if (mode == DL_CACHE_NO_COMPILE) { /* name the nearest program of this component, if any */
            char why[600] = "";
            nearest(key_json, why, sizeof why);
            return dl_fail(DL_ERR_IO, "program %s (%s) is not compiled, and compiling is off%s%s; run `difflet compile` for this profile",
                           component, id, why[0] ? ": the cached one " : "", why);
        }
        /* compile, under the key's lock; another process may finish it meanwhile */
        if ((s = dl_mkdir_p(root)) != DL_OK) return s;
        snprintf(lock, sizeof lock, "%s/%s.lock", root, id);
        int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lfd < 0) return dl_fail(DL_ERR_IO, "cannot open %s: %s", lock, strerror(errno));
        if (flock(lfd, LOCK_EX) != 0) {
            close(lfd);
            return dl_fail(DL_ERR_IO, "cannot lock %s: %s", lock, strerror(errno));
        }
        char mf[2400];
        snprintf(mf, sizeof mf, "%s/manifest.json", dir);
        if (attempt == 0 && dl_file_exists(mf)) { /* compiled by someone else while we waited */
            close(lfd);
            continue;
        }
        snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%d", root, id, (int)getpid());
        dl_rm_rf(tmp);
        dl_wsrc ws = {.quant = quant, .component = component, .calib = calib};
        double t0 = dl_now();
        if (mkdir(tmp, 0755) != 0) s = dl_fail(DL_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        else if ((s = dl_artifact_writer_open(&ws.rec, tmp)) == DL_OK &&
                 (s = dl_model_dir_checkpoint(mdir, component, &ws.ck)) == DL_OK)
            s = build(ctx, &ws);
        dl_ckpt_free(ws.ck);
        double secs = dl_now() - t0;
        if (s == DL_OK) {
            size_t arena = ws.arena;
            s = dl_artifact_writer_finish(ws.rec, key_json, arena, secs);
            ws.rec = NULL;
            if (s == DL_OK && rename(tmp, dir) != 0) s = dl_fail(DL_ERR_IO, "rename %s: %s", tmp, strerror(errno));
            if (s == DL_OK) {
                int dfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd >= 0) fsync(dfd), close(dfd);
                dl_artifact *a;
                size_t wb = 0;
                if (dl_artifact_open(&a, dir, 0) == DL_OK) wb = dl_artifact_weight_bytes(a), dl_artifact_close(a);
                g_stats.compiles++;
                DL_INFO("compiled %s: key %s, %.2f s, weights %.1f MiB, arena %.1f MiB", component, id, secs,
                        (double)wb / 1048576.0, (double)arena / 1048576.0);
                /* run from the program just written: the heap copy of its weights goes */
                build(ctx, NULL);
                dl_artifact *got = NULL;
                if ((s = try_load(dir, key_json, &got)) == DL_OK) {
                    dl_wsrc lw = {.art = got, .component = component};
                    if ((s = build(ctx, &lw)) == DL_OK)
                        *keep = got;
                    else
                        dl_artifact_close(got);
                }
                if (s != DL_OK)
                    s = dl_fail(s, "program %s (%s): compiled, but cannot be loaded: %s", component, id, dl_last_error());
                close(lfd);
                return s;
            }
        }
        if (s != DL_OK) {
            dl_artifact_writer_abort(ws.rec);
            dl_rm_rf(tmp);
        }
        close(lfd);
        return s;
    }
    return dl_fail(DL_ERR_IO, "program %s (%s): could not be loaded after another process compiled it", component, id);
}

dl_status dl_program_get(dl_model_dir *mdir, const char *component, const char *key_json, const char *id,
                         dl_cache_mode mode, dl_quant quant, dl_program_build_fn build, void *ctx, dl_artifact **keep) {
    *keep = NULL;
    cJSON *croot;
    const cJSON *calib;
    dl_status s = calib_layers(mdir, component, quant, &croot, &calib);
    if (s != DL_OK) return s;
    /* the verdicts read now must be the ones the key was made from (a calibration may
     * have rewritten the file in between) */
    char want[64] = "";
    const uint64_t h = calib ? calib_hash(calib) : 0;
    if (h) snprintf(want, sizeof want, "\"int8_calibration_xxh3\":\"%016llx\"", (unsigned long long)h);
    if ((h && !strstr(key_json, want)) || (!h && strstr(key_json, "\"int8_calibration_xxh3\""))) {
        cJSON_Delete(croot);
        return dl_fail(DL_ERR_INVALID, "program %s: int8_calibration.json changed since its key was made; load again", component);
    }
    s = program_get(mdir, component, key_json, id, mode, quant, calib, build, ctx, keep);
    cJSON_Delete(croot);
    return s;
}

dl_status dl_cache_list(dl_cache_entry **out, int *n) {
    *out = NULL;
    *n = 0;
    char root[2048];
    snprintf(root, sizeof root, "%s/programs", dl_cache_dir());
    DIR *d = opendir(root);
    if (!d) return DL_OK; /* no cache yet: empty */
    struct dirent *de;
    int cap = 0;
    while ((de = readdir(d))) {
        if (strlen(de->d_name) != 16 || strspn(de->d_name, "0123456789abcdef") != 16) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 32;
            dl_cache_entry *e = realloc(*out, (size_t)cap * sizeof *e);
            if (!e) break;
            *out = e;
        }
        dl_cache_entry *e = &(*out)[(*n)++];
        memset(e, 0, sizeof *e);
        memcpy(e->id, de->d_name, 16); /* 16 hex digits, checked above */
        e->id[16] = 0;
        char dir[2400];
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        dl_artifact *a;
        if (dl_artifact_open(&a, dir, 0) == DL_OK) {
            e->ok = 1;
            e->weight_bytes = dl_artifact_weight_bytes(a);
            e->arena_bytes = dl_artifact_arena_bytes(a);
            snprintf(e->key, sizeof e->key, "%s", dl_artifact_key(a));
            dl_artifact_close(a);
        } else {
            snprintf(e->key, sizeof e->key, "unreadable: %s", dl_last_error());
        }
    }
    closedir(d);
    return DL_OK;
}

dl_status dl_cache_verify(const char *id) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/programs/%s", dl_cache_dir(), id);
    dl_artifact *a;
    dl_status s = dl_artifact_open(&a, dir, 1);
    if (s == DL_OK) dl_artifact_close(a);
    return s;
}

