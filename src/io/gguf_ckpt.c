/* GGUF files as checkpoints: a component folder with a .gguf instead of safetensors
 * (what stable-diffusion.cpp and ComfyUI-GGUF users have) is read as a dl_checkpoint
 * of the diffusers names the models load. F32 / F16 / BF16 tensors stay in the
 * mapping as they are; block-quantized ones (Q8_0, Q4_0, Q4_K, ...) are DL_ST_GGUF
 * tensors that dl_ckpt_read dequantizes, so a program compiled from them packs the
 * dequantized weights in its own dtype.
 *
 * Names: a file already in diffusers names is taken as it is. FLUX files carry Black
 * Forest Labs' original names; FluxTransformer2DModel's are made from them as
 * diffusers' single-file converter makes them:
 *   renames       img_in -> x_embedder, txt_in -> context_embedder, time_in /
 *                 vector_in / guidance_in .{in,out}_layer -> time_text_embed.
 *                 {timestep,text,guidance}_embedder.linear_{1,2}, final_layer.linear ->
 *                 proj_out; per double block img/txt _mod.lin -> norm1(_context).linear,
 *                 _attn.proj -> attn.to_out.0 / to_add_out, _mlp.{0,2} ->
 *                 ff(_context).net.{0.proj,2}, _attn.norm.{query,key}_norm.scale ->
 *                 attn.norm_{q,k} / norm_added_{q,k}.weight; per single block linear2 ->
 *                 proj_out, modulation.lin -> norm.linear, norm.{query,key}_norm.scale ->
 *                 attn.norm_{q,k}.weight
 *   row splits    img_attn.qkv -> attn.to_{q,k,v}; txt_attn.qkv -> attn.add_{q,k,v}_proj;
 *                 single linear1 -> attn.to_{q,k,v} (D rows each) + proj_mlp (the rest)
 *   half swap     final_layer.adaLN_modulation.1 -> norm_out.linear with its two
 *                 halves exchanged (BFL: shift, scale; diffusers: scale, shift)
 * A split is a view of whole rows (quantized rows are whole blocks), so nothing is
 * copied but the swapped modulation. A leading "model.diffusion_model." is dropped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/gguf.h"
#include "difflet/io.h"

/* a GGUF tensor as a checkpoint tensor (name left to the caller) */
static dl_st_tensor as_st(const dl_gguf_tensor *g, const char *file) {
    dl_st_tensor t = {.ndim = g->ndim, .numel = g->numel, .data = g->data, .nbytes = g->nbytes, .file = file};
    for (int i = 0; i < g->ndim; i++) t.shape[i] = g->shape[i];
    switch (g->type) {
    case 0: t.dtype = DL_ST_F32; break;
    case 1: t.dtype = DL_ST_F16; break;
    case 30: t.dtype = DL_ST_BF16; break;
    default: t.dtype = DL_ST_GGUF, t.qtype = g->type;
    }
    return t;
}

/* rows [r0, r0 + n) of t (a view: the first dim split) */
static dl_st_tensor rows(const dl_st_tensor *t, int64_t r0, int64_t n) {
    dl_st_tensor v = *t;
    const size_t rb = t->nbytes / (size_t)t->shape[0];
    v.shape[0] = n;
    v.numel = t->numel / t->shape[0] * n;
    v.data = t->data + (size_t)r0 * rb;
    v.nbytes = (size_t)n * rb;
    return v;
}

static dl_status add_named(dl_checkpoint *ck, dl_st_tensor t, const char *name) {
    t.name = name;
    return dl_ckpt_add(ck, &t);
}

typedef struct {
    const char *from, *to;
} rename_rule;

/* suffix-free parts, under "double_blocks.N." / "single_blocks.N." or at the top */
static const rename_rule k_top[] = {
    {"img_in", "x_embedder"},
    {"txt_in", "context_embedder"},
    {"time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"},
    {"time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"},
    {"vector_in.in_layer", "time_text_embed.text_embedder.linear_1"},
    {"vector_in.out_layer", "time_text_embed.text_embedder.linear_2"},
    {"guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"},
    {"guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"},
    {"final_layer.linear", "proj_out"},
};
static const rename_rule k_double[] = {
    {"img_mod.lin", "norm1.linear"},
    {"txt_mod.lin", "norm1_context.linear"},
    {"img_attn.proj", "attn.to_out.0"},
    {"txt_attn.proj", "attn.to_add_out"},
    {"img_mlp.0", "ff.net.0.proj"},
    {"img_mlp.2", "ff.net.2"},
    {"txt_mlp.0", "ff_context.net.0.proj"},
    {"txt_mlp.2", "ff_context.net.2"},
    {"img_attn.norm.query_norm.scale", "attn.norm_q.weight"},
    {"img_attn.norm.key_norm.scale", "attn.norm_k.weight"},
    {"txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"},
    {"txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"},
};
static const rename_rule k_single[] = {
    {"linear2", "proj_out"},
    {"modulation.lin", "norm.linear"},
    {"norm.query_norm.scale", "attn.norm_q.weight"},
    {"norm.key_norm.scale", "attn.norm_k.weight"},
};

/* "<base>.weight|.bias" against a rule's `from`: the suffix ("" for .scale rules) */
static const char *match(const char *name, const char *from) {
    size_t n = strlen(from);
    if (strncmp(name, from, n)) return NULL;
    if (!name[n]) return "";
    if (!strcmp(name + n, ".weight") || !strcmp(name + n, ".bias")) return name + n;
    return NULL;
}

static const char *rule(const rename_rule *r, size_t n, const char *name, const char **suffix) {
    for (size_t i = 0; i < n; i++)
        if ((*suffix = match(name, r[i].from))) return r[i].to;
    return NULL;
}

static void free_ptr(void *p) { free(p); }

/* one BFL tensor of a FLUX file into diffusers names; D: the model width */
static dl_status flux_tensor(dl_checkpoint *ck, const dl_st_tensor *t, const char *name, int64_t D, const char *file) {
    char nm[4][320];
    const char *suffix, *to;
    int blk, used = 0;
    if (sscanf(name, "double_blocks.%d.%n", &blk, &used) == 1 && used) {
        const char *rest = name + used;
        if ((to = rule(k_double, sizeof k_double / sizeof k_double[0], rest, &suffix))) {
            snprintf(nm[0], sizeof nm[0], "transformer_blocks.%d.%s%s", blk, to, suffix);
            return add_named(ck, *t, nm[0]);
        }
        int img = (suffix = match(rest, "img_attn.qkv")) != NULL;
        if (img || (suffix = match(rest, "txt_attn.qkv"))) {
            static const char *const qi[3] = {"to_q", "to_k", "to_v"}, *const qt[3] = {"add_q_proj", "add_k_proj", "add_v_proj"};
            if (t->shape[0] != 3 * D)
                return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has %lld rows, not 3 x the width %lld", file, name,
                               (long long)t->shape[0], (long long)D);
            dl_status s = DL_OK;
            for (int k = 0; k < 3 && s == DL_OK; k++) {
                snprintf(nm[k], sizeof nm[k], "transformer_blocks.%d.attn.%s%s", blk, img ? qi[k] : qt[k], suffix);
                s = add_named(ck, rows(t, k * D, D), nm[k]);
            }
            return s;
        }
    } else if (sscanf(name, "single_blocks.%d.%n", &blk, &used) == 1 && used) {
        const char *rest = name + used;
        if ((to = rule(k_single, sizeof k_single / sizeof k_single[0], rest, &suffix))) {
            snprintf(nm[0], sizeof nm[0], "single_transformer_blocks.%d.%s%s", blk, to, suffix);
            return add_named(ck, *t, nm[0]);
        }
        if ((suffix = match(rest, "linear1"))) {
            static const char *const parts[4] = {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"};
            if (t->shape[0] <= 3 * D)
                return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has %lld rows, not 3 x the width %lld + the MLP's", file, name,
                               (long long)t->shape[0], (long long)D);
            dl_status s = DL_OK;
            for (int k = 0; k < 4 && s == DL_OK; k++) {
                snprintf(nm[k], sizeof nm[k], "single_transformer_blocks.%d.%s%s", blk, parts[k], suffix);
                s = add_named(ck, rows(t, k * D, k < 3 ? D : t->shape[0] - 3 * D), nm[k]);
            }
            return s;
        }
    } else if ((to = rule(k_top, sizeof k_top / sizeof k_top[0], name, &suffix))) {
        snprintf(nm[0], sizeof nm[0], "%s%s", to, suffix);
        return add_named(ck, *t, nm[0]);
    } else if ((suffix = match(name, "final_layer.adaLN_modulation.1"))) {
        if (t->shape[0] % 2)
            return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has an odd number of rows", file, name);
        uint8_t *sw = malloc(t->nbytes);
        if (!sw) return dl_fail(DL_ERR_NOMEM, "out of memory");
        const size_t half = t->nbytes / 2;
        memcpy(sw, t->data + half, half); /* scale first, then shift */
        memcpy(sw + half, t->data, half);
        dl_status s = dl_ckpt_keep(ck, sw, free_ptr);
        if (s != DL_OK) return s;
        dl_st_tensor v = *t;
        v.data = sw;
        snprintf(nm[0], sizeof nm[0], "norm_out.linear%s", suffix);
        return add_named(ck, v, nm[0]);
    }
    return dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` is not part of a FLUX transformer (Black Forest Labs' names)", file, name);
}

static void free_gguf(void *g) { dl_gguf_free(g); }

dl_status dl_ckpt_open_gguf(dl_checkpoint **out, const char *path, const char *label) {
    *out = NULL;
    dl_gguf *g;
    dl_status s = dl_gguf_open(&g, path);
    if (s != DL_OK) return s;
    dl_checkpoint *ck;
    if ((s = dl_ckpt_new_virtual(&ck, label ? label : path)) != DL_OK) {
        dl_gguf_free(g);
        return s;
    }
    if ((s = dl_ckpt_keep(ck, g, free_gguf)) != DL_OK) {
        dl_ckpt_free(ck);
        return s;
    }
    const char *file = dl_gguf_path(g);
    const int n = dl_gguf_count(g);
    static const char prefix[] = "model.diffusion_model.";
    int bfl = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = dl_gguf_at(g, i)->name;
        if (!strncmp(nm, prefix, sizeof prefix - 1)) nm += sizeof prefix - 1;
        bfl |= !strncmp(nm, "double_blocks.", 14) || !strncmp(nm, "single_blocks.", 14);
    }
    /* FLUX: the width from img_in (x_embedder): [D, in_channels] */
    int64_t D = 0;
    for (int i = 0; bfl && i < n; i++) {
        const dl_gguf_tensor *t = dl_gguf_at(g, i);
        const char *nm = t->name + (strncmp(t->name, prefix, sizeof prefix - 1) ? 0 : sizeof prefix - 1);
        if (!strcmp(nm, "img_in.weight")) D = t->shape[0];
    }
    if (bfl && D <= 0) s = dl_fail(DL_ERR_FORMAT, "`%s`: a FLUX file (double_blocks/single_blocks) without img_in.weight", label);
    for (int i = 0; i < n && s == DL_OK; i++) {
        const dl_gguf_tensor *t = dl_gguf_at(g, i);
        const char *nm = t->name + (strncmp(t->name, prefix, sizeof prefix - 1) ? 0 : sizeof prefix - 1);
        dl_st_tensor st = as_st(t, file);
        if (t->ndim < 1) s = dl_fail(DL_ERR_FORMAT, "`%s`: tensor `%s` has no dimensions", label, t->name);
        else if (bfl) s = flux_tensor(ck, &st, nm, D, label);
        else s = add_named(ck, st, nm);
    }
    if (s == DL_OK) s = dl_ckpt_seal(ck);
    if (s != DL_OK) {
        dl_ckpt_free(ck);
        return s;
    }
    *out = ck;
    return DL_OK;
}
