"""What the step peers (wan_step_peer.py, qwen_step_peer.py, hunyuan_step_peer.py) share:
the command line, torch's thread count, the inputs and the model folder, the timing loop
and the output.

    python <model>_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
Prints one JSON line: {"step_s": best seconds of REPS after WARMUP (default 1) untimed runs, "torch": version,
"threads": n, "peak_rss_mib": this process's peak RSS}.
Writes the output tensor (batch row 0, f32) to OUT.safetensors (as "out") so the bench can
compare it with difflet's.
"""
import json
import os
import resource
import sys
import time

import torch
from safetensors.torch import load_file, save_file


def run(model_cls, make_step):
    """Load MODEL_DIR/transformer as model_cls in the dtype asked for, then time
    make_step(tr, x, dt)(), a call of one denoiser step on the inputs x (a dict of f32
    tensors) that returns the model's output [1, ...]."""
    model_dir, inputs, out_path, threads, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    dt = torch.float32 if len(sys.argv) > 6 and sys.argv[6] == "f32" else torch.bfloat16
    warm = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    torch.set_num_threads(threads)
    x = load_file(inputs)
    tr = model_cls.from_pretrained(os.path.join(model_dir, "transformer"), torch_dtype=dt).eval()
    step = make_step(tr, x, dt)
    best = float("inf")
    with torch.inference_mode():
        for i in range(warm + reps):
            t0 = time.perf_counter()
            out = step()
            el = time.perf_counter() - t0
            if i >= warm:  # the first calls warm up
                best = min(best, el)
    save_file({"out": out[0].float().contiguous()}, out_path)
    print(json.dumps({"step_s": best, "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
