"""Schedule parity vectors for FlowMatchEulerDiscreteScheduler's options, as FluxPipeline
drives it (custom sigmas np.linspace(1, 1/steps, steps), mu from the image token count).

Run from the repository root with the tools virtualenv (make tools-venv):
    tools/venv/bin/python tools/parity/make_flowmatch_vectors.py
Writes tests/data/sched/flowmatch_options.json: a list of cases, each with the
scheduler config, steps, mu (or default_sigmas: set_timesteps(steps) with no custom
sigmas, as WanPipeline calls it), and the scheduler's sigmas (steps + 1, float32 values
as numbers; null where diffusers gives NaN) and timesteps.
"""
import json
import os

import numpy as np
from diffusers import FlowMatchEulerDiscreteScheduler

BASE = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True, "base_image_seq_len": 256,
        "max_image_seq_len": 4096, "base_shift": 0.5, "max_shift": 1.15}
VARIANTS = [
    {},
    {"use_dynamic_shifting": False},
    {"use_dynamic_shifting": False, "shift": 1.0},
    {"time_shift_type": "linear"},
    {"shift_terminal": 0.1},
    {"use_karras_sigmas": True},
    {"use_exponential_sigmas": True},
    {"use_beta_sigmas": True},
    {"use_beta_sigmas": True, "shift_terminal": 0.02},
    {"invert_sigmas": True},
    {"use_karras_sigmas": True, "use_dynamic_shifting": False, "shift": 7.0},
    {"use_exponential_sigmas": True, "time_shift_type": "linear", "shift_terminal": 0.05},
]


def main():
    cases = []
    for v in VARIANTS:
        for steps, n in ((1, 256), (4, 1024), (9, 4096), (28, 64), (50, 3000)):
            cfg = dict(BASE, **v)
            if cfg.get("time_shift_type") == "linear":
                cfg["base_shift"], cfg["max_shift"] = 1.5, 3.0  # linear shifting takes mu itself
            sch = FlowMatchEulerDiscreteScheduler(**cfg)
            m = (cfg["max_shift"] - cfg["base_shift"]) / (cfg["max_image_seq_len"] - cfg["base_image_seq_len"])
            mu = n * m + cfg["base_shift"] - m * cfg["base_image_seq_len"]  # FluxPipeline's calculate_shift
            sigmas = np.linspace(1.0, 1 / steps, steps)
            sch.set_timesteps(sigmas=sigmas, mu=mu)
            num = lambda a: [None if np.isnan(x) else float(x) for x in a.float().numpy()]  # JSON has no NaN
            cases.append({"config": cfg, "steps": steps, "image_seq_len": n, "mu": mu, "sigmas": num(sch.sigmas),
                          "timesteps": num(sch.timesteps)})
    # set_timesteps(num_inference_steps) without custom sigmas (WanPipeline), static shifting
    for v in VARIANTS:
        for steps in (1, 4, 9, 28, 50):
            cfg = dict(BASE, **v)
            cfg["use_dynamic_shifting"] = False
            if cfg.get("time_shift_type") == "linear":
                continue
            sch = FlowMatchEulerDiscreteScheduler(**cfg)
            sch.set_timesteps(steps)
            num = lambda a: [None if np.isnan(x) else float(x) for x in a.float().numpy()]
            cases.append({"config": cfg, "steps": steps, "default_sigmas": True, "sigmas": num(sch.sigmas),
                          "timesteps": num(sch.timesteps)})
    out = os.path.join("tests", "data", "sched", "flowmatch_options.json")
    with open(out, "w") as f:
        json.dump({"diffusers": __import__("diffusers").__version__, "cases": cases}, f)
    print(f"wrote {out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
