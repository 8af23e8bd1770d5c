"""Parity vectors for UniPCMultistepScheduler in the flow-matching configuration Wan 2.1
uses (use_flow_sigmas, flow_prediction, predict_x0), driven as WanPipeline drives it:
set_timesteps(steps), set_begin_index(0), then latents = step(noise_pred, t, latents)
for every t.

Run from the repository root with the tools virtualenv (make tools-venv):
    tools/venv/bin/python tools/parity/make_unipc_vectors.py
Writes (on the CPU, float32 latents, as diffusers computes there):
  tests/data/sched/unipc.json         "base": Wan's scheduler config; the cases: the keys
      each changes in it ("change"), steps, the int64 timesteps and float32 sigmas
      set_timesteps makes, and the safetensors tensor holding its samples; or, for a
      config difflet refuses, "refused" with the option names the message must contain
      (for the configs where diffusers itself gives inf/NaN this script checks that it
      does before recording the refusal).
  tests/data/sched/unipc.safetensors  latent0 [n] (the starting latents, 2x3x4x5
      flattened, +0/-0/-0/+0 in elements 0-3), model_outputs [50, n] (step i's
      "transformer output": seeded torch.randn, +0/-0/+0/-0 in elements 0-3),
      case<k> [steps, n] (the latents after every step), and log_x / log_y: every
      argument torch.log was given by the scheduler (1 - sigma and sigma) with its
      result, so the C test can also run with torch's own logarithm (MKL's vsLn on
      x86, which is not correctly rounded) and demand bit-identical samples.
"""
import copy
import json
import math
import os

import numpy as np
import torch
from diffusers import UniPCMultistepScheduler
from safetensors.torch import save_file

WAN = {"_class_name": "UniPCMultistepScheduler", "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
       "disable_corrector": [], "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
       "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True, "prediction_type": "flow_prediction",
       "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
       "solver_type": "bh2", "steps_offset": 0, "thresholding": False, "timestep_spacing": "linspace",
       "trained_betas": None, "use_beta_sigmas": False, "use_exponential_sigmas": False, "use_flow_sigmas": True,
       "use_karras_sigmas": False}
SHAPE = (2, 3, 4, 5)
N = math.prod(SHAPE)
MAX_STEPS = 50
SHORT = (1, 2, 3, 4, 10)
# (changed keys, step counts)
VARIANTS = [
    ({}, SHORT + (50,)),
    ({"flow_shift": 5.0}, SHORT + (50,)),
    ({"flow_shift": 1.0}, (1, 4, 10)),  # sigma 1 at the start: diffusers takes 1e-6 off
    ({"flow_shift": 7}, (3, 10)),  # an integer in the JSON
    ({"solver_order": 1}, SHORT),
    ({"solver_order": 3}, SHORT + (50,)),
    ({"solver_type": "bh1", "final_sigmas_type": "sigma_min"}, SHORT),
    ({"solver_type": "bh1", "final_sigmas_type": "sigma_min", "solver_order": 3}, SHORT),
    ({"final_sigmas_type": "sigma_min"}, SHORT),
    ({"final_sigmas_type": "sigma_min", "solver_order": 3}, SHORT),
    ({"lower_order_final": False, "final_sigmas_type": "sigma_min"}, SHORT),
    ({"lower_order_final": False, "solver_order": 3, "final_sigmas_type": "sigma_min"}, (1, 2)),
    ({"lower_order_final": False, "solver_order": 1}, (1, 4)),
    ({"disable_corrector": [0]}, SHORT),
    ({"disable_corrector": [1, 2]}, SHORT),
    ({"disable_corrector": [0, 1, 2], "solver_order": 3}, (4, 10)),
    ({"shift_terminal": 0.1}, (2, 4, 10)),
    ({"timestep_spacing": "trailing"}, (3, 10)),  # ignored on the flow path
    ({"timestep_spacing": "leading", "steps_offset": 1}, (3,)),
    ({"solver_type": "midpoint"}, (4,)),  # diffusers maps it to bh2
    ({"num_train_timesteps": 500, "flow_shift": 2.5}, (4, 10)),
]
# configs difflet refuses: (changed keys, steps, option names the message must contain, diffusers gives non-finite)
REFUSED = [
    ({"thresholding": True}, 4, ["thresholding"], False),
    ({"prediction_type": "epsilon"}, 4, ["prediction_type"], False),
    ({"prediction_type": "v_prediction"}, 4, ["prediction_type"], False),
    ({"predict_x0": False}, 4, ["predict_x0"], False),
    ({"use_karras_sigmas": True}, 4, ["use_karras_sigmas"], False),
    ({"use_exponential_sigmas": True}, 4, ["use_exponential_sigmas"], False),
    ({"use_beta_sigmas": True}, 4, ["use_beta_sigmas"], False),
    ({"use_flow_sigmas": False}, 4, ["use_flow_sigmas"], False),
    ({"use_dynamic_shifting": True}, 4, ["use_dynamic_shifting"], False),
    ({"solver_p": {"_class_name": "DDIMScheduler"}}, 4, ["solver_p"], False),
    ({"solver_order": 4}, 4, ["solver_order"], False),
    ({"solver_type": "bh3"}, 4, ["solver_type"], False),
    ({"timestep_spacing": "uniform"}, 4, ["timestep_spacing"], False),
    ({"final_sigmas_type": "one"}, 4, ["final_sigmas_type"], False),
    ({"_class_name": "DPMSolverMultistepScheduler"}, 4, ["DPMSolverMultistepScheduler"], False),
    ({"shift_terminal": 0.1}, 1, ["shift_terminal"], True),
    # diffusers divides by a zero step at sigma 0 (B(h) = h = -inf, or D1 = (m1 - m0) / 0)
    ({"solver_type": "bh1"}, 4, ["solver_type", "final_sigmas_type"], True),
    ({"solver_type": "bh1"}, 1, ["solver_type", "final_sigmas_type"], True),
    ({"lower_order_final": False}, 4, ["lower_order_final", "final_sigmas_type"], True),
    ({"lower_order_final": False, "solver_order": 3}, 2, ["lower_order_final", "final_sigmas_type"], True),
    # with sigma_min the last step has h = 0: order 3 solves a system of infinities
    ({"lower_order_final": False, "solver_order": 3, "final_sigmas_type": "sigma_min"}, 4,
     ["lower_order_final", "solver_order"], True),
]


def inputs():
    latent0 = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).flatten()
    outs = torch.stack([torch.randn(SHAPE, generator=torch.Generator().manual_seed(1000 + i)).flatten()
                        for i in range(MAX_STEPS)])
    # signed zeros through every operation: each pairing of +0/-0 latents and outputs
    latent0[:4] = torch.tensor([0.0, -0.0, -0.0, 0.0])
    outs[:, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    return latent0, outs


def run(cfg, steps, latent0, outs, logs):
    sch = UniPCMultistepScheduler.from_config(cfg)
    sch.set_timesteps(steps)
    sch.set_begin_index(0)
    for s in sch.sigmas:  # every value step() takes a logarithm of: 1 - sigma and sigma
        for x in (1 - s, s):
            key = int(x.view(torch.int32))
            y = float(torch.log(x))
            assert logs.setdefault(key, y) == y or (math.isnan(y) and math.isnan(logs[key]))
    timesteps, sigmas = sch.timesteps.clone(), sch.sigmas.clone()
    lat = latent0.clone().reshape(SHAPE)
    samples = []
    for i, t in enumerate(sch.timesteps):
        lat = sch.step(outs[i].reshape(SHAPE), t, lat, return_dict=False)[0]
        samples.append(lat.flatten().clone())
    return timesteps, sigmas, torch.stack(samples)


def main():
    latent0, outs = inputs()
    tensors = {"latent0": latent0, "model_outputs": outs}
    logs = {}
    cases = []
    for change, step_counts in VARIANTS:
        cfg = dict(copy.deepcopy(WAN), **change)
        for steps in step_counts:
            ts, sg, samples = run(cfg, steps, latent0, outs, logs)
            assert torch.isfinite(samples).all(), (change, steps)
            name = f"case{len(cases)}"
            tensors[name] = samples
            cases.append({"change": change, "steps": steps, "timesteps": [int(t) for t in ts],
                          "sigmas": [float(s) for s in sg], "samples": name})
    for change, steps, names, nonfinite in REFUSED:
        cfg = dict(copy.deepcopy(WAN), **change)
        if nonfinite:  # check that diffusers really gives inf/NaN here, so refusing loses nothing
            with np.errstate(divide="ignore", invalid="ignore"):
                ts, sg, samples = run(cfg, steps, latent0, outs, {})
            assert not torch.isfinite(samples).all(), (change, steps)
        cases.append({"change": change, "steps": steps, "refused": names})
    xs = sorted(logs)
    tensors["log_x"] = torch.tensor(xs, dtype=torch.int32).view(torch.float32)
    tensors["log_y"] = torch.tensor([logs[k] for k in xs], dtype=torch.float32)
    out = os.path.join("tests", "data", "sched")
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "unipc.safetensors"),
              metadata={"generator": "tools/parity/make_unipc_vectors.py"})
    os.chmod(os.path.join(out, "unipc.safetensors"), 0o644)
    meta = {"diffusers": __import__("diffusers").__version__, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "n": N, "base": WAN, "cases": cases}
    with open(os.path.join(out, "unipc.json"), "w") as f:
        json.dump(meta, f)
    print(f"wrote {out}/unipc.json and unipc.safetensors: {len(cases)} cases, {len(xs)} logarithms")


if __name__ == "__main__":
    main()
