/* The job store: one SQLite database in WAL mode, so an accepted job survives an
 * API restart. Every call is a single statement (autocommit) unless the caller groups
 * several in a transaction (dl_jobs_begin .. commit): a crash between two calls leaves
 * a consistent row.
 *
 * Threads: the store locks for itself, so no caller needs a lock of its own around it
 * (and the API process's state lock, dl_api.mu, must never be held across a call here:
 * a write may wait for an fsync). Two connections: writes go to the writer, one
 * statement or one transaction at a time (`wmu`, taken by dl_jobs_begin and given back
 * by commit or rollback, so a transaction is never interleaved with another thread's
 * writes); reads go to the reader (`rmu`), which in WAL mode sees every committed
 * transaction and never waits for a writer's commit or fsync. A read by the thread
 * that holds a transaction goes to the writer and sees that transaction's changes. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <errno.h>
#include <sys/file.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_impl.h"

struct dl_jobstore {
    sqlite3 *db;         /* the writer */
    sqlite3 *rdb;        /* the reader */
    pthread_mutex_t wmu; /* recursive: one writer statement or transaction at a time */
    pthread_mutex_t rmu; /* one reader call at a time (each starts a fresh read snapshot) */
    int lock_fd; /* flock on <db>.lock: one server per store */
};

/* the store whose transaction this thread holds (dl_jobs_begin), if any */
static _Thread_local dl_jobstore *tl_tx;

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dl_status exec(dl_jobstore *js, const char *sql) {
    char *err = NULL;
    if (sqlite3_exec(js->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        dl_status s = dl_fail(DL_ERR_IO, "job store: %s", err ? err : "error");
        sqlite3_free(err);
        return s;
    }
    return DL_OK;
}

/* A read: the writer inside this thread's own transaction (it sees its changes), else
 * the reader. Every read_begin has its read_end. */
static sqlite3 *read_begin(dl_jobstore *js) {
    if (tl_tx == js) {
        pthread_mutex_lock(&js->wmu);
        return js->db;
    }
    pthread_mutex_lock(&js->rmu);
    return js->rdb;
}
static void read_end(dl_jobstore *js, sqlite3 *db) { pthread_mutex_unlock(db == js->db ? &js->wmu : &js->rmu); }

/* Several changes that land together, one commit. Durability where it matters: the
 * store runs with synchronous=NORMAL (WAL: safe against a crash of any process, and a
 * commit costs no fsync), and a durable transaction (accepting a job, a client's
 * cancel) commits with synchronous=FULL, an fsync that also covers every commit before
 * it. A power cut can undo only non-durable changes (progress, in_progress, a result),
 * and recovery puts such jobs back in the queue: redone, never lost. The writer is this
 * thread's from begin until commit or rollback. */
dl_status dl_jobs_begin(dl_jobstore *js, int durable) {
    DL_ASSERT(tl_tx != js); /* no nested transactions */
    pthread_mutex_lock(&js->wmu);
    dl_status s = exec(js, durable ? "PRAGMA synchronous=FULL; BEGIN IMMEDIATE;" : "BEGIN IMMEDIATE;");
    if (s != DL_OK) {
        if (durable) sqlite3_exec(js->db, "PRAGMA synchronous=NORMAL;", NULL, NULL, NULL);
        pthread_mutex_unlock(&js->wmu);
        return s;
    }
    tl_tx = js;
    return DL_OK;
}
/* A failed commit that left the transaction open keeps the writer: the caller rolls back. */
dl_status dl_jobs_commit(dl_jobstore *js) {
    DL_ASSERT(tl_tx == js);
    dl_status s = exec(js, "COMMIT;");
    if (s != DL_OK && !sqlite3_get_autocommit(js->db)) return s;
    sqlite3_exec(js->db, "PRAGMA synchronous=NORMAL;", NULL, NULL, NULL);
    tl_tx = NULL;
    pthread_mutex_unlock(&js->wmu);
    return s;
}
/* Also after a failed begin or commit: a no-op when this thread holds no transaction. */
void dl_jobs_rollback(dl_jobstore *js) {
    if (tl_tx != js) return;
    if (!sqlite3_get_autocommit(js->db)) sqlite3_exec(js->db, "ROLLBACK;", NULL, NULL, NULL);
    sqlite3_exec(js->db, "PRAGMA synchronous=NORMAL;", NULL, NULL, NULL);
    tl_tx = NULL;
    pthread_mutex_unlock(&js->wmu);
}

dl_status dl_jobs_open(dl_jobstore **out, const char *path) {
    *out = NULL;
    dl_jobstore *js = calloc(1, sizeof *js);
    if (!js) return dl_fail(DL_ERR_NOMEM, "out of memory");
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&js->wmu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_mutex_init(&js->rmu, NULL);
    /* one server per store: two would run every job twice. The lock goes with the
       process (a killed server's store is free again at once); model processes do not
       inherit it (O_CLOEXEC). */
    char lpath[4200];
    snprintf(lpath, sizeof lpath, "%s.lock", path);
    js->lock_fd = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (js->lock_fd < 0) {
        dl_status s = dl_fail(DL_ERR_IO, "job store lock %s: %s", lpath, strerror(errno));
        dl_jobs_close(js);
        return s;
    }
    if (flock(js->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char other[32] = "";
        ssize_t n = pread(js->lock_fd, other, sizeof other - 1, 0);
        other[n > 0 ? n : 0] = 0;
        close(js->lock_fd);
        js->lock_fd = -1;
        dl_jobs_close(js);
        return dl_fail(DL_ERR_IO, "job store %s is in use by another difflet serve (pid %s); one server per store", path,
                       other[0] ? other : "?");
    }
    char pid[32];
    int pl = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(js->lock_fd, 0) != 0 || pwrite(js->lock_fd, pid, (size_t)pl, 0) != pl)
        DL_WARN("job store lock %s: cannot record the pid", lpath);
    /* prompts are users' data: the store (and its WAL files, which SQLite creates
       with the database's mode) is readable by the server's user only */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (fchmod(fd, 0600) != 0) DL_WARN("job store %s: cannot make it private", path);
        close(fd);
    }
    if (sqlite3_open_v2(path, &js->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
        dl_status s = dl_fail(DL_ERR_IO, "job store %s: %s", path, js->db ? sqlite3_errmsg(js->db) : "cannot open");
        dl_jobs_close(js);
        return s;
    }
    sqlite3_busy_timeout(js->db, 5000);
    dl_status s = exec(js, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                           "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, status TEXT NOT NULL, request TEXT NOT NULL,"
                           " created REAL, started REAL, finished REAL, deadline REAL, error TEXT, result TEXT,"
                           " step INTEGER DEFAULT 0, steps INTEGER DEFAULT 0, cached INTEGER DEFAULT 0, model_s REAL DEFAULT 0);"
                           "CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status, created);");
    if (s != DL_OK) {
        dl_jobs_close(js);
        return s;
    }
    /* stores made before model_s existed: add it (an error means it is there) */
    sqlite3_exec(js->db, "ALTER TABLE jobs ADD COLUMN model_s REAL DEFAULT 0;", NULL, NULL, NULL);
    sqlite3_exec(js->db, "ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER DEFAULT 0;", NULL, NULL, NULL);
    sqlite3_exec(js->db, "ALTER TABLE jobs ADD COLUMN kind TEXT DEFAULT 'image';", NULL, NULL, NULL);
    sqlite3_exec(js->db, "ALTER TABLE jobs ADD COLUMN model TEXT;", NULL, NULL, NULL); /* NULL: a one-model server's */
    if ((s = exec(js, "CREATE INDEX IF NOT EXISTS jobs_model ON jobs(model, status, created);")) != DL_OK) {
        dl_jobs_close(js);
        return s;
    }
    /* the reader: the same file, after the schema exists; it never writes */
    if (sqlite3_open_v2(path, &js->rdb, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK ||
        sqlite3_exec(js->rdb, "PRAGMA query_only=1;", NULL, NULL, NULL) != SQLITE_OK) {
        s = dl_fail(DL_ERR_IO, "job store %s: %s", path, js->rdb ? sqlite3_errmsg(js->rdb) : "cannot open");
        dl_jobs_close(js);
        return s;
    }
    sqlite3_busy_timeout(js->rdb, 5000);
    *out = js;
    return DL_OK;
}

void dl_jobs_close(dl_jobstore *js) {
    if (!js) return;
    if (js->lock_fd > 0) close(js->lock_fd);
    sqlite3_close(js->rdb);
    sqlite3_close(js->db);
    pthread_mutex_destroy(&js->wmu);
    pthread_mutex_destroy(&js->rmu);
    free(js);
}

/* the writer for one statement (or inside this thread's transaction) */
#define WRITE_BEGIN(js) pthread_mutex_lock(&(js)->wmu)
#define WRITE_END(js) pthread_mutex_unlock(&(js)->wmu)

int dl_jobs_recover(dl_jobstore *js, double ttl_s) {
    char sql[256];
    WRITE_BEGIN(js);
    /* a running job whose cancel was accepted before the crash stays cancelled */
    snprintf(sql, sizeof sql, "UPDATE jobs SET status='cancelled', error='cancelled by the client', finished=%.3f "
                              "WHERE status='in_progress' AND cancel_requested=1;", wall());
    exec(js, sql);
    exec(js, "UPDATE jobs SET status='queued', started=NULL, step=0 WHERE status='in_progress';");
    int n = sqlite3_changes(js->db);
    /* expired jobs go with their result files (a video's MP4 is large) */
    double before = wall() - ttl_s;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(js->db, "SELECT result FROM jobs WHERE status='completed' AND finished < ? AND result IS NOT NULL;", -1,
                           &st, NULL) == SQLITE_OK) {
        sqlite3_bind_double(st, 1, before);
        while (sqlite3_step(st) == SQLITE_ROW) unlink((const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
    snprintf(sql, sizeof sql, "DELETE FROM jobs WHERE status IN ('completed','failed','cancelled') AND finished < %.3f;", before);
    exec(js, sql);
    WRITE_END(js);
    return n;
}

int dl_jobs_adopt(dl_jobstore *js, const char *kind, const char *model) {
    sqlite3_stmt *st;
    int n = 0;
    WRITE_BEGIN(js);
    if (sqlite3_prepare_v2(js->db, "UPDATE jobs SET model=?2 WHERE model IS NULL AND kind=?1 AND status='queued';", -1, &st,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, kind, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, model, -1, SQLITE_TRANSIENT);
        n = sqlite3_step(st) == SQLITE_DONE ? sqlite3_changes(js->db) : 0;
        sqlite3_finalize(st);
    }
    WRITE_END(js);
    return n;
}

int dl_jobs_fail_unserved(dl_jobstore *js, const char *const *models, int n) {
    char sql[640] = "UPDATE jobs SET status='failed', finished=?1, error='not served by this server (it was restarted with "
                    "another deployment): ' || IFNULL('model `' || model || '`', 'no model makes ' || kind || 's') "
                    "WHERE status='queued' AND (model IS NULL OR model NOT IN (";
    DL_ASSERT(n >= 1 && n <= 16);
    for (int i = 0; i < n; i++) snprintf(sql + strlen(sql), sizeof sql - strlen(sql), "%s?%d", i ? ", " : "", i + 2);
    snprintf(sql + strlen(sql), sizeof sql - strlen(sql), "));");
    sqlite3_stmt *st;
    int changed = 0;
    WRITE_BEGIN(js);
    if (sqlite3_prepare_v2(js->db, sql, -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_double(st, 1, wall());
        for (int i = 0; i < n; i++) sqlite3_bind_text(st, i + 2, models[i], -1, SQLITE_TRANSIENT);
        changed = sqlite3_step(st) == SQLITE_DONE ? sqlite3_changes(js->db) : 0;
        sqlite3_finalize(st);
    }
    WRITE_END(js);
    return changed;
}

/* One UPDATE on the writer with the text binds given (NULL binds NULL) and the
 * double binds after them; the rows it changed, -1 on a store error. */
static int update(dl_jobstore *js, const char *sql, int ntext, const char *const *text, int ndouble, const double *dbl) {
    sqlite3_stmt *st;
    int n = -1;
    WRITE_BEGIN(js);
    if (sqlite3_prepare_v2(js->db, sql, -1, &st, NULL) != SQLITE_OK) {
        dl_fail(DL_ERR_IO, "job store: %s", sqlite3_errmsg(js->db));
        WRITE_END(js);
        return -1;
    }
    for (int i = 0; i < ntext; i++)
        if (text[i]) sqlite3_bind_text(st, i + 1, text[i], -1, SQLITE_TRANSIENT);
        else sqlite3_bind_null(st, i + 1);
    for (int i = 0; i < ndouble; i++) sqlite3_bind_double(st, ntext + i + 1, dbl[i]);
    if (sqlite3_step(st) == SQLITE_DONE) n = sqlite3_changes(js->db);
    else dl_fail(DL_ERR_IO, "job store: %s", sqlite3_errmsg(js->db));
    sqlite3_finalize(st);
    WRITE_END(js);
    return n;
}

dl_status dl_jobs_request_cancel(dl_jobstore *js, const char *id) {
    return update(js, "UPDATE jobs SET cancel_requested=1 WHERE id=?;", 1, &id, 0, NULL) < 0 ? DL_ERR_IO : DL_OK;
}

int dl_jobs_expire(dl_jobstore *js, double now) {
    const double t[2] = {now, now};
    int n = update(js, "UPDATE jobs SET status='failed', error='timed out in the queue: no model process took it "
                       "before its deadline', finished=? WHERE status='queued' AND deadline < ?;", 0, NULL, 2, t);
    return n > 0 ? n : 0;
}

dl_status dl_jobs_insert(dl_jobstore *js, const char *id, const char *kind, const char *model, const char *req, double deadline) {
    const char *text[4] = {id, req, kind, model};
    const double t[2] = {wall(), deadline};
    return update(js, "INSERT INTO jobs (id, request, kind, model, status, created, deadline) VALUES (?, ?, ?, ?, 'queued', ?, ?);",
                  4, text, 2, t) == 1 ? DL_OK : DL_ERR_IO;
}

int dl_jobs_count(dl_jobstore *js, const char *status, const char *model) {
    sqlite3_stmt *st;
    int n = 0;
    sqlite3 *db = read_begin(js);
    if (sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM jobs WHERE status = ?1 AND (?2 IS NULL OR model = ?2);", -1, &st, NULL) ==
        SQLITE_OK) {
        sqlite3_bind_text(st, 1, status, -1, SQLITE_TRANSIENT);
        if (model) sqlite3_bind_text(st, 2, model, -1, SQLITE_TRANSIENT);
        else sqlite3_bind_null(st, 2);
        if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    read_end(js, db);
    return n;
}

int dl_jobs_next(dl_jobstore *js, const char *model, char *id, size_t idn, char **req, double *deadline) {
    sqlite3_stmt *st;
    int found = 0;
    sqlite3 *db = read_begin(js);
    if (sqlite3_prepare_v2(db, "SELECT id, request, deadline FROM jobs WHERE model=? AND status='queued' ORDER BY created LIMIT 1;",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            snprintf(id, idn, "%s", (const char *)sqlite3_column_text(st, 0));
            *req = strdup((const char *)sqlite3_column_text(st, 1));
            *deadline = sqlite3_column_double(st, 2);
            found = *req != NULL;
        }
        sqlite3_finalize(st);
    }
    read_end(js, db);
    return found;
}

dl_status dl_jobs_set(dl_jobstore *js, const char *id, const char *status, const char *error, const char *result) {
    const char *text[4] = {status, error, result, id};
    const double t = wall();
    /* the text binds come first: ?1..?4, then the time as ?5 */
    const char *sql = !strcmp(status, "in_progress") ? "UPDATE jobs SET status=?1, error=?2, result=?3, started=?5 WHERE id=?4;"
                                                     : "UPDATE jobs SET status=?1, error=?2, result=?3, finished=?5 WHERE id=?4;";
    return update(js, sql, 4, text, 1, &t) < 0 ? DL_ERR_IO : DL_OK;
}

int dl_jobs_transition(dl_jobstore *js, const char *id, const char *from, const char *to, const char *error, const char *result) {
    const char *text[5] = {to, error, result, id, from};
    const double t = wall();
    const char *sql = !strcmp(to, "in_progress")
                          ? "UPDATE jobs SET status=?1, error=?2, result=?3, started=?6 WHERE id=?4 AND status=?5;"
                          : "UPDATE jobs SET status=?1, error=?2, result=?3, finished=?6 WHERE id=?4 AND status=?5;";
    return update(js, sql, 5, text, 1, &t);
}

int dl_jobs_requeue(dl_jobstore *js, const char *id) {
    return update(js, "UPDATE jobs SET status='queued', started=NULL, step=0 WHERE id=?1 AND status='in_progress';", 1, &id, 0,
                  NULL);
}

dl_status dl_jobs_model_seconds(dl_jobstore *js, const char *id, double secs) {
    const double t = secs;
    /* ?1 the id, ?2 the seconds */
    return update(js, "UPDATE jobs SET model_s=?2 WHERE id=?1;", 1, &id, 1, &t) < 0 ? DL_ERR_IO : DL_OK;
}

dl_status dl_jobs_progress(dl_jobstore *js, const char *id, int step, int steps, int cached) {
    const double t[3] = {step, steps, cached};
    return update(js, "UPDATE jobs SET step=?2, steps=?3, cached=?4 WHERE id=?1;", 1, &id, 3, t) < 0 ? DL_ERR_IO : DL_OK;
}

/* the job's row as JSON on connection db (the caller holds its lock), NULL when unknown */
static cJSON *get_row(sqlite3 *db, const char *id) {
    sqlite3_stmt *st;
    cJSON *j = NULL;
    if (sqlite3_prepare_v2(db, "SELECT status, created, error, result, step, steps, cached, request, model_s, started, kind, finished, "
                               "model FROM jobs WHERE id=?;", -1,
                           &st, NULL) != SQLITE_OK)
        return NULL;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW) {
        j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "id", id);
        cJSON_AddStringToObject(j, "status", (const char *)sqlite3_column_text(st, 0));
        cJSON_AddNumberToObject(j, "created", (double)(int64_t)sqlite3_column_double(st, 1));
        if (sqlite3_column_type(st, 2) != SQLITE_NULL) cJSON_AddStringToObject(j, "error", (const char *)sqlite3_column_text(st, 2));
        if (sqlite3_column_type(st, 3) != SQLITE_NULL) cJSON_AddStringToObject(j, "result", (const char *)sqlite3_column_text(st, 3));
        int step = sqlite3_column_int(st, 4), steps = sqlite3_column_int(st, 5);
        cJSON_AddNumberToObject(j, "steps_done", step);
        cJSON_AddNumberToObject(j, "steps", steps);
        cJSON_AddNumberToObject(j, "steps_cached", sqlite3_column_int(st, 6));
        cJSON_AddNumberToObject(j, "progress", steps ? 100.0 * step / steps : 0.0);
        cJSON_AddNumberToObject(j, "model_seconds", sqlite3_column_double(st, 8));
        if (sqlite3_column_type(st, 9) != SQLITE_NULL)
            cJSON_AddNumberToObject(j, "queue_seconds", sqlite3_column_double(st, 9) - sqlite3_column_double(st, 1));
        cJSON *req = cJSON_Parse((const char *)sqlite3_column_text(st, 7));
        if (req) cJSON_AddItemToObject(j, "request", req);
        cJSON_AddStringToObject(j, "kind", sqlite3_column_type(st, 10) == SQLITE_NULL ? "image" : (const char *)sqlite3_column_text(st, 10));
        if (sqlite3_column_type(st, 11) != SQLITE_NULL) cJSON_AddNumberToObject(j, "finished", (double)(int64_t)sqlite3_column_double(st, 11));
        if (sqlite3_column_type(st, 12) != SQLITE_NULL) cJSON_AddStringToObject(j, "model", (const char *)sqlite3_column_text(st, 12));
    }
    sqlite3_finalize(st);
    return j;
}

cJSON *dl_jobs_get(dl_jobstore *js, const char *id) {
    sqlite3 *db = read_begin(js);
    cJSON *j = get_row(db, id);
    read_end(js, db);
    return j;
}

int dl_jobs_position(dl_jobstore *js, const char *id) {
    sqlite3_stmt *st;
    int pos = 0;
    sqlite3 *db = read_begin(js);
    if (sqlite3_prepare_v2(db,
                           "SELECT COUNT(*) FROM jobs WHERE status='queued' AND model IS (SELECT model FROM jobs WHERE id=?1) "
                           "AND created <= (SELECT created FROM jobs WHERE id=?1 AND status='queued');",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) pos = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    read_end(js, db);
    return pos;
}

cJSON *dl_jobs_list(dl_jobstore *js, const char *kind, const char *after, int limit, int ascending, int *has_more) {
    /* newest first (or oldest): ties in `created` are broken by id, so pages never overlap */
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT id FROM jobs WHERE kind=?1 AND (?2 IS NULL OR (SELECT created FROM jobs WHERE id=?2) IS NULL OR "
             "(created, id) %s (SELECT created, id FROM jobs WHERE id=?2)) ORDER BY created %s, id %s LIMIT ?3;",
             ascending ? ">" : "<", ascending ? "ASC" : "DESC", ascending ? "ASC" : "DESC");
    sqlite3_stmt *st;
    *has_more = 0;
    sqlite3 *db = read_begin(js);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        dl_fail(DL_ERR_IO, "job store: %s", sqlite3_errmsg(db));
        read_end(js, db);
        return NULL;
    }
    sqlite3_bind_text(st, 1, kind, -1, SQLITE_TRANSIENT);
    if (after) sqlite3_bind_text(st, 2, after, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 2);
    sqlite3_bind_int(st, 3, limit + 1);
    cJSON *out = cJSON_CreateArray();
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (n++ == limit) {
            *has_more = 1;
            break;
        }
        cJSON *j = get_row(db, (const char *)sqlite3_column_text(st, 0));
        if (j) cJSON_AddItemToArray(out, j);
    }
    sqlite3_finalize(st);
    read_end(js, db);
    return out;
}

dl_status dl_jobs_delete(dl_jobstore *js, const char *id) {
    return update(js, "DELETE FROM jobs WHERE id=?;", 1, &id, 0, NULL) < 0 ? DL_ERR_IO : DL_OK;
}
