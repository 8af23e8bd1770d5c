/* Parallel layouts: parsing `--parallel`, feasibility with reasons, and each rank's
 * place (its replica, CFG branch, TP and CP groups) as MPI communicators. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/pipeline.h"

static dl_status degree(const char *key, const char *v, int max, int *out) {
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || (*end && *end != ':') || n < 1 || n > max)
        return dl_fail(DL_ERR_INVALID, "--parallel: %s=%s is not a degree in 1..%d", key, v, max);
    *out = (int)n;
    return DL_OK;
}

dl_status dl_par_parse(const char *spec, dl_par_config *c) {
    *c = (dl_par_config){.dp = 1, .cfg = 1, .tp = 1, .cp = 1, .cp_mode = DL_CP_ULYSSES};
    if (!spec || !*spec || !strcmp(spec, "1")) return DL_OK;
    char buf[256];
    if (strlen(spec) >= sizeof buf) return dl_fail(DL_ERR_INVALID, "--parallel: the layout is too long");
    strcpy(buf, spec);
    dl_status s = DL_OK;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && s == DL_OK; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!strcmp(tok, "sp")) {
            c->sp = 1;
            continue;
        }
        if (!eq) return dl_fail(DL_ERR_INVALID, "--parallel: `%s` is not key=value (keys: tp, cp, cfg, dp; flag: sp)", tok);
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        if (!strcmp(k, "tp")) s = degree(k, v, 64, &c->tp);
        else if (!strcmp(k, "dp")) s = degree(k, v, 64, &c->dp);
        else if (!strcmp(k, "cfg")) {
            s = degree(k, v, 2, &c->cfg);
        } else if (!strcmp(k, "cp")) {
            s = degree(k, v, 64, &c->cp);
            const char *mode = strchr(v, ':');
            if (s == DL_OK && mode) {
                if (!strcmp(mode + 1, "ulysses")) c->cp_mode = DL_CP_ULYSSES;
                else if (!strcmp(mode + 1, "ring")) c->cp_mode = DL_CP_RING;
                else if (!strcmp(mode + 1, "gather")) c->cp_mode = DL_CP_GATHER;
                else s = dl_fail(DL_ERR_INVALID, "--parallel: context-parallel mode `%s` (ulysses, ring or gather)", mode + 1);
            }
        } else {
            s = dl_fail(DL_ERR_INVALID, "--parallel: unknown key `%s` (keys: tp, cp, cfg, dp; flag: sp)", k);
        }
    }
    if (s == DL_OK && dl_par_ranks(c) > 256) s = dl_fail(DL_ERR_INVALID, "--parallel: %d ranks is more than 256", dl_par_ranks(c));
    return s;
}

int dl_par_ranks(const dl_par_config *c) { return c->dp * c->cfg * c->tp * c->cp; }

void dl_par_format(const dl_par_config *c, char *buf, size_t n) {
    snprintf(buf, n, "tp%d%s.cp%d-%s.cfg%d.dp%d", c->tp, c->sp ? ".sp" : "", c->cp, dl_cp_mode_name(c->cp_mode), c->cfg,
             c->dp);
}

const char *dl_par_check(const dl_par_config *c, int passes, int world, char *buf, size_t n) {
    if (dl_par_ranks(c) != world) {
        snprintf(buf, n, "the layout needs dp x cfg x tp x cp = %d x %d x %d x %d = %d ranks, the job has %d", c->dp, c->cfg,
                 c->tp, c->cp, dl_par_ranks(c), world);
        return buf;
    }
    if (c->cfg == 2 && passes < 2) {
        snprintf(buf, n, "cfg=2 runs a step's guidance passes on two rank groups, but this request makes "
                         "%d pass per step (CFG needs --guidance > 1 for models guided by CFG (Wan, OpenSora, LTX-2), else "
                         "--true-cfg > 1 and a --negative-prompt)", passes);
        return buf;
    }
    if (c->sp && c->tp < 2) {
        snprintf(buf, n, "sequence parallelism runs on the TP group: it needs tp >= 2");
        return buf;
    }
    return NULL;
}

dl_status dl_par_place_new(dl_comm *world, const dl_par_config *c, dl_par_place *p) {
    *p = (dl_par_place){.cfg = *c, .world = world, .rank = dl_comm_rank(world)};
    if (dl_par_ranks(c) != dl_comm_size(world))
        return dl_fail(DL_ERR_INVALID, "--parallel needs %d ranks, the job has %d", dl_par_ranks(c), dl_comm_size(world));
    const int w = p->rank, per = c->cfg * c->cp * c->tp;
    p->replica = w / per;
    int r = w % per;
    p->branch = r / (c->cp * c->tp);
    p->split = (dl_dit_split){.tp = c->tp, .cp = c->cp, .sp = c->sp, .cp_mode = c->cp_mode, .tp_rank = r % c->tp,
                               .cp_rank = (r / c->tp) % c->cp};
    const int grp = p->replica * c->cfg + p->branch; /* one denoiser group */
    dl_status s;
    if ((s = dl_comm_split(world, p->replica, r, &p->replica_comm)) ||
        (s = dl_comm_split(world, grp * c->cp + p->split.cp_rank, p->split.tp_rank, &p->tp_comm)) ||
        (s = dl_comm_split(world, grp * c->tp + p->split.tp_rank, p->split.cp_rank, &p->cp_comm)) ||
        (s = dl_comm_split(world, (p->replica * c->cp + p->split.cp_rank) * c->tp + p->split.tp_rank, p->branch,
                           &p->cfg_comm))) {
        dl_par_place_free(p);
        return s;
    }
    p->split.tp_comm = c->tp > 1 ? p->tp_comm : NULL;
    p->split.cp_comm = c->cp > 1 ? p->cp_comm : NULL;
    return DL_OK;
}

void dl_par_place_free(dl_par_place *p) {
    dl_comm_free(p->replica_comm), dl_comm_free(p->tp_comm), dl_comm_free(p->cp_comm), dl_comm_free(p->cfg_comm);
    p->replica_comm = p->tp_comm = p->cp_comm = p->cfg_comm = NULL;
}
