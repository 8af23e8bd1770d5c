/* Model folders in the diffusers layout: DIR/model_index.json names the pipeline
 * class and its components ("transformer": ["diffusers", "FluxTransformer2DModel"]);
 * each component has DIR/<component>/config.json and safetensors weights. Configs
 * are parsed once and cached; typed accessors name the file and key on error. */
#include <dirent.h>
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/io.h"

enum { MAX_COMPONENTS = 32, MAX_JSON = 64u << 20 }; /* tokenizer.json files run to tens of MiB */

typedef struct {
    char *name;
    char *cls; /* NULL for a component listed as [null, null] */
    cJSON *config;
} component;

struct dl_model_dir {
    char *dir;
    char *cls;
    component c[MAX_COMPONENTS];
    int n;
};

void dl_model_dir_free(dl_model_dir *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        free(m->c[i].name), free(m->c[i].cls);
        cJSON_Delete(m->c[i].config);
    }
    free(m->dir), free(m->cls);
    free(m);
}

dl_status dl_json_read_object(const char *path, const char *shown, struct cJSON **out) {
    if (!shown) shown = path;
    char *txt;
    size_t len;
    *out = NULL;
    if (!dl_file_exists(path)) return dl_fail(DL_ERR_IO, "`%s` is missing", shown);
    dl_status s = dl_file_read(path, MAX_JSON, &txt, &len);
    if (s != DL_OK) return s;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(txt, len, &end, 0);
    if (!j || !cJSON_IsObject(j)) {
        long at = end ? (long)(end - txt) : -1;
        cJSON_Delete(j);
        free(txt);
        return dl_fail(DL_ERR_FORMAT, "`%s`: not a valid JSON object (error near byte %ld)", shown, at);
    }
    free(txt);
    *out = j;
    return DL_OK;
}

int64_t dl_json_file_int(const char *dir, const char *rel, const char *key, int64_t lo, int64_t hi, int64_t def) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    cJSON *j;
    if (dl_json_read_object(path, NULL, &j) != DL_OK) return def;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    int64_t n = def;
    if (cJSON_IsNumber(v) && v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) n = (int64_t)v->valuedouble;
    cJSON_Delete(j);
    return n;
}

/* defaults.key of DIR/difflet.json when a number in [lo, hi] (and whole, when whole), else def */
static double model_default(const char *dir, const char *key, double lo, double hi, double def, int whole) {
    char path[4096];
    snprintf(path, sizeof path, "%s/difflet.json", dir);
    cJSON *j;
    if (!dl_file_exists(path)) return def;
    if (dl_json_read_object(path, NULL, &j) != DL_OK) {
        DL_WARN("%s (its defaults are not used)", dl_last_error());
        return def;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "defaults"), key);
    double n = def;
    if (cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi && (!whole || v->valuedouble == floor(v->valuedouble)))
        n = v->valuedouble;
    else if (v)
        DL_WARN("`%s`: defaults.%s must be %s from %g to %g (the pipeline's default %g is used)", path, key,
                whole ? "an integer" : "a number", lo, hi, def);
    cJSON_Delete(j);
    return n;
}

int64_t dl_model_default_int(const char *dir, const char *key, int64_t lo, int64_t hi, int64_t def) {
    return (int64_t)model_default(dir, key, (double)lo, (double)hi, (double)def, 1);
}

double dl_model_default_num(const char *dir, const char *key, double lo, double hi, double def) {
    return model_default(dir, key, lo, hi, def, 0);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* "org/name" with the characters the Hub allows, nothing like a path */
static int hub_id(const char *s, size_t len) {
    const char *slash = memchr(s, '/', len);
    if (!slash || slash == s || slash == s + len - 1 || memchr(slash + 1, '/', len - (size_t)(slash + 1 - s))) return 0;
    if (s[0] == '.' || slash[1] == '.') return 0;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("/-_.", s[i])) return 0;
    return !strstr(s, "..");
}

dl_status dl_model_resolve(const char *ref, char *out, size_t n) {
    if (is_dir(ref)) {
        snprintf(out, n, "%s", ref);
        return DL_OK;
    }
    const char *at = strchr(ref, '@');
    size_t idlen = at ? (size_t)(at - ref) : strlen(ref);
    const char *rev = at ? at + 1 : "main";
    const char *sl = strchr(ref, '/');
    if (ref[0] == '/' || ref[0] == '.' || (sl && strchr(sl + 1, '/')) || !sl)
        return dl_fail(DL_ERR_IO, "model folder `%s` does not exist (a Hub model is named org/name[@revision])", ref);
    if (!hub_id(ref, idlen) || !*rev || strchr(rev, '/') || strstr(rev, ".."))
        return dl_fail(DL_ERR_INVALID, "model `%s` is neither a folder nor a Hub repository id (org/name[@revision])", ref);
    char root[2048], repo[3072], hash[256], path[4096];
    const char *hc = getenv("HF_HUB_CACHE"), *hh = getenv("HF_HOME"), *home = getenv("HOME");
    if (hc && *hc) snprintf(root, sizeof root, "%s", hc);
    else if (hh && *hh) snprintf(root, sizeof root, "%s/hub", hh);
    else snprintf(root, sizeof root, "%s/.cache/huggingface/hub", home ? home : "");
    int o = snprintf(repo, sizeof repo, "%s/models--", root);
    for (size_t i = 0; i < idlen && o < (int)sizeof repo - 3; i++) /* org/name -> org--name */
        if (ref[i] == '/') repo[o++] = '-', repo[o++] = '-';
        else repo[o++] = ref[i];
    repo[o] = 0;
    if (!is_dir(repo))
        return dl_fail(DL_ERR_IO, "model `%.*s` is not in the local Hugging Face cache (looked for %s; set HF_HUB_CACHE or "
                       "HF_HOME, or pass a folder; difflet never downloads)", (int)idlen, ref, repo);
    /* a revision is a ref (refs/<rev> holds its commit) or a commit hash */
    snprintf(path, sizeof path, "%s/refs/%s", repo, rev);
    char *txt;
    size_t len;
    if (dl_file_read(path, 256, &txt, &len) == DL_OK) {
        while (len && (txt[len - 1] == '\n' || txt[len - 1] == ' ')) txt[--len] = 0;
        snprintf(hash, sizeof hash, "%s", txt);
        free(txt);
    } else {
        snprintf(hash, sizeof hash, "%s", rev);
    }
    snprintf(path, sizeof path, "%s/snapshots/%s", repo, hash);
    if (!is_dir(path) || strchr(hash, '/'))
        return dl_fail(DL_ERR_IO, "model `%s`: revision `%s` is not in the local cache (looked for %s/refs/%s and %s)", ref, rev,
                       repo, rev, path);
    if ((size_t)snprintf(out, n, "%s", path) >= n) return dl_fail(DL_ERR_INVALID, "model path too long");
    return DL_OK;
}

dl_status dl_model_dir_open(dl_model_dir **out, const char *dir) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    cJSON *idx;
    dl_status s = dl_json_read_object(path, NULL, &idx);
    if (s != DL_OK) {
        if (s == DL_ERR_IO && !dl_file_exists(dir))
            return dl_fail(DL_ERR_IO, "model folder `%s` does not exist", dir);
        return s;
    }
    dl_model_dir *m = calloc(1, sizeof *m);
    if (!m) {
        cJSON_Delete(idx);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    m->dir = strdup(dir);
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(idx, "_class_name");
    if (!cJSON_IsString(cls)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: \"_class_name\" (the pipeline class) is missing", path);
        goto done;
    }
    m->cls = strdup(cls->valuestring);
    const cJSON *e;
    cJSON_ArrayForEach(e, idx) {
        if (e->string[0] == '_') continue; /* _class_name, _diffusers_version, ... */
        if (!cJSON_IsArray(e)) continue;   /* pipeline options such as "force_zeros_for_empty_prompt" */
        const cJSON *lib = cJSON_GetArrayItem(e, 0), *kls = cJSON_GetArrayItem(e, 1);
        if (cJSON_GetArraySize(e) != 2 || !(cJSON_IsString(kls) || cJSON_IsNull(kls)) ||
            !(cJSON_IsString(lib) || cJSON_IsNull(lib))) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: component \"%s\" must be [library, class]", path, e->string);
            goto done;
        }
        if (m->n == MAX_COMPONENTS || strchr(e->string, '/') || strstr(e->string, "..")) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: too many components or a bad component name \"%s\"", path, e->string);
            goto done;
        }
        m->c[m->n].name = strdup(e->string);
        m->c[m->n].cls = cJSON_IsString(kls) ? strdup(kls->valuestring) : NULL;
        m->n++;
    }
done:
    cJSON_Delete(idx);
    if (s != DL_OK) {
        dl_model_dir_free(m);
        return s;
    }
    *out = m;
    return DL_OK;
}

const char *dl_model_dir_path(const dl_model_dir *m) { return m->dir; }
const char *dl_model_dir_class(const dl_model_dir *m) { return m->cls; }
int dl_model_dir_ncomponents(const dl_model_dir *m) { return m->n; }
const char *dl_model_dir_component_name(const dl_model_dir *m, int i) { return m->c[i].name; }

static component *find(const dl_model_dir *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->c[i].name, name)) return (component *)&m->c[i];
    return NULL;
}

const char *dl_model_dir_component_class(const dl_model_dir *m, const char *name) {
    component *c = find(m, name);
    return c ? c->cls : NULL;
}

dl_status dl_model_dir_config(dl_model_dir *m, const char *name, const cJSON **cfg) {
    component *c = find(m, name);
    *cfg = NULL;
    if (!c || !c->cls)
        return dl_fail(DL_ERR_FORMAT, "`%s/model_index.json`: the pipeline has no component \"%s\"", m->dir, name);
    if (!c->config) {
        char path[4096], shown[512];
        snprintf(path, sizeof path, "%s/%s/config.json", m->dir, name);
        snprintf(shown, sizeof shown, "%s/config.json", name);
        dl_status s = dl_json_read_object(path, shown, &c->config);
        if (s != DL_OK) return s;
    }
    *cfg = c->config;
    return DL_OK;
}

dl_status dl_model_dir_checkpoint(const dl_model_dir *m, const char *name, dl_checkpoint **ck) {
    static const char *cands[] = {"diffusion_pytorch_model.safetensors", "model.safetensors",
                                  "diffusion_pytorch_model.safetensors.index.json", "model.safetensors.index.json"};
    *ck = NULL;
    component *c = find(m, name);
    if (!c || !c->cls)
        return dl_fail(DL_ERR_FORMAT, "`%s/model_index.json`: the pipeline has no component \"%s\"", m->dir, name);
    char path[4096], shown[512];
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        snprintf(path, sizeof path, "%s/%s/%s", m->dir, name, cands[i]);
        if (!dl_file_exists(path)) continue;
        snprintf(shown, sizeof shown, "%s/%s", name, cands[i]);
        return dl_ckpt_open(ck, path, shown);
    }
    /* a GGUF file instead (one): quantized weights as stable-diffusion.cpp / ComfyUI-GGUF users have them */
    snprintf(path, sizeof path, "%s/%s", m->dir, name);
    DIR *d = opendir(path);
    char gguf[512] = "";
    int ngguf = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf") && e->d_name[0] != '.') {
            if (!ngguf++) snprintf(gguf, sizeof gguf, "%s", e->d_name);
        }
    }
    if (d) closedir(d);
    if (ngguf > 1)
        return dl_fail(DL_ERR_FORMAT, "`%s/`: %d .gguf files and no safetensors: keep the one to load", name, ngguf);
    if (ngguf == 1) {
        snprintf(path, sizeof path, "%.3500s/%.200s/%.300s", m->dir, name, gguf);
        snprintf(shown, sizeof shown, "%.200s/%.300s", name, gguf);
        return dl_ckpt_open_gguf(ck, path, shown);
    }
    snprintf(path, sizeof path, "%s/%s/pytorch_model.bin", m->dir, name);
    int has_bin = dl_file_exists(path);
    snprintf(path, sizeof path, "%s/%s/diffusion_pytorch_model.bin", m->dir, name);
    has_bin |= dl_file_exists(path);
    return dl_fail(DL_ERR_IO, "`%s/`: no weights (looked for %s, %s, their .index.json and a .gguf file)%s", name,
                   cands[0], cands[1], has_bin ? "; only PyTorch .bin weights are there: convert them to safetensors" : "");
}

/* ---- typed config access ------------------------------------------------------------ */

dl_status dl_cfg_int(const cJSON *cfg, const char *file, const char *key, int64_t def, int64_t *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    *out = def;
    if (!j || cJSON_IsNull(j)) return DL_OK;
    if (!cJSON_IsNumber(j) || j->valuedouble != (double)(int64_t)j->valuedouble)
        return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be an integer", file, key);
    *out = (int64_t)j->valuedouble;
    return DL_OK;
}

dl_status dl_cfg_float(const cJSON *cfg, const char *file, const char *key, double def, double *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    *out = def;
    if (!j || cJSON_IsNull(j)) return DL_OK;
    if (!cJSON_IsNumber(j)) return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be a number", file, key);
    *out = j->valuedouble;
    return DL_OK;
}

dl_status dl_cfg_bool(const cJSON *cfg, const char *file, const char *key, int def, int *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    *out = def;
    if (!j || cJSON_IsNull(j)) return DL_OK;
    if (!cJSON_IsBool(j)) return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be true or false", file, key);
    *out = cJSON_IsTrue(j);
    return DL_OK;
}

dl_status dl_cfg_str(const cJSON *cfg, const char *file, const char *key, const char *def, const char **out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(cfg, key);
    *out = def;
    if (!j || cJSON_IsNull(j)) return DL_OK;
    if (!cJSON_IsString(j)) return dl_fail(DL_ERR_FORMAT, "`%s`: \"%s\" must be a string", file, key);
    *out = j->valuestring;
    return DL_OK;
}
