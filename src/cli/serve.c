/* `difflet serve` (the API process, serving one or more models) and `difflet
 * serve-worker` (a model process it starts, one model each; not for direct use). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/comm.h"
#include "difflet/request.h"
#include "difflet/serve.h"

/* --sizes WxH,... or --frames N,... into p; 0 (after saying why) on a bad list */
static int model_list_flag(dl_deployment *p, const char *a, const char *v) {
    int sizes = a[2] == 's', n = 0;
    for (const char *t = v; *t && n <= 8; n++) {
        char item[32];
        size_t k = strcspn(t, ",");
        snprintf(item, sizeof item, "%.*s", (int)(k < sizeof item - 1 ? k : sizeof item - 1), t);
        char *end;
        long f = sizes ? 0 : strtol(item, &end, 10);
        if (n == 8 || k >= sizeof item || (sizes ? !dl_parse_size(item, &p->sizes[n][0], &p->sizes[n][1])
                                                 : (!item[0] || *end || f < 1 || f > 100000))) {
            fprintf(stderr, "difflet: serve: %s %s: up to 8 comma-separated %s\n", a, v,
                    sizes ? "sizes WxH" : "frame counts in 1..100000");
            return 0;
        }
        if (!sizes) p->frames[n] = (int)f;
        t += k + (t[k] == ',');
    }
    if (!n) {
        fprintf(stderr, "difflet: serve: %s needs at least one value\n", a);
        return 0;
    }
    if (sizes) p->nsizes = n;
    else p->nframes = n, p->frames_given = 1;
    return 1;
}

/* A flag of the server (into d, the first model's deployment, whose server settings
 * every model takes) or of a model (into m): 1 taken, 0 refused (said why), -1 not one. */
static int serve_flag(dl_deployment *d, dl_deployment *m, const char *a, const char *v) {
    if (!strcmp(a, "--port")) d->port = atoi(v);
    else if (!strcmp(a, "--host")) snprintf(d->host, sizeof d->host, "%s", v);
    else if (!strcmp(a, "--api-key")) snprintf(d->api_key, sizeof d->api_key, "%s", v);
    else if (!strcmp(a, "--allowed-hosts")) snprintf(d->allowed_hosts, sizeof d->allowed_hosts, "%s", v);
    else if (!strcmp(a, "--api-key-file")) { /* kept out of `ps` */
        char *k;
        size_t n;
        if (dl_file_read(v, sizeof d->api_key - 1, &k, &n) != DL_OK) {
            fprintf(stderr, "difflet: serve: --api-key-file %s: %s\n", v, dl_last_error());
            return 0;
        }
        while (n && (k[n - 1] == '\n' || k[n - 1] == '\r' || k[n - 1] == ' ')) k[--n] = 0;
        snprintf(d->api_key, sizeof d->api_key, "%s", k);
        free(k);
    } else if (!strcmp(a, "--results")) {
        snprintf(d->results, sizeof d->results, "%s", v);
        snprintf(d->db, sizeof d->db, "%.1000s/jobs.sqlite", v);
    } else if (!strcmp(a, "--sizes") || !strcmp(a, "--frames")) return model_list_flag(m, a, v);
    else if (!strcmp(a, "--fps")) {
        char *end;
        m->fps = strtod(v, &end), m->fps_given = 1;
        if (*end || !(m->fps > 0 && m->fps <= 1000)) {
            fprintf(stderr, "difflet: serve: --fps must be a number in (0, 1000]\n");
            return 0;
        }
    } else return -1;
    return 1;
}

/* Each model resolved (frames given after its folder are rounded as its pipeline
 * rounds them) and its parallel layout checked before anything starts: 0, or the
 * exit code (after saying why). */
static int models_check(dl_serve_config *c) {
    for (int i = 0; i < c->nmodels; i++) {
        dl_deployment *p = &c->models[i];
        if (dl_deployment_set_model(p, p->model) != DL_OK) {
            fprintf(stderr, "difflet: serve: %s\n", dl_last_error());
            return 1;
        }
        dl_par_config pc;
        dl_par_parse(p->parallel, &pc); /* checked when the deployment was read */
        if (dl_par_ranks(&pc) > 1) { /* each replica an mpirun job */
            if (!dl_comm_have_mpi()) {
                fprintf(stderr, "difflet: serve: parallel `%s` needs MPI, and this build has none (make deps)\n", p->parallel);
                return 2;
            }
            if (!cli_layout_ok("serve", p->model, p->parallel, &pc, 1)) return 2;
        }
    }
    if (dl_serve_config_check(c) != DL_OK) {
        fprintf(stderr, "difflet: serve: %s\n", dl_last_error());
        return 2;
    }
    return 0;
}

/* `--model` may be repeated: one server serves each model given. --sizes, --frames and
 * --fps belong to the --model before them (those before the first, to the first). The
 * first --model replaces the deployment file's models, keeping its settings; a later
 * one takes them too, but for what is a model's own (sizes, frames, fps). */
int cli_serve(int argc, char **argv) {
    const char *profile = NULL;
    static dl_serve_config c; /* 8 deployments: kept off the stack */
    for (int i = 0; i < argc; i++) /* --profile: the old name of --deployment */
        if ((!strcmp(argv[i], "--deployment") || !strcmp(argv[i], "--profile")) && i + 1 < argc) profile = argv[i + 1];
    if (dl_serve_config_load(&c, profile) != DL_OK) {
        fprintf(stderr, "difflet: serve: %s\n", dl_last_error());
        return 2;
    }
    int given = 0; /* --model flags so far */
    dl_deployment *cur = &c.models[0];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-compile")) {
            for (int k = 0; k < DL_SERVE_MAX_MODELS; k++) c.models[k].no_compile = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "difflet: serve: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--deployment") || !strcmp(a, "--profile")) continue;
        if (!strcmp(a, "--model")) {
            if (given == DL_SERVE_MAX_MODELS) {
                fprintf(stderr, "difflet: serve: at most %d models (--model)\n", DL_SERVE_MAX_MODELS);
                return 2;
            }
            if (given) dl_serve_config_new_model(&c, &c.models[given]);
            cur = &c.models[given++];
            snprintf(cur->model, sizeof cur->model, "%s", v);
            cur->model_id[0] = 0;
            c.nmodels = given;
            continue;
        }
        int r = serve_flag(&c.models[0], cur, a, v);
        if (r < 0) fprintf(stderr, "difflet: serve: unknown option '%s'\n", a);
        if (r <= 0) return 2;
    }
    dl_deployment *d = &c.models[0];
    const char *env_key = getenv("DIFFLET_API_KEY"); /* the key without a command line anyone can read */
    if (env_key && *env_key && !d->api_key[0]) snprintf(d->api_key, sizeof d->api_key, "%s", env_key);
    if (d->port < 0 || d->port > 65535) {
        fprintf(stderr, "difflet: serve: --port must be in 0..65535\n");
        return 2;
    }
    int rc = models_check(&c);
    if (rc) return rc;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "difflet: serve: cannot find its own executable\n");
        return 1;
    }
    exe[n] = 0;
    return dl_serve_api_main(&c, exe);
}

int cli_serve_worker(int argc, char **argv) {
    dl_deployment p;
    if (argc != 2 || dl_deployment_load(&p, argv[1]) != DL_OK) {
        fprintf(stderr, "difflet: serve-worker: %s\n", argc != 2 ? "usage: serve-worker FD|unix:PATH DEPLOYMENT (started by serve)" : dl_last_error());
        return 2;
    }
    /* "FD" (inherited socket) or "unix:PATH" (a parallel model process under mpirun) */
    if (!strncmp(argv[0], "unix:", 5)) return dl_serve_worker_main(-1, argv[0] + 5, &p);
    return dl_serve_worker_main(atoi(argv[0]), NULL, &p);
}
