/* Profiles (the paper's RIB): resolution x phase x DoP -> seconds, the reference
 * figures of the DDiT paper's Figure 17, CSV import, a SQLite store, the optimal DoP
 * by the change-rate metric (Eq. 4), and the queue models of Algorithm 1. */
#include <ctype.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/sched.h"

int dl_dop_index(int dop) { return dop == 1 ? 0 : dop == 2 ? 1 : dop == 4 ? 2 : dop == 8 ? 3 : -1; }

void dl_profile_reference(dl_profile *p) {
    /* Figure 17, batch size 1: the DiT phase and the VAE phase, seconds, DoP 1/2/4/8 */
    static const char *names[4] = {"144p", "240p", "360p", "480p"};
    static const double dit[4][4] = {{3.01, 3.44, 3.67, 3.76}, {8.28, 4.59, 3.66, 3.93},
                                     {19.17, 10.42, 5.55, 3.68}, {39.64, 19.96, 11.76, 6.90}};
    static const double vae[4][4] = {{0.16, 0.16, 0.16, 0.16}, {0.38, 0.38, 0.38, 0.38},
                                     {0.87, 0.87, 0.87, 0.87}, {1.69, 1.72, 1.70, 1.69}};
    memset(p, 0, sizeof *p);
    p->nres = 4;
    p->steps = 30;
    for (int r = 0; r < 4; r++) {
        snprintf(p->name[r], sizeof p->name[r], "%s", names[r]);
        for (int d = 0; d < 4; d++) p->dit[r][d] = dit[r][d], p->vae[r][d] = vae[r][d];
    }
}

dl_status dl_profile_parse_csv(dl_profile *p, const char *text, size_t len) {
    memset(p, 0, sizeof *p);
    p->steps = 30;
    char *buf = malloc(len + 1);
    if (!buf) return dl_fail(DL_ERR_NOMEM, "out of memory");
    memcpy(buf, text, len);
    buf[len] = 0;
    int line_no = 0;
    dl_status s = DL_OK;
    for (char *line = strtok(buf, "\n"); line && s == DL_OK; line = strtok(NULL, "\n")) {
        line_no++;
        char res[32], phase[16];
        int dop;
        double secs;
        if (line[0] == '#' || !strncmp(line, "resolution", 10)) continue;
        if (sscanf(line, " %31[^,], %15[^,], %d, %lf", res, phase, &dop, &secs) != 4 || dl_dop_index(dop) < 0 ||
            (strcmp(phase, "dit") && strcmp(phase, "vae")) || !(secs > 0)) {
            s = dl_fail(DL_ERR_FORMAT, "profile CSV line %d: expected resolution,dit|vae,1|2|4|8,seconds", line_no);
            break;
        }
        int r = 0;
        while (r < p->nres && strcmp(p->name[r], res)) r++;
        if (r == p->nres) {
            if (p->nres == DL_SCHED_MAX_RES) {
                s = dl_fail(DL_ERR_FORMAT, "profile CSV: more than %d resolutions", DL_SCHED_MAX_RES);
                break;
            }
            snprintf(p->name[p->nres++], sizeof p->name[0], "%.15s", res);
        }
        (strcmp(phase, "dit") ? p->vae : p->dit)[r][dl_dop_index(dop)] = secs;
    }
    free(buf);
    for (int r = 0; s == DL_OK && r < p->nres; r++)
        if (!(p->dit[r][0] > 0) || !(p->vae[r][0] > 0))
            s = dl_fail(DL_ERR_FORMAT, "profile CSV: %s needs dit and vae times at DoP 1", p->name[r]);
    if (s == DL_OK && !p->nres) s = dl_fail(DL_ERR_FORMAT, "profile CSV: no rows");
    return s;
}

int dl_profile_best_dop(const dl_profile *p, int r) {
    int best = 1;
    double bz = 0;
    for (int i = 1; i < DL_SCHED_MAX_DOP; i++) {
        double a = p->dit[r][i], b = p->dit[r][i - 1];
        if (!(a > 0) || !(b > 0)) break;
        double z = 1 - a / b;
        if (z > bz) bz = z, best = 1 << i;
    }
    return best;
}

static dl_status sq(sqlite3 *db, const char *sql) {
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        dl_status s = dl_fail(DL_ERR_IO, "profile store: %s", err ? err : "error");
        sqlite3_free(err);
        return s;
    }
    return DL_OK;
}

static int valid_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("_.-", name[i])) return 0;
    return 1;
}

dl_status dl_profile_store_put(const char *path, const char *name, const dl_profile *p) {
    if (!valid_name(name)) return dl_fail(DL_ERR_INVALID, "profile name '%.64s': use 1..64 of A-Z a-z 0-9 _ . -", name);
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK) return dl_fail(DL_ERR_IO, "cannot open %s", path);
    dl_status s = sq(db, "CREATE TABLE IF NOT EXISTS profile (name TEXT, resolution TEXT, phase TEXT, dop INTEGER, seconds REAL,"
                         " PRIMARY KEY (name, resolution, phase, dop));"
                         "CREATE TABLE IF NOT EXISTS profile_meta (name TEXT PRIMARY KEY, steps INTEGER);BEGIN;");
    char del[160]; /* a re-import replaces the whole profile */
    snprintf(del, sizeof del, "DELETE FROM profile WHERE name = '%s';", name);
    if (s == DL_OK) s = sq(db, del);
    sqlite3_stmt *st = NULL;
    if (s == DL_OK && sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO profile VALUES (?, ?, ?, ?, ?);", -1, &st, NULL) != SQLITE_OK)
        s = dl_fail(DL_ERR_IO, "profile store: %s", sqlite3_errmsg(db));
    for (int r = 0; s == DL_OK && r < p->nres; r++)
        for (int ph = 0; ph < 2; ph++)
            for (int d = 0; d < DL_SCHED_MAX_DOP; d++) {
                double v = ph ? p->vae[r][d] : p->dit[r][d];
                if (!(v > 0)) continue;
                sqlite3_reset(st);
                sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 2, p->name[r], -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 3, ph ? "vae" : "dit", -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 4, 1 << d);
                sqlite3_bind_double(st, 5, v);
                if (sqlite3_step(st) != SQLITE_DONE) s = dl_fail(DL_ERR_IO, "profile store: %s", sqlite3_errmsg(db));
            }
    sqlite3_finalize(st);
    char meta[256];
    snprintf(meta, sizeof meta, "INSERT OR REPLACE INTO profile_meta VALUES ('%.100s', %d);COMMIT;", name, p->steps);
    if (s == DL_OK) s = sq(db, meta);
    sqlite3_close(db);
    return s;
}

dl_status dl_profile_store_get(const char *path, const char *name, dl_profile *p) {
    sqlite3 *db;
    memset(p, 0, sizeof *p);
    p->steps = 30;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return dl_fail(DL_ERR_IO, "cannot open profile store %s", path);
    }
    sqlite3_stmt *st;
    dl_status s = DL_OK;
    if (sqlite3_prepare_v2(db, "SELECT resolution, phase, dop, seconds FROM profile WHERE name = ? ORDER BY rowid;", -1, &st, NULL) !=
        SQLITE_OK) {
        sqlite3_close(db);
        return dl_fail(DL_ERR_IO, "profile store %s: %s", path, sqlite3_errmsg(db));
    }
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *res = (const char *)sqlite3_column_text(st, 0), *ph = (const char *)sqlite3_column_text(st, 1);
        int d = dl_dop_index(sqlite3_column_int(st, 2)), r = 0;
        while (r < p->nres && strcmp(p->name[r], res)) r++;
        if (r == p->nres && p->nres < DL_SCHED_MAX_RES) snprintf(p->name[p->nres++], sizeof p->name[0], "%.15s", res);
        if (r < p->nres && d >= 0) (strcmp(ph, "dit") ? p->vae : p->dit)[r][d] = sqlite3_column_double(st, 3);
    }
    sqlite3_finalize(st);
    /* the step count the DiT figures cover (stores older than the table keep 30) */
    if (sqlite3_prepare_v2(db, "SELECT steps FROM profile_meta WHERE name = ?;", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0) > 0) p->steps = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    if (!p->nres) s = dl_fail(DL_ERR_INVALID, "no profile named `%s` in %s", name, path);
    return s;
}

double dl_md1_time(double lambda, double d) {
    double mu = 1 / d, rho = lambda / mu;
    if (rho >= 1) return INFINITY;
    return 1 / mu + rho / (2 * mu * (1 - rho));
}

static double stirling(double n) { return n < 1 ? 1 : sqrt(2 * M_PI * n) * pow(n / M_E, n); }

/* M/M/c mean wait in the queue (Erlang C) with factorials by `fact` */
static double mmc_wait(double lambda, double d, int c, double (*fact)(double)) {
    double mu = 1 / d, rho = lambda / (c * mu), r = lambda / mu;
    double sum = 0;
    for (int s = 0; s < c; s++) sum += pow(r, s) / fact(s);
    double p0 = 1 / (pow(r, c) / (fact(c) * (1 - rho)) + sum);
    return pow(r, c) / (fact(c) * c * mu * (1 - rho) * (1 - rho)) * p0;
}

static double exact_fact(double n) { return tgamma(n + 1); }

double dl_mdc_time_printed(double lambda, double d, int c) {
    if (c <= 1) return dl_md1_time(lambda, d);
    if (lambda * d / c >= 1) return INFINITY;
    return (d + mmc_wait(lambda, d, c, stirling)) / 2; /* half the whole M/M/c time: below d at light load */
}

double dl_mdc_time(double lambda, double d, int c) {
    if (c <= 1) return dl_md1_time(lambda, d);
    if (lambda * d / c >= 1) return INFINITY;
    return d + mmc_wait(lambda, d, c, exact_fact) / 2; /* the service, then half the M/M/c queueing delay */
}
