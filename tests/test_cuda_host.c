/* What of the CUDA backend a CPU can check (docs/cuda.md), run in every build:
 * - the step-graph bookkeeping, driven by a recording fake of the device operations:
 *   the first run captures (record called once, inside begin/end), later runs replay;
 *   every run uploads the step's scalars before its launch; a failed recording keeps
 *   nothing and the next run records again; another program's key and a wrong scalar
 *   size are refused; reset records again;
 * - the liveness planner's placement (the device arena's layout) is the host arena's;
 * - with the backend built (DIFFLET_HAVE_CUDA): the device probe says why there is no
 *   GPU (or names it) and reports the library versions; the kernels, the GEMM and the
 *   NCCL layer refuse bad arguments before any CUDA call (nothing launched). */
#include <string.h>

#include "difflet/cuda.h"
#include "models/models_impl.h"
#include "test_util.h"
#ifdef DIFFLET_HAVE_CUDA
#include "difflet/comm.h"
#endif

/* the fake device: a log of operations ("B" begin, "E" end, "A" abort, "U<v>" upload of
 * the first scalar, "L<graph>" launch, "D" destroy) */
typedef struct {
    char log[512];
    float dev_scalar; /* the "device" buffer */
    int graphs, fail_end;
} fake;

static void logf_(fake *f, const char *s) { strncat(f->log, s, sizeof f->log - strlen(f->log) - 1); }
static dl_status f_begin(void *c) { return logf_(c, "B"), DL_OK; }
static dl_status f_end(void *c, void **g) {
    fake *f = c;
    if (f->fail_end) return logf_(f, "E!"), dl_fail(DL_ERR_BACKEND, "fake: instantiate failed");
    logf_(f, "E");
    *g = (void *)(intptr_t)++f->graphs;
    return DL_OK;
}
static void f_abort(void *c) { logf_(c, "A"); }
static dl_status f_upload(void *c, void *d, const void *s, size_t n) {
    fake *f = c;
    char b[32];
    memcpy(d, s, n);
    snprintf(b, sizeof b, "U%g", (double)f->dev_scalar);
    logf_(f, b);
    return DL_OK;
}
static dl_status f_launch(void *c, void *g) {
    char b[32];
    snprintf(b, sizeof b, "L%d", (int)(intptr_t)g);
    return logf_(c, b), DL_OK;
}
static void f_destroy(void *c, void *g) { logf_(c, "D"); }
static const dl_graph_ops k_fake = {f_begin, f_end, f_abort, f_upload, f_launch, f_destroy};

typedef struct {
    fake *f;
    int calls, fail;
} rec;
static dl_status record(void *ctx) {
    rec *r = ctx;
    r->calls++;
    logf_(r->f, "R");
    return r->fail ? dl_fail(DL_ERR_BACKEND, "fake: a kernel failed to enqueue") : DL_OK;
}

static void test_graph(void) {
    fake f = {0};
    dl_step_graph *g = NULL;
    rec r = {&f, 0, 0};
    CHECK(dl_step_graph_new(&g, &k_fake, &f, "prog-a", &f.dev_scalar, sizeof(float)) == DL_OK, "%s", dl_last_error());
    if (!g) return;
    const float t[3] = {999.f, 500.f, 1.f};
    for (int i = 0; i < 3; i++) CHECK(dl_step_graph_run(g, "prog-a", &t[i], sizeof t[i], record, &r) == DL_OK, "step %d", i);
    int cap, rep;
    dl_step_graph_stats(g, &cap, &rep);
    CHECK(r.calls == 1 && cap == 1 && rep == 2 && !strcmp(f.log, "U999BREL1U500L1U1L1") && f.dev_scalar == 1.f,
          "capture once, replay twice, scalars uploaded before each launch: %s", f.log);
    /* another program, another size: refused, nothing run */
    f.log[0] = 0;
    CHECK(dl_step_graph_run(g, "prog-b", &t[0], sizeof t[0], record, &r) == DL_ERR_INVALID && strstr(dl_last_error(), "prog-a"),
          "another program's key: %s", dl_last_error());
    CHECK(dl_step_graph_run(g, "prog-a", t, 2 * sizeof t[0], record, &r) == DL_ERR_INVALID && !f.log[0],
          "a wrong scalar size: %s", f.log);
    /* reset: the next run records a new graph */
    dl_step_graph_reset(g);
    CHECK(dl_step_graph_run(g, "prog-a", &t[1], sizeof t[1], record, &r) == DL_OK && r.calls == 2 && !strcmp(f.log, "DU500BREL2"),
          "after a reset the step is recorded again: %s", f.log);
    dl_step_graph_free(g);
    /* a recording that fails keeps nothing; the next run records again */
    fake f2 = {0};
    rec r2 = {&f2, 0, 1};
    CHECK(dl_step_graph_new(&g, &k_fake, &f2, "prog-a", &f2.dev_scalar, sizeof(float)) == DL_OK, "%s", dl_last_error());
    CHECK(dl_step_graph_run(g, "prog-a", &t[0], sizeof t[0], record, &r2) == DL_ERR_BACKEND && !strcmp(f2.log, "U999BRA"),
          "a failed recording is aborted: %s", f2.log);
    r2.fail = 0, f2.fail_end = 1, f2.log[0] = 0;
    CHECK(dl_step_graph_run(g, "prog-a", &t[0], sizeof t[0], record, &r2) == DL_ERR_BACKEND && !strcmp(f2.log, "U999BRE!"),
          "a failed instantiation: %s", f2.log);
    f2.fail_end = 0, f2.log[0] = 0;
    CHECK(dl_step_graph_run(g, "prog-a", &t[0], sizeof t[0], record, &r2) == DL_OK && !strcmp(f2.log, "U999BREL1"),
          "then a good recording: %s", f2.log);
    dl_step_graph_stats(g, &cap, &rep);
    CHECK(cap == 1 && rep == 0, "only the good capture counts: %d, %d", cap, rep);
    dl_step_graph_free(g);
    CHECK(dl_step_graph_new(&g, &k_fake, &f2, NULL, NULL, 0) == DL_ERR_INVALID && !g, "no key refused");
    CHECK(dl_step_graph_new(&g, &k_fake, &f2, "k", NULL, 4) == DL_ERR_INVALID && !g, "scalars without a buffer refused");
}

/* the device arena's layout is the host arena's: the planner places, either allocates */
static void test_plan(void) {
    act_plan a = {0}, b = {0};
    void *pa[3], *pb[3], *arena = NULL;
    dl_wsrc ws = {0};
    const size_t sz[3] = {1000, 5000, 3000};
    const int first[3] = {0, 0, 1}, last[3] = {0, 1, 1};
    for (int i = 0; i < 3; i++) dl_plan_add(&a, &pa[i], sz[i], first[i], last[i]), dl_plan_add(&b, &pb[i], sz[i], first[i], last[i]);
    dl_plan_place(&a);
    CHECK(dl_plan_commit(&b, &ws, &arena) == DL_OK, "%s", dl_last_error());
    int same = a.total == b.total;
    for (int i = 0; i < 3; i++) same &= a.b[i].off == b.b[i].off && (char *)pb[i] - (char *)arena == (ptrdiff_t)b.b[i].off;
    /* buffer 0 (phase 0) and buffer 2 (phase 1) share bytes: total < the sum */
    CHECK(same && a.total < 1024 + 5056 + 3008, "placement: %zu bytes (host %zu)", a.total, b.total);
    dl_aligned_free(arena);
}

#ifdef DIFFLET_HAVE_CUDA
static void test_refusals(void) {
    dl_cuda_info in;
    dl_status s = dl_cuda_probe(&in);
    char key[128];
    dl_cuda_key(&in, key, sizeof key);
    CHECK((s == DL_OK && in.devices > 0 && in.sm_major > 0) ||
              (s == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "no CUDA device") && in.devices == 0),
          "probe: %s", dl_last_error());
    CHECK(in.runtime >= 12000 && in.cublaslt > 0 && in.cudnn > 0 && in.nccl > 0, "library versions: %s nccl %d", key, in.nccl);
    printf("CUDA: %s (%s)\n", s == DL_OK ? in.name : "no device", key);
    float dummy[64];
    /* attention: head_dim 48 (not a multiple of 32), a key interval past the keys, a bias */
    dl_attn_args a = {.dt = DL_BF16, .sq = 4, .sk = 4, .heads = 1, .head_dim = 48, .q = dummy, .k = dummy, .v = dummy,
                      .out = dummy, .kv_begin = 0, .kv_end = 4, .scale = 1.f};
    CHECK(dl_cuda_attention(&a, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "multiple of 32"), "%s", dl_last_error());
    a.head_dim = 64, a.kv_end = 5;
    CHECK(dl_cuda_attention(&a, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "interval"), "%s", dl_last_error());
    a.kv_end = 4, a.o_part = dummy;
    CHECK(dl_cuda_attention(&a, NULL) == DL_ERR_INVALID, "partial outputs without m and l");
    a.o_part = NULL, a.dt = DL_F16;
    CHECK(dl_cuda_attention(&a, NULL) == DL_ERR_UNSUPPORTED, "f16 refused by name: %s", dl_last_error());
    CHECK(dl_cuda_rope(DL_BF16, dummy, 2, 1, 63, 63, dummy, dummy, NULL) == DL_ERR_INVALID, "odd head_dim");
    CHECK(dl_cuda_activation(DL_F32, dummy, 4, DL_ACT_RELU, NULL) == DL_ERR_INVALID, "ReLU is not a CUDA activation");
    CHECK(dl_cuda_rmsnorm(DL_F32, NULL, dummy, NULL, 1, 4, 1e-6f, NULL) == DL_ERR_INVALID, "NULL input");
    CHECK(dl_cuda_ln_modulate(DL_BF16, dummy, dummy, NULL, dummy, 1, 4, 1e-6f, NULL) == DL_ERR_INVALID, "no scale");
    CHECK(dl_cuda_convert(DL_F32, dummy, DL_F32, dummy, 0, NULL) == DL_ERR_INVALID, "0 values");
    dl_cuda_gemm *g = NULL;
    CHECK(dl_cuda_gemm_new(&g, 0, 4, 4, DL_BF16, DL_BF16, DL_ACT_NONE) == DL_ERR_INVALID && !g, "m = 0");
    CHECK(dl_cuda_gemm_new(&g, 4, 4, 4, DL_BF16, DL_BF16, DL_ACT_SILU) == DL_ERR_UNSUPPORTED && !g && strstr(dl_last_error(), "SiLU"),
          "%s", dl_last_error());
    CHECK(dl_cuda_gemm_run(NULL, dummy, dummy, NULL, dummy, NULL) == DL_ERR_INVALID, "no GEMM");
    /* NCCL: every collective checks before NCCL is called */
    dl_nccl *c = NULL;
    CHECK(dl_nccl_init(&c, NULL, 0) == DL_ERR_INVALID && !c && strstr(dl_last_error(), "MPI"), "%s", dl_last_error());
    CHECK(dl_nccl_allreduce_sum(NULL, dummy, 4, DL_F32, NULL) == DL_ERR_INVALID && strstr(dl_last_error(), "not initialised"),
          "%s", dl_last_error());
    CHECK(dl_nccl_allreduce_sum(NULL, dummy, 4, DL_F16, NULL) == DL_ERR_UNSUPPORTED, "an f16 all-reduce: %s", dl_last_error());
    CHECK(dl_nccl_allgather(NULL, NULL, dummy, 16, NULL) == DL_ERR_INVALID, "all-gather without a communicator");
    CHECK(dl_nccl_bcast(NULL, dummy, 16, 0, NULL) == DL_ERR_INVALID, "broadcast without a communicator");
    CHECK(dl_nccl_rank(NULL) == -1 && dl_nccl_size(NULL) == 0, "rank and size of none");
    if (s != DL_OK) { /* without a device: init says so (one rank, the world of this process) */
        dl_comm *w = NULL;
        if (dl_comm_world(&w) == DL_OK)
            CHECK(dl_nccl_init(&c, w, 0) == DL_ERR_UNSUPPORTED && !c && strstr(dl_last_error(), "no CUDA device"), "%s",
                  dl_last_error());
        dl_comm_finalize();
    }
}
#endif

int main(void) {
    test_graph();
    test_plan();
#ifdef DIFFLET_HAVE_CUDA
    test_refusals();
#else
    printf("CUDA backend not built: only the host-side bookkeeping is checked\n");
#endif
    return test_done("test_cuda_host");
}
