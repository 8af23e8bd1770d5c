"""Peer measurement for `difflet bench qwen-step`: diffusers' QwenImageTransformer2DModel
(the folder's one-block config) on the same weights and inputs, torch CPU, the same
dtype (default bf16) and thread count, called as QwenImagePipeline calls it for one
prompt: the prompt's own rows with no mask, img_shapes [[(1, gh, gw)]], timestep =
the pipeline's t / 1000.

    python qwen_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
INPUTS holds latents [N, in] (packed), prompt_embeds [L, joint_dim] (the valid rows),
timestep [1] (= t / 1000), grid [2] (packed gh, gw) (f32).
Prints one JSON line: {"step_s": best seconds of REPS after WARMUP (default 1) untimed runs, "torch": version,
"threads": n, "peak_rss_mib": this process's peak RSS}.
Writes the output tensor [N, out] to OUT.safetensors (as "out") so the bench can
compare it with difflet's.
"""
import json
import os
import resource
import sys
import time

import torch
from diffusers import QwenImageTransformer2DModel
from safetensors.torch import load_file, save_file


def main():
    model_dir, inputs, out_path, threads, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    dt = torch.float32 if len(sys.argv) > 6 and sys.argv[6] == "f32" else torch.bfloat16
    warm = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    torch.set_num_threads(threads)
    x = load_file(inputs)
    tr = QwenImageTransformer2DModel.from_pretrained(os.path.join(model_dir, "transformer"), torch_dtype=dt).eval()
    lat = x["latents"].to(dt)[None]
    txt = x["prompt_embeds"].to(dt)[None]
    t = torch.tensor([float(x["timestep"][0])])
    gh, gw = int(x["grid"][0]), int(x["grid"][1])
    best = float("inf")
    with torch.inference_mode():
        for i in range(warm + reps):
            t0 = time.perf_counter()
            out = tr(hidden_states=lat, encoder_hidden_states=txt, encoder_hidden_states_mask=None, timestep=t,
                     img_shapes=[[(1, gh, gw)]], return_dict=False)[0]
            el = time.perf_counter() - t0
            if i >= warm:  # the first calls warm up
                best = min(best, el)
    save_file({"out": out[0].float().contiguous()}, out_path)
    print(json.dumps({"step_s": best, "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


if __name__ == "__main__":
    main()
