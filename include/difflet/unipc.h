/* UniPCMultistepScheduler (diffusers) in the flow-matching form Wan 2.1 uses:
 * use_flow_sigmas, prediction_type flow_prediction, predict_x0, solver orders 1 to 3,
 * B(h) bh1 or bh2, the UniC corrector (disable_corrector), lower_order_final,
 * final_sigmas_type zero or sigma_min, static flow_shift and shift_terminal.
 * Everything else diffusers offers (thresholding, Karras / exponential / beta sigmas,
 * dynamic shifting, other prediction types, solver_p, the VP-type schedule) is
 * refused by name, and so are the combinations whose diffusers result is NaN or
 * infinite (bh1 with a zero final sigma, and lower_order_final false toward a final
 * sigma the high-order update cannot reach). The arithmetic is diffusers' on the CPU,
 * float32 latents (tests/test_unipc.c). */
#ifndef DIFFLET_UNIPC_H
#define DIFFLET_UNIPC_H

#include "difflet/io.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DL_UNIPC_MAX_ORDER 3
#define DL_UNIPC_MAX_DISABLE 64
#define DL_UNIPC_MAX_STEPS 10000

typedef struct {
    int64_t num_train_timesteps;
    int solver_order;      /* 1..DL_UNIPC_MAX_ORDER */
    int bh2;               /* solver_type: 1 bh2 (B(h) = e^h - 1; also midpoint/heun/logrho), 0 bh1 (B(h) = h) */
    int lower_order_final; /* the last steps drop to the orders they have room for */
    int final_sigma_min;   /* final_sigmas_type: 1 "sigma_min" (the last sigma repeated), 0 "zero" */
    double flow_shift;     /* sigma <- shift s / (1 + (shift - 1) s) */
    double shift_terminal; /* 0: off; else the shifted schedule is stretched to end there */
    int ndisable;          /* disable_corrector: after step i in this list, step i + 1 skips UniC */
    double disable_corrector[DL_UNIPC_MAX_DISABLE];
} dl_unipc;

/* scheduler/scheduler_config.json of a model folder. Unknown keys are ignored (as
 * diffusers ignores them); options outside the scope above are refused with a
 * message naming the option. */
dl_status dl_unipc_load(dl_model_dir *dir, dl_unipc *u);
/* The same from a config object (`file` names it in messages). */
dl_status dl_unipc_from_json(const struct cJSON *cfg, const char *file, dl_unipc *u);

/* set_timesteps(steps): timesteps [steps], the model's timestep input at each step
 * (diffusers' int64 values, here as floats), and sigmas [steps + 1] (float32, as
 * diffusers stores them). Either may be NULL. Refuses step counts for which
 * diffusers' own result is NaN or infinite (shift_terminal with one step;
 * lower_order_final false with a final sigma it cannot step to) with the reason. */
dl_status dl_unipc_schedule(const dl_unipc *u, int steps, float *timesteps, float *sigmas);

/* One denoising run of `steps` steps over n latent elements: the schedule and the
 * multistep history (solver_order model outputs and the last sample, planned once;
 * step() allocates nothing). */
typedef struct dl_unipc_state dl_unipc_state;
dl_status dl_unipc_state_new(dl_unipc_state **out, const dl_unipc *u, int steps, int64_t n);
/* Back to step 0 for a new run with the same config, steps and n. */
void dl_unipc_state_reset(dl_unipc_state *st);
/* Step i (0-based; steps run in order, once each, i.e. i is the number of steps
 * taken since new/reset): sample [n] <- scheduler.step(model_output [n], timesteps[i],
 * sample).prev_sample. A step out of order is refused (DL_ERR_INVALID). The model
 * output is float32, as a float32 transformer gives it (with a bf16 output diffusers
 * rounds sigma * model_output to bf16 before subtracting it). */
dl_status dl_unipc_step(dl_unipc_state *st, int i, const float *model_output, float *sample);
/* The sigmas of this run ([steps + 1], owned by st). */
const float *dl_unipc_state_sigmas(const dl_unipc_state *st);
void dl_unipc_state_free(dl_unipc_state *st);

/* The natural logarithm step() takes of 1 - sigma and sigma. By default it is
 * correctly rounded; torch computes it with its own library (MKL's vsLn on x86,
 * which is not, in about 5 % of arguments in (0, 1)), so the tests replace it with
 * torch's recorded values to check the rest of the arithmetic to the bit. NULL
 * restores the default. */
typedef float (*dl_unipc_log_fn)(float x, void *ctx);
void dl_unipc_state_set_log(dl_unipc_state *st, dl_unipc_log_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
