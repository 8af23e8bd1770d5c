/* `difflet serve` (the API process) and `difflet serve-worker` (the model process it
 * starts; not for direct use). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/comm.h"
#include "difflet/request.h"
#include "difflet/serve.h"

int cli_serve(int argc, char **argv) {
    const char *profile = NULL;
    dl_deployment p;
    for (int i = 0; i < argc; i++) /* --profile: the old name of --deployment */
        if ((!strcmp(argv[i], "--deployment") || !strcmp(argv[i], "--profile")) && i + 1 < argc) profile = argv[i + 1];
    if (dl_deployment_load(&p, profile) != DL_OK) {
        fprintf(stderr, "difflet: serve: %s\n", dl_last_error());
        return 2;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-compile")) {
            p.no_compile = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "difflet: serve: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--deployment") || !strcmp(a, "--profile")) continue;
        else if (!strcmp(a, "--port")) p.port = atoi(v);
        else if (!strcmp(a, "--host")) snprintf(p.host, sizeof p.host, "%s", v);
        else if (!strcmp(a, "--api-key")) snprintf(p.api_key, sizeof p.api_key, "%s", v);
        else if (!strcmp(a, "--api-key-file")) { /* kept out of `ps` */
            char *k;
            size_t n;
            if (dl_file_read(v, sizeof p.api_key - 1, &k, &n) != DL_OK) {
                fprintf(stderr, "difflet: serve: --api-key-file %s: %s\n", v, dl_last_error());
                return 2;
            }
            while (n && (k[n - 1] == '\n' || k[n - 1] == '\r' || k[n - 1] == ' ')) k[--n] = 0;
            snprintf(p.api_key, sizeof p.api_key, "%s", k);
            free(k);
        }
        else if (!strcmp(a, "--model")) snprintf(p.model, sizeof p.model, "%s", v), p.model_id[0] = 0;
        else if (!strcmp(a, "--sizes") || !strcmp(a, "--frames")) { /* comma lists: WxH,... / N,... */
            int sizes = a[2] == 's', n = 0;
            for (const char *t = v; *t && n <= 8; n++) {
                char item[32];
                size_t k = strcspn(t, ",");
                snprintf(item, sizeof item, "%.*s", (int)(k < sizeof item - 1 ? k : sizeof item - 1), t);
                char *end;
                long f = sizes ? 0 : strtol(item, &end, 10);
                if (n == 8 || k >= sizeof item || (sizes ? !dl_parse_size(item, &p.sizes[n][0], &p.sizes[n][1])
                                                         : (!item[0] || *end || f < 1 || f > 100000))) {
                    fprintf(stderr, "difflet: serve: %s %s: up to 8 comma-separated %s\n", a, v,
                            sizes ? "sizes WxH" : "frame counts in 1..100000");
                    return 2;
                }
                if (!sizes) p.frames[n] = (int)f;
                t += k + (t[k] == ',');
            }
            if (!n) {
                fprintf(stderr, "difflet: serve: %s needs at least one value\n", a);
                return 2;
            }
            if (sizes) p.nsizes = n;
            else p.nframes = n, p.frames_given = 1;
        } else if (!strcmp(a, "--fps")) {
            char *end;
            p.fps = strtod(v, &end), p.fps_given = 1;
            if (*end || !(p.fps > 0 && p.fps <= 1000)) {
                fprintf(stderr, "difflet: serve: --fps must be a number in (0, 1000]\n");
                return 2;
            }
        }
        else if (!strcmp(a, "--results")) {
            snprintf(p.results, sizeof p.results, "%s", v);
            snprintf(p.db, sizeof p.db, "%.1000s/jobs.sqlite", v);
        } else {
            fprintf(stderr, "difflet: serve: unknown option '%s'\n", a);
            return 2;
        }
    }
    const char *env_key = getenv("DIFFLET_API_KEY"); /* the key without a command line anyone can read */
    if (env_key && *env_key && !p.api_key[0]) snprintf(p.api_key, sizeof p.api_key, "%s", env_key);
    if (p.port < 0 || p.port > 65535) {
        fprintf(stderr, "difflet: serve: --port must be in 0..65535\n");
        return 2;
    }
    if (dl_deployment_set_model(&p, p.model) != DL_OK) {
        fprintf(stderr, "difflet: serve: %s\n", dl_last_error());
        return 1;
    }
    dl_par_config pc;
    dl_par_parse(p.parallel, &pc); /* checked by dl_deployment_load */
    if (dl_par_ranks(&pc) > 1) { /* each replica an mpirun job: refused before anything starts */
        if (!dl_comm_have_mpi()) {
            fprintf(stderr, "difflet: serve: parallel `%s` needs MPI, and this build has none (make deps)\n", p.parallel);
            return 2;
        }
        if (!cli_layout_ok("serve", p.model, p.parallel, &pc, 1)) return 2;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "difflet: serve: cannot find its own executable\n");
        return 1;
    }
    exe[n] = 0;
    return dl_serve_api_main(&p, exe);
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
