"""Peer measurement for `difflet bench hunyuan-step`: diffusers' HunyuanVideoTransformer3DModel
(the folder's one-dual-block, one-single-block config) on the same weights and inputs,
torch CPU, the same dtype (default bf16) and thread count, called as HunyuanVideoPipeline
calls it: every text row with the attention mask of its `valid` rows, the pooled CLIP
vector, timestep t (sigma x 1000) and guidance g x 1000.

    python hunyuan_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
INPUTS holds latents [C, F, H, W], prompt_embeds [T, text_embed_dim], valid [1] (the real
rows, first), pooled [pooled_projection_dim], timestep [1], guidance [1] (the scale) (f32).
Prints one JSON line: {"step_s": best seconds of REPS after WARMUP (default 1) untimed runs, "torch": version,
"threads": n, "peak_rss_mib": this process's peak RSS}.
Writes the output tensor [Cout, F, H, W] to OUT.safetensors (as "out") so the bench can
compare it with difflet's.
"""
import json
import os
import resource
import sys
import time

import torch
from diffusers import HunyuanVideoTransformer3DModel
from safetensors.torch import load_file, save_file


def main():
    model_dir, inputs, out_path, threads, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    dt = torch.float32 if len(sys.argv) > 6 and sys.argv[6] == "f32" else torch.bfloat16
    warm = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    torch.set_num_threads(threads)
    x = load_file(inputs)
    tr = HunyuanVideoTransformer3DModel.from_pretrained(os.path.join(model_dir, "transformer"), torch_dtype=dt).eval()
    lat = x["latents"].to(dt)[None]
    txt = x["prompt_embeds"].to(dt)[None]
    mask = torch.zeros(1, txt.shape[1], dtype=dt)  # the pipeline's prompt_attention_mask, cast to the model's dtype
    mask[:, :int(x["valid"][0])] = 1
    pooled = x["pooled"].to(dt)[None]
    t = torch.tensor([float(x["timestep"][0])])  # f32, as the pipeline passes it
    g = torch.tensor([float(x["guidance"][0])], dtype=dt) * 1000.0
    best = float("inf")
    with torch.inference_mode():
        for i in range(warm + reps):
            t0 = time.perf_counter()
            out = tr(hidden_states=lat, timestep=t, encoder_hidden_states=txt, encoder_attention_mask=mask,
                     pooled_projections=pooled, guidance=g, return_dict=False)[0]
            el = time.perf_counter() - t0
            if i >= warm:  # the first calls warm up
                best = min(best, el)
    save_file({"out": out[0].float().contiguous()}, out_path)
    print(json.dumps({"step_s": best, "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


if __name__ == "__main__":
    main()
