"""Peer measurement for `difflet bench flux-step`: diffusers' FluxTransformer2DModel
on the same weights and inputs, torch CPU, the same dtype (default bf16) and thread count.

    python flux_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32]
Prints one JSON line: {"step_s": best seconds, "torch": version, "threads": n}.
Writes the output tensor to OUT.safetensors so the bench can compare it with difflet's.
"""
import json
import os
import sys
import time

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file, save_file


def main():
    model_dir, inputs, out_path, threads, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    dt = torch.float32 if len(sys.argv) > 6 and sys.argv[6] == "f32" else torch.bfloat16
    torch.set_num_threads(threads)
    x = load_file(inputs)
    tr = FluxTransformer2DModel.from_pretrained(os.path.join(model_dir, "transformer"), torch_dtype=dt).eval()
    lat = x["latents"].to(dt)[None]
    txt = x["prompt_embeds"].to(dt)[None]
    pooled = x["pooled"].to(dt)[None]
    gh, gw = int(x["grid"][0]), int(x["grid"][1])
    img_ids = torch.zeros(gh, gw, 3)
    img_ids[..., 1] = torch.arange(gh)[:, None]
    img_ids[..., 2] = torch.arange(gw)[None, :]
    img_ids = img_ids.reshape(gh * gw, 3)
    txt_ids = torch.zeros(txt.shape[1], 3)
    t = torch.tensor([float(x["timestep"][0])])
    g = torch.tensor([float(x["guidance"][0])])
    best = float("inf")
    with torch.inference_mode():
        for i in range(reps + 1):
            t0 = time.perf_counter()
            out = tr(hidden_states=lat, encoder_hidden_states=txt, pooled_projections=pooled, timestep=t,
                     img_ids=img_ids, txt_ids=txt_ids, guidance=g, return_dict=False)[0]
            dt = time.perf_counter() - t0
            if i > 0:  # the first call warms up
                best = min(best, dt)
    save_file({"out": out[0].float().contiguous()}, out_path)
    print(json.dumps({"step_s": best, "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
