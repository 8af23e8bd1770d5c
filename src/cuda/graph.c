/* Step graphs: the host-side bookkeeping of capturing one denoiser step once per
 * program and replaying it (include/difflet/cuda.h; docs/cuda.md). Plain C in every
 * build: the device operations come in a table (dl_cuda_graph_ops() for CUDA's), so a
 * CPU test drives the same logic. Per run: the per-step scalars are uploaded to their
 * device buffer (outside the graph: a capture records kernels, never host data), then
 * the graph launches; the first run records it by calling `record` inside a capture.
 * A failed capture keeps nothing, and the next run records again. */
#include <stdlib.h>
#include <string.h>

#include "difflet/cuda.h"

struct dl_step_graph {
    const dl_graph_ops *ops;
    void *ctx, *graph, *d_scalars;
    size_t scalar_bytes;
    char *key;
    int captures, replays;
};

dl_status dl_step_graph_new(dl_step_graph **out, const dl_graph_ops *ops, void *ctx, const char *key, void *d_scalars,
                            size_t scalar_bytes) {
    *out = NULL;
    if (!ops || !ops->begin || !ops->end || !ops->abort || !ops->upload || !ops->launch || !ops->destroy || !key ||
        (scalar_bytes && !d_scalars))
        return dl_fail(DL_ERR_INVALID, "step graph: operations, a program key and the scalars' device buffer are needed");
    dl_step_graph *g = calloc(1, sizeof *g);
    if (!g || !(g->key = strdup(key))) {
        free(g);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    g->ops = ops, g->ctx = ctx, g->d_scalars = d_scalars, g->scalar_bytes = scalar_bytes;
    *out = g;
    return DL_OK;
}

dl_status dl_step_graph_run(dl_step_graph *g, const char *key, const void *scalars, size_t bytes, dl_graph_record_fn record,
                            void *rctx) {
    if (!g || !key || !record || bytes != g->scalar_bytes || (bytes && !scalars))
        return dl_fail(DL_ERR_INVALID, "step graph: %zu bytes of scalars given, %zu expected (or a NULL argument)", bytes,
                       g ? g->scalar_bytes : (size_t)0);
    if (strcmp(key, g->key))
        return dl_fail(DL_ERR_INVALID, "step graph: captured for program %s, run for %s", g->key, key);
    dl_status s;
    if (bytes && (s = g->ops->upload(g->ctx, g->d_scalars, scalars, bytes))) return s;
    if (!g->graph) { /* the first step of this program: record it */
        if ((s = g->ops->begin(g->ctx))) return s;
        if ((s = record(rctx))) {
            g->ops->abort(g->ctx);
            return s;
        }
        if ((s = g->ops->end(g->ctx, &g->graph))) {
            g->graph = NULL;
            return s;
        }
        g->captures++;
    } else {
        g->replays++;
    }
    return g->ops->launch(g->ctx, g->graph);
}

void dl_step_graph_reset(dl_step_graph *g) {
    if (g && g->graph) g->ops->destroy(g->ctx, g->graph), g->graph = NULL;
}

void dl_step_graph_stats(const dl_step_graph *g, int *captures, int *replays) {
    *captures = g->captures, *replays = g->replays;
}

void dl_step_graph_free(dl_step_graph *g) {
    if (!g) return;
    dl_step_graph_reset(g);
    free(g->key);
    free(g);
}
