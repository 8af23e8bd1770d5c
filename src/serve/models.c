/* The served models of `difflet serve`'s API process: routing a request to one (its
 * `model`, or the first model of the route's kind), and the supervisor thread that
 * owns their resident model processes (one or more per model, each loading its own
 * model only): it starts them, feeds each one job of its model at a time over a
 * Unix socket, enforces the request deadline (cancel, then kill after a grace
 * period, then a replacement that reloads and passes its start-up check), and
 * replaces one that dies. Its model's dispatch pauses while it recovers; the other
 * models' go on. */
#include <errno.h>
#include <sched.h>
#include <dirent.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "difflet/comm.h"
#include "difflet/sched.h"
#include "serve/serve_impl.h"
#include "serve/api_impl.h"

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- routing ---------------------------------------------------------------------- */

/* what a served model makes, for messages: "`a` makes videos (WanPipeline)" */
void dl_api_model_kind(const served *m, char *out, size_t n) {
    snprintf(out, n, "`%s` makes %s (%s)", m->pr.model_id, m->pr.video ? "videos" : "images",
             m->entry ? m->entry->pipeline_class : "an unknown pipeline");
}

const served *dl_api_find_model(const char *id) {
    for (int i = 0; i < dl_api.nmodels; i++)
        if (!strcmp(id, dl_api.m[i].pr.model_id)) return &dl_api.m[i];
    return NULL;
}

const served *dl_api_route(const cJSON *v, int video, char *err, size_t en) {
    const char *name = cJSON_IsString(v) ? v->valuestring : "";
    if (!name[0]) {
        for (int i = 0; i < dl_api.nmodels; i++)
            if (dl_api.m[i].pr.video == video) return &dl_api.m[i];
        return &dl_api.m[0];
    }
    const served *m = dl_api_find_model(name);
    if (m) return m;
    char list[600] = "";
    for (int i = 0; i < dl_api.nmodels; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s`%.60s`", i ? ", " : "", dl_api.m[i].pr.model_id);
    snprintf(err, en, "The model `%.200s` does not exist (this server serves %s)", name, list);
    return NULL;
}

const char *dl_api_job_model(const cJSON *job) {
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "model"));
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(job, "kind"));
    return id ? id : dl_api_route(NULL, kind && !strcmp(kind, "video"), NULL, 0)->pr.model_id;
}

/* ---- the model processes ---------------------------------------------------------
 * Locking (server.c's top comment has all of it): the supervisor thread alone starts,
 * feeds, reaps and replaces model processes, and it alone writes a worker's fields. The
 * fields other threads read (ready, pid, inflight, live_step/live_steps) and the
 * served model's restarts and last_error it writes under dl_api.mu, briefly; cancel_wanted
 * (written by request threads) it reads under dl_api.mu. It never holds the lock across
 * a wait: fork, waitpid, the socket to a model process, /proc, the job store. Its own
 * reads of the fields only it writes need no lock. */

static void lock(void) { pthread_mutex_lock(&dl_api.mu); }
static void unlock(void) { pthread_mutex_unlock(&dl_api.mu); }

/* a model process started (pid) or gone (-1): what /ready and the metrics show */
static void publish_process(worker *w, pid_t pid, int ready) {
    lock();
    w->pid = pid;
    w->ready = ready;
    dl_api_notify_locked();
    unlock();
}

/* a model process of m is ready */
int dl_api_model_ready(const served *m) {
    for (int i = m->first; i < m->first + m->n; i++)
        if (dl_api.w[i].ready) return 1;
    return 0;
}

/* the server is ready when every served model is */
int dl_api_all_ready(void) {
    for (int k = 0; k < dl_api.nmodels; k++)
        if (!dl_api_model_ready(&dl_api.m[k])) return 0;
    return 1;
}

int dl_api_inflight(const served *m) {
    int n = 0;
    for (int i = m->first; i < m->first + m->n; i++)
        for (int k = 0; k < dl_api.w[i].nslots; k++) n += dl_api.w[i].s[k].inflight[0] != 0;
    return n;
}

/* in a model process's child: process k (of every model's) on cores [k*per, (k+1)*per)
 * when there are several */
static int pin_replica(int k, int per) {
    if (dl_api.nworkers < 2 || per < 1) return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c = k * per; c < (k + 1) * per; c++) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof set, &set);
    return 1;
}

/* a parallel replica: listen on a unix socket, start `mpirun ... serve-worker
 * unix:PATH` in its own session (so every rank can be killed together) */
static void spawn_mpi_worker(worker *w, int k, int ranks, int per) {
    static unsigned seq;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(w->sock, sizeof w->sock, "/tmp/difflet-serve-%d-%d-%u.sock", (int)getpid(), k, seq++);
    snprintf(a.sun_path, sizeof a.sun_path, "%s", w->sock);
    unlink(w->sock);
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0) {
        DL_ERROR("serve: socket %s: %s", w->sock, strerror(errno));
        if (ls >= 0) close(ls);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        pin_replica(k, per);
        static char store[4200], connect_url[128];
        const char *av[64];
        int n = dl_comm_mpirun_argv(av, 24, ranks, per / ranks > 0 ? per / ranks : 1, store, sizeof store);
        /* the deployment's hosts and mpirun arguments go before the program (av[n - 1]) */
        const dl_deployment *pr = &dl_api.m[w->model].pr;
        static char extra[sizeof pr->mpirun_args];
        const char *exe = av[--n];
        if (pr->mpirun_hostfile[0]) av[n++] = "--hostfile", av[n++] = pr->mpirun_hostfile;
        if (getenv("DIFFLET_PROFILES")) av[n++] = "-x", av[n++] = "DIFFLET_PROFILES";
        snprintf(extra, sizeof extra, "%s", pr->mpirun_args);
        for (char *save = NULL, *t = strtok_r(extra, " ", &save); t && n < 56; t = strtok_r(NULL, " ", &save)) av[n++] = t;
        av[n++] = exe;
        snprintf(connect_url, sizeof connect_url, "unix:%s", w->sock);
        av[n++] = "serve-worker", av[n++] = connect_url, av[n++] = dl_api.m[w->model].profile_path, av[n] = NULL;
        execvp("mpirun", (char *const *)av);
        _exit(127);
    }
    if (pid < 0) {
        close(ls);
        unlink(w->sock);
        DL_ERROR("serve: fork: %s", strerror(errno));
        return;
    }
    w->fd = ls;
    w->mpi = w->listening = 1;
    w->spawn_time = wall();
    publish_process(w, pid, 0);
    DL_INFO("serve: model process %d (%s, process %d, %d MPI ranks, %s) starting", (int)pid, dl_api.m[w->model].pr.model_id, k, ranks,
            dl_api.m[w->model].pr.parallel);
}

static void spawn_worker(worker *w, int k) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int per = (int)(ncpu / dl_api.nworkers);
    dl_par_config pc;
    const dl_deployment *pr = &dl_api.m[w->model].pr;
    if (pr->scheduler[0]) { /* DDiT: the scheduler rank and the units */
        spawn_mpi_worker(w, k, pr->units + 1, per > 0 ? per : 1);
        return;
    }
    if (dl_par_parse(pr->parallel, &pc) == DL_OK && dl_par_ranks(&pc) > 1) {
        spawn_mpi_worker(w, k, dl_par_ranks(&pc), per > 0 ? per : 1);
        return;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        DL_ERROR("serve: socketpair: %s", strerror(errno));
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int fd = dup(sv[1]); /* without CLOEXEC: it survives exec */
        char fds[16], th[16];
        snprintf(fds, sizeof fds, "%d", fd);
        if (pin_replica(k, per)) {
            snprintf(th, sizeof th, "%d", per);
            setenv("OMP_NUM_THREADS", th, 1);
        }
        execl(dl_api.exe, dl_api.exe, "serve-worker", fds, dl_api.m[w->model].profile_path, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        DL_ERROR("serve: fork: %s", strerror(errno));
        return;
    }
    w->fd = sv[0];
    publish_process(w, pid, 0);
    DL_INFO("serve: model process %d (%s, process %d) starting", (int)pid, dl_api.m[w->model].pr.model_id, k);
}

/* SIGKILL every process of session sid (mpirun and its ranks) */
static void kill_session(pid_t sid) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], buf[512];
        pid_t p = (pid_t)atoi(e->d_name);
        if (p <= 0) continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* fields after "(comm)": state ppid pgrp session */
        int ppid, pgrp, sess;
        char st;
        if (rp && sscanf(rp + 1, " %c %d %d %d", &st, &ppid, &pgrp, &sess) == 4 && sess == (int)sid) kill(p, SIGKILL);
    }
    if (d) closedir(d);
}

/* A killed mpirun cannot remove its session directory on this host (Open MPI 4:
 * $TMPDIR/ompi.<host up to its first dot>.<uid>/pid.<mpirun's pid>; a few MB of
 * shared-memory backing files): every restart of a world would leave one. */
static void sweep_mpi_session(pid_t pid) {
    char host[256] = "", path[1024];
    const char *tmp = getenv("TMPDIR");
    if (gethostname(host, sizeof host - 1) != 0) return;
    host[strcspn(host, ".")] = 0;
    snprintf(path, sizeof path, "%s/ompi.%s.%u/pid.%d", tmp && *tmp ? tmp : "/tmp", host, (unsigned)getuid(), (int)pid);
    dl_rm_rf(path);
}

/* without the lock: the wait for its exit is the point */
static void reap_worker(worker *w, int kill_it) {
    if (w->pid <= 0) return;
    if (kill_it && w->mpi) kill_session(w->pid);
    if (kill_it) kill(w->pid, SIGKILL);
    int st;
    waitpid(w->pid, &st, 0); /* confirm the exit before a replacement starts */
    if (w->mpi) kill_session(w->pid), sweep_mpi_session(w->pid); /* no rank may outlive its job */
    close(w->fd);
    if (w->listening) unlink(w->sock);
    w->fd = -1;
    w->mpi = w->listening = 0;
    publish_process(w, -1, 0);
}

/* one more restart of w's model (metrics) */
static void count_restart(worker *w) {
    lock();
    dl_api.restarts++, dl_api.m[w->model].restarts++;
    unlock();
}

/* the in-flight job is no longer w's: streams and waiters hear it */
static void clear_inflight(job_slot *sl) {
    lock();
    sl->inflight[0] = 0;
    dl_api_notify_locked();
    unlock();
    sl->cancel_sent = 0;
}

/* w's slot running job id, or NULL */
static job_slot *slot_of(worker *w, const char *id) {
    for (int i = 0; id && i < w->nslots; i++)
        if (w->s[i].inflight[0] && !strcmp(w->s[i].inflight, id)) return &w->s[i];
    return NULL;
}

/* A queued job on its way to a model process. */
typedef struct {
    char id[40];
    char out[1200]; /* where its result goes */
    cJSON *msg;     /* the job message for the model process */
    double deadline;
    int steps;
} next_job;

/* The oldest queued job of w's model (one past its deadline fails on the way), made
 * w's in memory before the store says in_progress: a client's cancel that finds the
 * job in_progress finds w too. 1 with *nx; 0 when the queue is empty (or the store
 * failed). */
static int take_next(worker *w, job_slot *sl, next_job *nx) {
    for (;;) {
        char *req = NULL;
        if (!dl_jobs_next(dl_api.js, dl_api.m[w->model].pr.model_id, nx->id, sizeof nx->id, &req, &nx->deadline)) return 0;
        if (wall() > nx->deadline) { /* waited past its deadline in the queue */
            int r = dl_jobs_transition(dl_api.js, nx->id, "queued", "failed", "timed out in the queue", NULL);
            free(req);
            dl_api_notify();
            if (r < 0) return 0;
            continue;
        }
        cJSON *rq = cJSON_Parse(req);
        free(req);
        const char *fmt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rq, "output_format"));
        nx->steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rq, "steps"));
        snprintf(nx->out, sizeof nx->out, "%s/%s.%s", dl_api.srv->results, nx->id,
                 fmt && !strcmp(fmt, "jpeg") ? "jpg" : fmt && !strcmp(fmt, "webp") ? "webp" : fmt && !strcmp(fmt, "mp4") ? "mp4" : "png");
        nx->msg = cJSON_CreateObject();
        cJSON_AddStringToObject(nx->msg, "type", "job");
        cJSON_AddStringToObject(nx->msg, "id", nx->id);
        cJSON_AddStringToObject(nx->msg, "out", nx->out);
        cJSON_AddItemToObject(nx->msg, "request", rq);
        lock();
        snprintf(sl->inflight, sizeof sl->inflight, "%s", nx->id);
        sl->cancel_wanted = 0;
        sl->live_step = 0;
        sl->live_steps = nx->steps;
        unlock();
        return 1;
    }
}

/* In this thread's store transaction: nx goes from queued to in_progress. 1 when it
 * did, 0 when it is no longer queued (a client cancelled it meanwhile), -1 on a store
 * error. */
static int start_in_tx(const next_job *nx) {
    int won = dl_jobs_transition(dl_api.js, nx->id, "queued", "in_progress", NULL, NULL);
    if (won == 1) dl_jobs_progress(dl_api.js, nx->id, 0, nx->steps, 0);
    return won;
}

/* After the commit: nx runs on w (it is sent), or (won != 1) w's slot is empty again. */
static void start_after(worker *w, job_slot *sl, next_job *nx, int won) {
    if (won != 1) {
        clear_inflight(sl);
    } else {
        snprintf(sl->out, sizeof sl->out, "%s", nx->out);
        sl->progress_written = wall();
        sl->deadline = nx->deadline;
        sl->cancel_sent = 0;
        cJSON *j = dl_jobs_get(dl_api.js, nx->id);
        double created = j ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "created")) : wall();
        cJSON_Delete(j);
        lock();
        dl_api.wait_sum += wall() - created, dl_api.wait_count++;
        dl_api_notify_locked(); /* event streams: the job is running */
        unlock();
        if (dl_msg_send(w->fd, nx->msg) != DL_OK) DL_WARN("serve: could not send job %s to the model process", nx->id);
    }
    cJSON_Delete(nx->msg);
    nx->msg = NULL;
}

/* Ends the store could not record (a failed write: a full disk, an I/O error): the job
 * is out of its slot, so without these it would stay in_progress until the next
 * restart. The supervisor retries them every 0.25 s until the store takes them. */
enum { MAX_UNFINISHED = 64 };
typedef struct {
    char id[40], status[16], err[256], result[1200];
} unfinished;
static unfinished g_unf[MAX_UNFINISHED];
static int g_nunf, g_fault_store_end = -1;

static void remember_end(const char *id, const char *status, const char *err, const char *result) {
    if (g_nunf == MAX_UNFINISHED) {
        DL_ERROR("serve: job %s: its end (%s) could not be stored, and %d others wait: it stays in_progress until a restart",
                 id, status, MAX_UNFINISHED);
        return;
    }
    unfinished *u = &g_unf[g_nunf++];
    snprintf(u->id, sizeof u->id, "%s", id), snprintf(u->status, sizeof u->status, "%s", status);
    snprintf(u->err, sizeof u->err, "%s", err ? err : ""), snprintf(u->result, sizeof u->result, "%s", result ? result : "");
    DL_WARN("serve: job %s: its end (%s) could not be stored yet; retrying", id, status);
}

static void retry_ends(void) {
    int k = 0;
    for (int i = 0; i < g_nunf; i++) {
        const unfinished *u = &g_unf[i];
        if (dl_jobs_transition(dl_api.js, u->id, "in_progress", u->status, u->err[0] ? u->err : NULL,
                               u->result[0] ? u->result : NULL) < 0)
            g_unf[k++] = *u; /* still failing: kept */
        else
            dl_api_notify();
    }
    g_nunf = k;
}

/* The in-flight job ends (if it is still in progress: a timed-out job already failed),
 * in the store, with a finished job's step counts and time (done: its message). When
 * w goes on (next), the next queued job of its model starts in the same transaction, so
 * a client that hears of the end already finds the queue one shorter (as one lock over
 * both used to make it). The store first, then memory: a reader that no longer finds a
 * job in memory finds its end in the store. */
static void finish_inflight(worker *w, job_slot *sl, const char *status, const char *err, const char *result, const cJSON *done,
                            int next) {
    if (!sl->inflight[0]) return;
    char id[40];
    snprintf(id, sizeof id, "%s", sl->inflight); /* the slot may pass to the next job below */
    int steps = 0;
    lock(); /* where a job that ends early stopped: the store's step is written at most every 0.25 s */
    const int live_step = sl->live_step, live_steps = sl->live_steps;
    unlock();
    if (done) {
        cJSON *j = dl_jobs_get(dl_api.js, id);
        steps = j ? (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "steps")) : 0;
        if (!j && result) unlink(result); /* deleted while it ran (DELETE /v1/videos/ID): its result goes too */
        cJSON_Delete(j);
    }
    next_job nx = {0};
    const int have = next && w->ready && take_next(w, sl, &nx);
    int won = -1;
    dl_status s = dl_jobs_begin(dl_api.js, 0);
    if (s == DL_OK) {
        if (done) {
            dl_jobs_progress(dl_api.js, id, steps, steps, (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(done, "cached")));
            dl_jobs_model_seconds(dl_api.js, id, cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(done, "seconds")));
        } else if (live_steps > 0)
            dl_jobs_progress(dl_api.js, id, live_step, live_steps, 0);
        if (g_fault_store_end < 0) { /* tests: DIFFLET_FAULT_STORE_END=N fails the first N end writes */
            const char *f = getenv("DIFFLET_FAULT_STORE_END");
            g_fault_store_end = f ? atoi(f) : 0;
        }
        if (g_fault_store_end > 0) g_fault_store_end--, s = dl_fail(DL_ERR_IO, "job store: an injected write failure");
        else if (dl_jobs_transition(dl_api.js, id, "in_progress", status, err, result) < 0) s = DL_ERR_IO;
        if (s == DL_OK && have) won = start_in_tx(&nx);
        if (s == DL_OK) s = dl_jobs_commit(dl_api.js);
        if (s != DL_OK) dl_jobs_rollback(dl_api.js), won = -1;
    }
    if (s != DL_OK) {
        DL_ERROR("serve: job store: %s", dl_last_error());
        remember_end(id, status, err, result);
    }
    if (have) start_after(w, sl, &nx, won);
    else clear_inflight(sl);
}

static void handle_msg(worker *w, cJSON *m) {
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "id"));
    if (!type) return;
    if (!strcmp(type, "ready")) {
        w->backoff = 0.5;
        lock();
        w->ready = 1;
        dl_api.m[w->model].last_error[0] = 0;
        dl_api.m[w->model].pool_nodes = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "nodes"));
        dl_api_notify_locked();
        unlock();
        DL_INFO("serve: model process %d (%s) ready (%.1f s)", (int)w->pid, dl_api.m[w->model].pr.model_id,
                cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "load_seconds")));
    } else if (!strcmp(type, "pool")) { /* a DDiT world's units (metrics, /v1/models, the page) */
        served *sm = &dl_api.m[w->model];
        lock();
        sm->pool_busy = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "busy"));
        sm->pool_waiting = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "waiting"));
        sm->pool_promotions = (long)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "promotions"));
        unlock();
    } else if (!strcmp(type, "fatal")) {
        served *sm = &dl_api.m[w->model];
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "message"));
        lock();
        snprintf(sm->last_error, sizeof sm->last_error, "%s", msg ? msg : "no reason given");
        unlock();
        DL_ERROR("serve: the model process of %s failed to start: %s", sm->pr.model_id, msg ? msg : "no reason given");
    } else if (slot_of(w, id)) {
        job_slot *sl = slot_of(w, id);
        if (!strcmp(type, "progress")) {
            /* every step to the event streams (memory), at most every 0.25 s to the store */
            lock();
            sl->live_step = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "step"));
            sl->live_steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "steps"));
            dl_api_notify_locked();
            unlock();
            if (wall() - sl->progress_written >= 0.25) { /* each write is a commit: not one per step */
                dl_jobs_progress(dl_api.js, id, (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "step")),
                              (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "steps")), 0);
                sl->progress_written = wall();
            }
        } else if (!strcmp(type, "done")) {
            char path[sizeof sl->out];
            snprintf(path, sizeof path, "%s", sl->out);
            lock();
            dl_api.steps_full += (long)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "calls"));
            dl_api.steps_cached += (long)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "cached"));
            const int dop = dl_dop_index((int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "dop")));
            if (dop >= 0) dl_api.m[w->model].by_dop[dop]++;
            unlock();
            finish_inflight(w, sl, "completed", NULL, path, m, 1); /* its result, step counts and time land together */
        } else if (!strcmp(type, "partial")) { /* a preview for the job's stream (stream.c keeps it) */
            cJSON *b = cJSON_GetObjectItemCaseSensitive(m, "b64");
            if (cJSON_IsString(b)) {
                char *t = b->valuestring; /* taken over, not copied */
                b->valuestring = NULL;
                dl_api_partial_put(id, (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "index")), t);
            }
        } else if (!strcmp(type, "error")) {
            int cancelled = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "cancelled"));
            finish_inflight(w, sl, cancelled ? "cancelled" : "failed",
                            cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "message")), NULL, NULL, 1);
        }
    }
}

/* The oldest queued job of w's model to w (ready, nothing in flight): 1 when one was
 * taken (sent, or lost to a cancel meanwhile: the next one may be taken), 0 when its
 * queue is empty or the store failed. The store's change is conditional (queued ->
 * in_progress), so a cancel that won the race leaves the job cancelled and unsent. */
static int dispatch_one(worker *w, job_slot *sl) {
    next_job nx = {0};
    if (!take_next(w, sl, &nx)) return 0;
    int won = -1;
    if (dl_jobs_begin(dl_api.js, 0) == DL_OK) {
        won = start_in_tx(&nx);
        if (won < 0 || dl_jobs_commit(dl_api.js) != DL_OK) dl_jobs_rollback(dl_api.js), won = -1;
    }
    if (won < 0) DL_ERROR("serve: job store: %s", dl_last_error());
    start_after(w, sl, &nx, won);
    return won >= 0;
}

/* Each queued job goes to a free slot of a ready model process of its model. */
static void dispatch(void) {
    for (int i = 0; i < dl_api.nworkers; i++) {
        worker *w = &dl_api.w[i];
        for (int k = 0; k < w->nslots; k++)
            while (w->ready && !w->s[k].inflight[0] && dispatch_one(w, &w->s[k])) {}
    }
}

/* every job in flight on a model process that died: failed (it may be retried); on a
 * DDiT world (whose restarts are part of its design: one rank's death ends the world)
 * back in the queue, to run again from the start with the same result */
static void fail_all(worker *w, const char *why) {
    const int requeue = dl_api.m[w->model].pr.scheduler[0] != 0;
    for (int k = 0; k < w->nslots; k++) {
        job_slot *sl = &w->s[k];
        if (!sl->inflight[0]) continue;
        if (requeue && dl_jobs_requeue(dl_api.js, sl->inflight) == 1) {
            DL_WARN("serve: job %s back in the queue (its DDiT world is restarting)", sl->inflight);
            clear_inflight(sl);
            dl_api_notify();
        } else {
            finish_inflight(w, sl, "failed", why, NULL, NULL, 0);
        }
    }
}

/* the first job in flight on w ("" when none) */
static const char *first_job(const worker *w) {
    for (int k = 0; k < w->nslots; k++)
        if (w->s[k].inflight[0]) return w->s[k].inflight;
    return "";
}

static int busy(const worker *w) { return first_job(w)[0] != 0; }

/* One pass over a model process: spawn, messages, death, deadline, kill. */
static void tend(worker *w, int k, const struct pollfd *pf, int stopping) {
    double now = wall();
    served *sm = &dl_api.m[w->model];
    if (w->pid <= 0 && now >= w->next_spawn && !stopping) spawn_worker(w, k);
    if (w->pid > 0 && w->mpi) { /* an mpirun job: its first rank connects; mpirun's exit is its death */
        int st, gone = waitpid(w->pid, &st, WNOHANG) == w->pid;
        if (!gone && w->listening && pf && (pf->revents & POLLIN)) {
            int c = accept4(w->fd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0) {
                close(w->fd);
                unlink(w->sock);
                w->fd = c;
                w->listening = 0;
            }
            return;
        }
        if (gone || (w->listening && now - w->spawn_time > 300)) {
            pid_t pid = w->pid;
            cJSON *m = NULL; /* what its first rank said last (a fatal start-up error) */
            struct pollfd q = {.fd = w->fd, .events = POLLIN};
            while (!w->listening && poll(&q, 1, 0) > 0 && (q.revents & POLLIN) && dl_msg_recv_within(w->fd, &m, 100) == DL_OK) {
                handle_msg(w, m);
                cJSON_Delete(m);
            }
            reap_worker(w, !gone); /* an mpirun already reaped: its wait returns at once; every rank is killed */
            count_restart(w);
            fail_all(w, "the model process exited unexpectedly; the request failed (it may be retried)");
            DL_WARN("serve: parallel model process %d exited; replacing it", (int)pid);
            w->next_spawn = now + w->backoff;
            w->backoff = fmin(w->backoff * 2, 30);
            return;
        }
        if (w->listening) return;
    }
    if (w->pid > 0 && pf && (pf->revents & (POLLIN | POLLHUP | POLLERR))) {
        cJSON *m = NULL;
        if (dl_msg_recv_within(w->fd, &m, 2000) == DL_OK) { /* the wait for the rest of a frame holds no lock */
            handle_msg(w, m);
            cJSON_Delete(m);
        } else { /* the model process exited, or stalled half-way through a frame: fail its job, replace it */
            int was_ready = w->ready;
            pid_t pid = w->pid;
            reap_worker(w, 1); /* SIGKILL: a no-op on one that already exited, and never a wait on a stuck one */
            count_restart(w);
            if (busy(w)) {
                DL_WARN("serve: model process %d died during job %s; replacing it", (int)pid, first_job(w));
                fail_all(w, "the model process exited unexpectedly; the request failed (it may be retried)");
            } else {
                DL_WARN("serve: model process %d exited; replacing it", (int)pid);
            }
            w->next_spawn = now + (was_ready ? 0 : w->backoff);
            w->backoff = was_ready ? 0.5 : fmin(w->backoff * 2, 30);
        }
    }
    for (int j = 0; j < w->nslots; j++) {
        job_slot *sl = &w->s[j];
        lock();
        const int cancel_wanted = sl->cancel_wanted;
        unlock();
        if (sl->inflight[0] && !sl->cancel_sent && (now > sl->deadline || cancel_wanted)) {
            /* deadline (or a cancel request): the client hears now; the process stops at a step boundary */
            int timed_out = now > sl->deadline;
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "type", "cancel");
            cJSON_AddStringToObject(c, "id", sl->inflight);
            dl_msg_send(w->fd, c);
            cJSON_Delete(c);
            if (timed_out) {
                char err[128];
                snprintf(err, sizeof err, "timed out after %.0f s", sm->pr.timeout_s);
                if (dl_jobs_transition(dl_api.js, sl->inflight, "in_progress", "failed", err, NULL) < 0)
                    DL_ERROR("serve: job store: %s", dl_last_error());
                dl_api_notify();
            }
            sl->cancel_sent = 1;
            sl->cancel_time = now;
        }
        if (sl->inflight[0] && sl->cancel_sent && now > sl->cancel_time + sm->pr.grace_s) {
            DL_WARN("serve: model process %d did not stop job %s within %.1f s: killing it", (int)w->pid, sl->inflight,
                    sm->pr.grace_s);
            finish_inflight(w, sl, "failed", "timed out; the model process was replaced", NULL, NULL, 0);
            fail_all(w, "the model process was replaced (another job on it did not stop in time); the request failed (it "
                        "may be retried)");
            reap_worker(w, 1);
            count_restart(w);
            w->next_spawn = wall();
            break;
        }
    }
}

void *dl_api_supervisor(void *arg) {
    (void)arg;
    lock();
    int stopping = dl_api.stopping;
    unlock();
    while (!stopping) {
        struct pollfd pf[MAX_WORKERS + 1];
        for (int i = 0; i < dl_api.nworkers; i++) pf[i] = (struct pollfd){.fd = dl_api.w[i].pid > 0 ? dl_api.w[i].fd : -1, .events = POLLIN};
        pf[dl_api.nworkers] = (struct pollfd){.fd = dl_api.wake[0], .events = POLLIN};
        int pr = poll(pf, (nfds_t)dl_api.nworkers + 1, 50);
        if (pr > 0 && (pf[dl_api.nworkers].revents & POLLIN)) {
            char drain[64];
            while (read(dl_api.wake[0], drain, sizeof drain) > 0) {}
        }
        for (int i = 0; i < dl_api.nworkers; i++) tend(&dl_api.w[i], i, pr > 0 ? &pf[i] : NULL, stopping);
        dispatch();
        double now = wall();
        if (now - dl_api.last_expire >= 0.25) { /* queued jobs no model process takes in time end at their deadline */
            dl_api.last_expire = now;
            retry_ends();
            if (dl_jobs_expire(dl_api.js, now) > 0) dl_api_notify();
        }
        lock();
        stopping = dl_api.stopping;
        unlock();
    }
    for (int i = 0; i < dl_api.nworkers; i++) reap_worker(&dl_api.w[i], 1);
    return NULL;
}
