/* `difflet serve`: an OpenAI-style HTTP API (the API process) in front of resident
 * model processes, configured by a deployment (a JSON file: the models, the sizes
 * each serves, replicas and their parallel layout, limits, timeouts). One server may
 * serve several models (an image and a video model, say): each has its own model
 * processes, and a request's `model` picks one. "Profile" in difflet means only the
 * DDiT step-time profile (sched.h). docs/serve.md. */
#ifndef DIFFLET_SERVE_H
#define DIFFLET_SERVE_H

#include <cjson/cJSON.h>

#include "difflet/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- a deployment of one model: what it serves, and how ----
 * The server's own settings (host, port, api_key, results, db, result_ttl_s, the
 * connection limits, health_port) are here too, the same in every served model's. */
typedef struct {
    char model[1024], results[1024], db[1024], host[64], api_key[256];
    char allowed_hosts[512];    /* without an api_key: host names (comma-separated, "*": any) a request's Host may
                                   carry besides IP literals and localhost (the DNS-rebinding guard) */
    char model_id[256];         /* what clients call it: the Hub id given, or the folder's name */
    int port, queue_capacity, max_steps, max_prompt_bytes, nsizes, no_compile;
    int replicas;           /* data parallel: model processes, each on its own cores */
    int sizes[8][2];        /* width, height */
    /* a video model: the frame counts served (each size x frame count is one loaded
       pipeline, at most 16 in all), as the pipeline rounds them (frame_step k + 1);
       not given: the model's own default. An image model serves {1}. */
    int nframes, frames[8], frames_given;
    int video;              /* the model makes videos (set by dl_deployment_set_model) */
    int frame_step;         /* a video model's valid counts are frame_step * k + 1 (the VAE's
                               temporal scale factor); 1 for an image model */
    double fps;             /* a video request's frame rate when it does not say (the model's: 16 for Wan) */
    int fps_given;          /* fps set by the deployment or --fps, not the model's default */
    int max_sequence_length; /* the text encoder's padded length (0: the pipeline's default) */
    double timeout_s, grace_s, result_ttl_s;
    double idle_timeout_s;      /* a connection idle this long (headers included) is closed */
    int max_connections, max_connections_per_ip;
    int health_port;            /* >= 0: /health and /ready also on their own listener (0: any
                                   free port), reachable when the API's connections are full */
    char dtype[16], cache[256]; /* default step-caching mode */
    char parallel[128];     /* each replica's layout (tp, sp, cp; "" = one rank): its model
                               process is an mpirun job whose first rank talks to the server */
    /* "ddit": the model process is one MPI world of a scheduler rank and `units` units
     * (ddit.h) that places each request on an elastic rank group (DDiT: promotion at
     * step boundaries, the VAE decoupled) and runs several at once; "" one request at
     * a time on the layout above */
    char scheduler[16];
    int units;              /* ddit: units (a power of two, 1..8) */
    char ddit_profile[64];  /* ddit: the profile (`difflet profile`) that gives each
                               pipeline's B; resolution r is pipeline r (size i, frame count k:
                               r = i * nframes + k) */
    char ddit_policy[16];   /* ddit: ddit (default), ddit-qa (queue-aware), sdop:N */
    /* a parallel or DDiT model process's mpirun: a host file (the ranks on several
     * hosts: the first rank, which talks to this server, on this one) and more mpirun
     * arguments (split at spaces; e.g. an rsh agent, the interfaces to use) */
    char mpirun_hostfile[1024], mpirun_args[512];
} dl_deployment;

/* Defaults (difflet-tiny, 64x64, 127.0.0.1), then the deployment's JSON file if given,
 * in the one-model form (what a model process reads); the model reference is
 * resolved (a folder, or a Hub id in the local cache). */
dl_status dl_deployment_load(dl_deployment *p, const char *path);
/* The model: a folder or a Hub id (resolved in the local cache); model_id becomes
 * the id given or the folder's name. Also what it makes (video, frame_step) and the
 * frame counts it serves: the model's default when none were given, each rounded as
 * the pipeline rounds it; frames for an image model are refused. */
dl_status dl_deployment_set_model(dl_deployment *p, const char *ref);
cJSON *dl_deployment_to_json(const dl_deployment *p);
/* A requested frame count as the served pipeline would make it: rounded down to
 * frame_step * k + 1, as WanPipeline rounds num_frames (1 for an image model). */
int dl_deployment_round_frames(const dl_deployment *p, int frames);
dl_status dl_deployment_from_json(dl_deployment *p, const cJSON *j);

/* ---- what one `difflet serve` serves: one deployment per model ----
 * models[0] is the default model. The JSON file has the one-model form (`model`,
 * `sizes`, ... at the top level) or a list, `"models": [{"model": ..., "sizes": ...},
 * "folder", ...]`, whose entries take the top level's settings unless they say
 * otherwise (docs/serve.md). */
enum { DL_SERVE_MAX_MODELS = 8, DL_SERVE_MAX_PROCESSES = 16 };
typedef struct {
    int nmodels;
    dl_deployment models[DL_SERVE_MAX_MODELS];
} dl_serve_config;

/* Defaults (difflet-tiny alone), then the deployment file if given (either form),
 * checked by dl_serve_config_check. */
dl_status dl_serve_config_load(dl_serve_config *c, const char *path);
/* A deployment's JSON (either form) into c, each model resolved; the rest is
 * dl_serve_config_load's (the store's default path, the check). */
dl_status dl_serve_config_from_json(dl_serve_config *c, const cJSON *j);
/* Makes the server's settings models[0]'s in every model, then checks: model ids
 * unique, at most DL_SERVE_MAX_PROCESSES model processes in all. */
dl_status dl_serve_config_check(dl_serve_config *c);
/* The defaults of a model added to c (on the command line): models[0]'s settings but
 * for what is the model's own (sizes 64x64, frames, fps, model_id, text length). */
void dl_serve_config_new_model(const dl_serve_config *c, dl_deployment *out);

/* The API process: listens, validates, routes each request to its model, queues,
 * supervises the model processes. self_exe: this binary (started again as
 * `serve-worker`, one model each). Returns the exit code. */
int dl_serve_api_main(const dl_serve_config *c, const char *self_exe);
/* One model process (p: its model's deployment). fd: the connection to the API
 * process; or, fd < 0, the unix socket path the first rank of a parallel model
 * process connects to. */
int dl_serve_worker_main(int fd, const char *sock_path, const dl_deployment *p);
/* The same for a deployment with "scheduler": "ddit": every rank of the mpirun world
 * (ddit_worker.c) */
int dl_serve_ddit_main(const char *sock_path, const dl_deployment *p);


#ifdef __cplusplus
}
#endif
#endif
