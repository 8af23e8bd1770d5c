/* `difflet compile` (build every program a serving shape needs) and `difflet cache
 * ls | verify | rm`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/registry.h"
#include "difflet/comm.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"

/* "WxH" */
static int parse_size(const char *s, int *w, int *h) {
    char x;
    return sscanf(s, "%d%c%d", w, &x, h) == 3 && (x == 'x' || x == 'X') && *w > 0 && *h > 0;
}

int cli_compile(int argc, char **argv) {
    const char *model = NULL, *par_spec = NULL;
    int w = 0, h = 0, maxseq = 0, recompile = 0, frames = 0, probe = 0;
    dl_dtype dt = dl_dtype_default();
    dl_quant quant = DL_QUANT_NONE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--recompile-on-mismatch")) {
            recompile = 1;
            continue;
        }
        if (!strcmp(a, "--probe")) { /* a model with a probe program compiles it with the others */
            probe = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "difflet: compile: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--size")) {
            if (!parse_size(v, &w, &h)) {
                fprintf(stderr, "difflet: compile: --size %s: expected WxH, e.g. 1024x768\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--dtype")) {
            if (!dl_dtype_parse(v, &dt, &quant)) {
                fprintf(stderr, "difflet: compile: --dtype %s: must be " DL_DTYPE_NAMES "\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--max-sequence-length")) {
            maxseq = atoi(v);
        } else if (!strcmp(a, "--parallel")) {
            par_spec = strcmp(v, "single") ? v : NULL;
        } else if (!strcmp(a, "--frames")) {
            char *end;
            frames = (int)strtol(v, &end, 10);
            if (*end || frames < 1 || frames > 100000) {
                fprintf(stderr, "difflet: compile: --frames %s: must be an integer in 1..100000\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "difflet: compile: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "difflet: compile: --model DIR is required\n");
        return 2;
    }
    char model_buf[4096];
    if (!cli_model("compile", model, model_buf, sizeof model_buf)) return 1;
    model = model_buf;
    const dl_model_entry *entry;
    if (dl_registry_lookup(model, &entry) != DL_OK) {
        fprintf(stderr, "difflet: compile: %s\n", dl_last_error());
        return 1;
    }
    int has_probe = 0;
    for (int c = 0; c < entry->ncomponents; c++) has_probe |= !strcmp(entry->components[c], "probe");
    if (probe && !has_probe) {
        fprintf(stderr, "difflet: compile: --probe: %s has no separate probe program; its step-caching probe runs fused into the transformer program\n",
                entry->pipeline_class);
        return 2;
    }
    int dw, dh, dframes;
    dl_registry_default_shape(entry, model, &dw, &dh, &dframes);
    if (!w) w = dw, h = dh;
    if (frames && entry->output == DL_MEDIA_IMAGE && frames != 1) {
        fprintf(stderr, "difflet: compile: %s makes images: --frames must be 1\n", entry->pipeline_class);
        return 2;
    }
    if (frames) dframes = frames;
    /* --parallel: every rank compiles its own transformer program (its slice of the
     * weights, its rows), started through mpirun as `generate --parallel` is */
    dl_par_config pc;
    if (dl_par_parse(par_spec, &pc) != DL_OK) {
        fprintf(stderr, "difflet: compile: %s\n", dl_last_error());
        return 2;
    }
    const int ranks = dl_par_ranks(&pc);
    dl_comm *world = NULL;
    dl_par_place place = {0};
    if (ranks > 1 && !cli_layout_ok("compile", model, par_spec, &pc, pc.cfg)) return 2;
    if (ranks > 1 && !dl_comm_launched()) {
        const char *sub[1] = {"compile"};
        return cli_mpirun(sub, 1, argc, argv, ranks, 0, 1);
    }
    if (ranks > 1 && (dl_comm_world(&world) != DL_OK || dl_par_place_new(world, &pc, &place) != DL_OK)) {
        fprintf(stderr, "difflet: compile: %s\n", dl_last_error());
        dl_comm_abort(1);
    }
    dl_gen_shape shape = {.width = w, .height = h, .frames = dframes, .max_sequence_length = maxseq, .dt = dt, .quant = quant,
                          .cache = recompile ? DL_CACHE_RECOMPILE_ON_MISMATCH : DL_CACHE_USE,
                          .par = ranks > 1 ? &place : NULL};
    dl_log_set_level(DL_LOG_INFO < dl_log_get_level() ? dl_log_get_level() : DL_LOG_INFO);
    dl_program_stats before = dl_program_stats_get();
    double t0 = dl_now();
    dl_pipeline *p;
    if (dl_pipeline_load(&p, model, &shape) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        if (ranks > 1) dl_comm_abort(1);
        return 1;
    }
    dl_program_stats after = dl_program_stats_get();
    const int last = entry->ncomponents - 1; /* the denoiser: the program every rank has */
    if (ranks > 1 && !dl_pipeline_is_host(p)) { /* this rank's program; the host releases it */
        printf("  rank %d (tp %d, cp %d): %s %s\n", place.rank, place.split.tp_rank, place.split.cp_rank,
               entry->components[last], dl_pipeline_program_id(p, last));
        int bad = dl_pipeline_worker(p) != DL_OK;
        dl_pipeline_free(p);
        dl_par_place_free(&place);
        dl_comm_finalize();
        return bad;
    }
    printf("%s %dx%d %s: %d compiled, %d already cached, %.2f s; cache %s\n", model, w, h, quant ? dl_quant_scheme_name(quant) : dl_dtype_name(dt),
           after.compiles - before.compiles, after.loads - before.loads, dl_now() - t0, dl_cache_dir());
    for (int c = 0; c < entry->ncomponents; c++) printf("  %-15s %s\n", entry->components[c], dl_pipeline_program_id(p, c));
    fflush(stdout);
    dl_pipeline_free(p);
    if (ranks > 1) {
        dl_par_place_free(&place);
        dl_comm_finalize();
    }
    return 0;
}

int cli_cache(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "difflet: cache needs ls, verify [ID...] or rm ID... | --all\n");
        return 2;
    }
    dl_cache_entry *e;
    int n;
    if (dl_cache_list(&e, &n) != DL_OK) {
        fprintf(stderr, "difflet: %s\n", dl_last_error());
        return 1;
    }
    int rc = 0;
    if (!strcmp(argv[0], "ls")) {
        printf("%s/programs: %d programs\n", dl_cache_dir(), n);
        for (int i = 0; i < n; i++)
            printf("%s  %8.1f MiB weights  %8.1f MiB arena  %s\n", e[i].id, (double)e[i].weight_bytes / 1048576.0,
                   (double)e[i].arena_bytes / 1048576.0, e[i].key);
    } else if (!strcmp(argv[0], "verify")) {
        int bad = 0;
        for (int i = 0; i < n; i++) {
            int want = argc == 1;
            for (int k = 1; k < argc; k++) want |= !strcmp(argv[k], e[i].id);
            if (!want) continue;
            if (dl_cache_verify(e[i].id) == DL_OK) printf("%s ok\n", e[i].id);
            else printf("%s CORRUPT: %s\n", e[i].id, dl_last_error()), bad++;
        }
        rc = bad ? 1 : 0;
    } else if (!strcmp(argv[0], "rm")) {
        if (argc < 2) {
            fprintf(stderr, "difflet: cache rm needs program ids or --all\n");
            rc = 2;
        } else if (!strcmp(argv[1], "--all")) {
            for (int i = 0; i < n; i++) dl_cache_remove(e[i].id);
            printf("removed %d programs\n", n);
        } else {
            for (int k = 1; k < argc; k++)
                if (dl_cache_remove(argv[k]) != DL_OK) {
                    fprintf(stderr, "difflet: %s\n", dl_last_error());
                    rc = 1;
                }
        }
    } else {
        fprintf(stderr, "difflet: cache: unknown action '%s' (ls, verify, rm)\n", argv[0]);
        rc = 2;
    }
    free(e);
    return rc;
}
