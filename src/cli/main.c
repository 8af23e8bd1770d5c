/* `difflet`: one binary, one subcommand per job. Argument errors print one line
 * and exit 2; runtime failures print the library's message and exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/registry.h"
#include "difflet/check.h"
#include "difflet/kernels.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: difflet <command> [options]\n"
            "\n"
            "commands:\n"
            "  models               the pipeline classes difflet serves and what each makes\n"
            "  tokenize             --model DIR [--component tokenizer|tokenizer_2] [--json] TEXT:\n"
            "                       the ids and token strings the model's tokenizer gives TEXT\n"
            "  generate             prompt in, picture out, from a diffusers pipeline folder\n"
            "                       (a class `difflet models` lists):\n"
            "                       --model DIR --prompt TEXT [--negative-prompt TEXT]\n"
            "                       [--width W --height H] [--steps N] [--guidance G]\n"
            "                       [--true-cfg S] [--seed S] [--dtype f32|bf16|int8|int8-wo] [--threads N]\n"
            "                       [--max-sequence-length N] [--latents FILE] [--cfg-batch]\n"
            "                       [--image IN.png|jpg|webp [--mask MASK] [--strength 0.6]]\n"
            "                       (FLUX image-to-image; with --mask, inpainting: white repaints)\n"
            "                       [--frames F] [--fps R] [--save-frames DIR] [--save-audio FILE.wav]\n"
            "                       [--output-compression 0..100] [-o OUT.png|jpg|webp|mp4]\n"
            "                       [--no-cache] [--recompile-on-mismatch]\n"
            "                       [--cache off|cadence:N|online-delta[:A]|calibrated:FILE[:T]]\n"
            "                       [--cache-keep FIRST,LAST]  (step caching; default keep 5,5)\n"
            "                       [--parallel tp=N,sp,cp=N[:ulysses|ring|gather],cfg=2,dp=N]\n"
            "                       (MPI ranks, started through mpirun; --prompt may repeat)\n"
            "  compile              build and cache the programs of a serving shape:\n"
            "                       --model DIR [--size WxH] [--dtype f32|bf16|int8|int8-wo]\n"
            "                       [--max-sequence-length N] [--recompile-on-mismatch]\n"
            "  eval-tiny            prompt-following table of difflet-tiny on held-out prompts\n"
            "                       [--model DIR] [--prompts N] [--steps N] [--true-cfg S] [--dtype T]\n"
            "                       [--negative-prompt TEXT (default empty; used when --true-cfg > 1)]\n"
            "                       [--prompts-file F (default DIR/eval_prompts.json)]\n"
            "                       [--min-bg F --min-fg F --min-pos F] [--json F] [--save-grid PNG]\n"
            "  eval-tiny-video      the same for difflet-tiny-video: colours and motion of held-out clips\n"
            "                       [--model DIR] [--prompts N] [--steps N] [--guidance S (the model's)] [--dtype T]\n"
            "                       [--negative-prompt TEXT (default empty)]\n"
            "                       [--prompts-file F (default DIR/eval_prompts.json)]\n"
            "                       [--min-bg F --min-fg F --min-motion F] [--json F] [--save-grid PNG]\n"
            "  calibrate            fit the probe -> output-change polynomial for step caching:\n"
            "                       --prompts FILE [--model DIR] [--steps 50] [--degree 4]\n"
            "                       [--skip-budget N] [--size WxH] [--true-cfg S] [-o calib.json]\n"
            "  calibrate-int8       measure W8A8's activation error per linear on prompts; a layer above\n"
            "                       the threshold compiles weight-only: --model DIR --prompts FILE\n"
            "                       [--steps N] [--size WxH] [--threshold 0.05] [-o DIR/int8_calibration.json]\n"
            "  eval-cache           step caching quality and speed per mode vs uncached and vs\n"
            "                       fewer steps: --prompts FILE [--modes m1,m2] [--steps 50] [--repeat 3] ...\n"
            "  serve                HTTP API (OpenAI-style images, OpenAI's videos API for video\n"
            "                       models, async jobs) with resident model processes:\n"
            "                       [--deployment FILE] [--port N] [--host H]\n"
            "                       [--api-key K | --api-key-file F | env DIFFLET_API_KEY]\n"
            "                       [--allowed-hosts NAME,... (Host names answered without a key)]\n"
            "                       [--model DIR|org/name [--sizes WxH,...] [--frames N,...] [--fps R]]...\n"
            "                       (--model repeats: one server, several models, the request's `model`\n"
            "                       picks one; --sizes/--frames/--fps apply to the --model before them)\n"
            "                       [--results DIR] [--no-compile]\n"
            "  loadgen              open-loop Poisson load on a loopback server: --url URL\n"
            "                       [--rate R] [--requests N] [--steps S] [--slo SECONDS]\n"
"  profile             DDiT profile table (RIB): import FILE.csv [--name N] | show [NAME]\n"
            "                       | measure  [--db FILE]  (built in: fig17, the paper's Figure 17)\n"
            "                       measure: [--model DIR] [--sizes WxH,...] [--frames F] [--steps N] [--reps N]\n"
            "                       [--max-dop D] [--oversubscribe] [--name N] [--csv FILE] | --real-width opensora\n"
            "                       [--depth 28] [--caption-valid V] [--vae-check] (`profile measure --help`)\n"
            "  simulate            DDiT scheduling simulation: [--profile P] [--policy ddit|sdop:N|\n"
            "                       spci|dpci|dp|optimal] [--rate R|burst] [--mix L:M:H]\n"
            "                       [--requests N] [--nodes K] [--devices-per-node D] [--seed S]\n"
            "  sched-eval          the DDiT paper's evaluation grid as CSV: [--out docs/sched]\n"
            "  ddit                a request trace served by DDiT on real ranks (elastic CP groups,\n"
            "                       promotion at step boundaries, decoupled VAE) beside its simulation:\n"
            "                       --model DIR --sizes WxH,... --profile NAME [--units U] [--frames F]\n"
            "                       [--policy ddit|sdop:N] [--rate R|burst] [--requests N] [--out DIR]\n"
            "  cache ls|verify|rm   list, check every checksum of, or remove cached programs\n"
            "  selfcheck            check every CPU kernel of this machine's fast path against\n"
            "                       the plain C references (f32, bf16, f16) and the fused\n"
            "                       attention against its reference\n"
            "  bench kernels        matmul / attention / element-wise throughput, as ratios to\n"
            "                       same-run matmul and memcpy  [--json FILE] [--quick]\n"
            "  inspect PATH         validate and summarise a diffusers model folder or a\n"
            "                       safetensors checkpoint (file or .index.json)\n"
            "  bench flux-step      one FLUX-width denoiser step (1 double + 1 single block,\n"
            "                       4096 + 512 tokens, bf16) vs diffusers on the same weights\n"
            "                       (needs make tools-venv)  [--json FILE] [--quick]\n"
            "  bench int8-step      the FLUX-width step in f32, bf16, int8 and int8-wo: step\n"
            "                       times, output error against f32, projection rates\n"
            "                       [--json FILE] [--quick] [--reps N]\n"
            "  bench wan-step       one Wan-1.3B-width transformer block at 81 x 480 x 832\n"
            "                       (32,760 video + 512 text tokens) vs diffusers on the same\n"
            "                       weights: ratio, attention share, memory; then the Wan VAE\n"
            "                       decoder's chunked vs unchunked memory and chunk time\n"
            "                       [--json FILE] [--quick] [--dtype f32|bf16] [--no-vae] [--vae-time]\n"
            "  bench qwen-step      one Qwen-Image-width block at 1024 x 1024 (4096 image tokens,\n"
            "                       200 valid of 512 text rows) vs diffusers on the same weights:\n"
            "                       ratio, attention share, memory  [--json FILE] [--quick] [--dtype f32|bf16]\n"
            "  bench hunyuan-step   one HunyuanVideo-width dual + single block (10,240 video tokens,\n"
            "                       256 text rows) vs diffusers on the same weights: ratio,\n"
            "                       attention share, memory  [--json FILE] [--quick] [--dtype f32|bf16]\n"
            "  bench ltx2-step      one LTX-2-width audio-video block (2,304 video + 43 audio tokens,\n"
            "                       1024 text rows) vs diffusers on the same weights: ratio,\n"
            "                       attention share, memory  [--json FILE] [--quick] [--dtype f32|bf16]\n"
            "  bench stdit-step     one OpenSora 1.2 STDiT3-width spatial + temporal block pair at\n"
            "                       240 x 426 x 51 frames (6,075 tokens, CFG batch 2, 120 valid of 300\n"
            "                       caption rows) vs a torch transcription checked against Open-Sora's\n"
            "                       outputs, same weights: ratio, phases, attention kernels, memory\n"
            "                       [--json FILE] [--quick] [--dtype f32|bf16] [--reps N]\n"
            "  bench startup        restart cost: checkpoint load vs compile vs artifact load,\n"
            "                       resident memory, first image cold / warm  [--json FILE]\n"
            "  bench parallel       one FLUX-width step on 1 rank x 2 threads and on 2 ranks x 1\n"
            "                       thread per layout (TP2, TP2+SP, CP2 ulysses/ring/gather):\n"
            "                       ratios, bytes sent, time in communication  [--json F] [--quick]\n"
            "  version              engine version, kernel path, oneDNN version\n"
            "\n"
            "environment: DIFFLET_KERNELS=ref|avx2|avx512  DIFFLET_LOG=debug|info|warn|error\n"
            "             DIFFLET_CACHE=DIR (programs; default ~/.cache/difflet)\n"
            "             OMP_NUM_THREADS=N (threads for kernels and oneDNN)\n");
}

static void print_fail(const dl_check_result *r, void *ctx) {
    int *n = ctx;
    (*n)++;
    if (!r->ok)
        printf("  FAIL %-20s %-4s %lldx%lld: error %.2fx tolerance (got %g, want %g)\n", r->op,
               dl_dtype_name(r->dt), (long long)r->rows, (long long)r->cols, r->worst, r->got, r->want);
}

/* Fast attention vs reference on one shape; returns 0 when within tolerance. */
static int check_attention(dl_dtype dt) {
    const int64_t S = 200, H = 3, D = 64;
    size_t es = dl_dtype_size(dt), n = (size_t)(S * H * D);
    void *q = malloc(n * es), *k = malloc(n * es), *v = malloc(n * es);
    void *o = malloc(n * es), *o_ref = malloc(n * es);
    if (!q || !k || !v || !o || !o_ref) {
        fprintf(stderr, "difflet: out of memory\n");
        return 1;
    }
    dl_fill_uniform(dt, q, (int64_t)n, -1.f, 1.f, 1);
    dl_fill_uniform(dt, k, (int64_t)n, -1.f, 1.f, 2);
    dl_fill_uniform(dt, v, (int64_t)n, -1.f, 1.f, 3);
    dl_attn_args a = {.dt = dt, .sq = S, .sk = S, .heads = H, .head_dim = D, .q = q, .k = k, .v = v,
                      .out = o, .kv_begin = 7, .kv_end = 190, .scale = 0.125f};
    dl_status s = dl_attn(&a, NULL);
    dl_isa isa = dl_kernel_isa();
    dl_set_kernel_isa(DL_ISA_REF);
    a.out = o_ref;
    if (s == DL_OK) s = dl_attn(&a, NULL);
    dl_set_kernel_isa(isa);
    int bad = 1;
    if (s != DL_OK) {
        fprintf(stderr, "difflet: attention: %s\n", dl_last_error());
    } else {
        double atol, rtol;
        dl_check_tolerance(dt, &atol, &rtol);
        double worst = dl_compare(dt, o, o_ref, (int64_t)n, atol, rtol, NULL);
        bad = worst > 1.0;
        printf("  attention %-4s: worst error %.3fx tolerance  %s\n", dl_dtype_name(dt), worst,
               bad ? "FAIL" : "ok");
    }
    free(q), free(k), free(v), free(o), free(o_ref);
    return bad;
}

static int cmd_selfcheck(void) {
    static const int64_t shapes[] = {1, 1, 3, 17, 8, 64, 5, 130, 16, 3072};
    printf("difflet %s selfcheck: kernel path %s, %d threads\n", DIFFLET_VERSION,
           dl_isa_name(dl_kernel_isa()), dl_threads());
    int count = 0;
    int fails = dl_kernels_check(shapes, (int)(sizeof shapes / sizeof shapes[0] / 2), 3, print_fail, &count);
    printf("  element-wise ops: %d comparisons, %d out of tolerance\n", count, fails);
    fails += check_attention(DL_F32);
    fails += check_attention(DL_BF16);
    printf(fails ? "selfcheck FAILED\n" : "selfcheck passed\n");
    return fails ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "models")) {
        for (int i = 0; i < dl_registry_count(); i++) {
            const dl_model_entry *e = dl_registry_at(i);
            printf("%-24s %-12s programs:", e->pipeline_class, dl_media_kind_name(e->output));
            for (int c = 0; c < e->ncomponents; c++) printf(" %s", e->components[c]);
            printf("\n");
        }
        return 0;
    }
    if (!strcmp(cmd, "version")) {
        printf("difflet %s (kernels %s, oneDNN %s, %d threads)\n", DIFFLET_VERSION,
               dl_isa_name(dl_kernel_isa()), dl_onednn_version(), dl_threads());
        return 0;
    }
    if (!strcmp(cmd, "selfcheck")) return cmd_selfcheck();
    if (!strcmp(cmd, "inspect")) return cli_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cli_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "generate")) return cli_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "compile")) return cli_compile(argc - 2, argv + 2);
    if (!strcmp(cmd, "eval-tiny")) return cli_eval_tiny(argc - 2, argv + 2);
    if (!strcmp(cmd, "eval-tiny-video")) return cli_eval_tiny_video(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate")) return cli_calibrate(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate-int8")) return cli_calibrate_int8(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return cli_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve-worker")) return cli_serve_worker(argc - 2, argv + 2);
    if (!strcmp(cmd, "loadgen")) return cli_loadgen(argc - 2, argv + 2);
    if (!strcmp(cmd, "eval-cache")) return cli_eval_cache(argc - 2, argv + 2);
    if (!strcmp(cmd, "cache")) return cli_cache(argc - 2, argv + 2);
    if (!strcmp(cmd, "profile")) return cli_profile(argc - 2, argv + 2);
    if (!strcmp(cmd, "simulate")) return cli_simulate(argc - 2, argv + 2);
    if (!strcmp(cmd, "sched-eval")) return cli_sched_eval(argc - 2, argv + 2);
    if (!strcmp(cmd, "ddit")) return cli_ddit(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) {
        if (argc < 3) {
            fprintf(stderr, "difflet: bench needs a target: kernels, flux-step, int8-step, wan-step, qwen-step, hunyuan-step, ltx2-step, stdit-step\n");
            return 2;
        }
        if (!strcmp(argv[2], "kernels")) return cli_bench_kernels(argc - 3, argv + 3);
        if (!strcmp(argv[2], "flux-step")) return cli_bench_flux(argc - 3, argv + 3);
        if (!strcmp(argv[2], "int8-step")) return cli_bench_int8(argc - 3, argv + 3);
        if (!strcmp(argv[2], "wan-step")) return cli_bench_wan(argc - 3, argv + 3);
        if (!strcmp(argv[2], "qwen-step")) return cli_bench_qwen(argc - 3, argv + 3);
        if (!strcmp(argv[2], "hunyuan-step")) return cli_bench_hunyuan(argc - 3, argv + 3);
        if (!strcmp(argv[2], "ltx2-step")) return cli_bench_ltx2(argc - 3, argv + 3);
        if (!strcmp(argv[2], "stdit-step")) return cli_bench_opensora(argc - 3, argv + 3);
        if (!strcmp(argv[2], "startup")) return cli_bench_startup(argc - 3, argv + 3);
        if (!strcmp(argv[2], "startup-child")) return cli_bench_startup_child(argc - 3, argv + 3);
        if (!strcmp(argv[2], "parallel")) return cli_bench_parallel(argc - 3, argv + 3);
        if (!strcmp(argv[2], "parallel-rank")) return cli_bench_parallel_rank(argc - 3, argv + 3);
        fprintf(stderr, "difflet: unknown bench target '%s' (available: kernels, flux-step, int8-step, wan-step, qwen-step, hunyuan-step, ltx2-step, stdit-step, startup, parallel)\n", argv[2]);
        return 2;
    }
    fprintf(stderr, "difflet: unknown command '%s' (try 'difflet --help')\n", cmd);
    return 2;
}
