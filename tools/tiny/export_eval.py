"""After training: the held-out evaluation prompts and a diffusers parity vector for
difflet-tiny (run with the tools virtualenv from the repository root).

    tools/venv/bin/python tools/tiny/export_eval.py --model models/difflet-tiny
Writes:
  <model>/eval_prompts.json   colour table, positions, and 96 held-out scenes with a
                              caption each (combinations never seen in training)
  tests/data/tiny/parity.safetensors  FluxPipeline (diffusers) on difflet-tiny: fixed
                              initial latents, 8 steps, true CFG 3 with an empty negative
                              prompt, the image as floats in [0, 1]
"""
import argparse
import json
import os
import random
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scenes  # noqa: E402
from diffusers import FluxPipeline  # noqa: E402

PARITY_PROMPT = "a large red circle in the top left on a blue background"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/difflet-tiny")
    ap.add_argument("--vectors", default="tests/data/tiny")
    args = ap.parse_args()
    _, heldout = scenes.split()
    rng = random.Random(99)
    prompts = []
    for i, sc in enumerate(heldout):
        shape, colour, bg, pos, size = sc
        prompts.append({"caption": scenes.caption(sc, rng, template=i % len(scenes.TEMPLATES)), "shape": shape,
                        "colour": colour, "background": bg, "position": pos, "size": size})
    out = {"size": scenes.SIZE, "colours": {k: list(v) for k, v in scenes.COLOURS.items()},
           "positions": {k: list(v) for k, v in scenes.POSITIONS.items()}, "prompts": prompts}
    with open(os.path.join(args.model, "eval_prompts.json"), "w") as f:
        json.dump(out, f, indent=1)
    torch.set_num_threads(2)
    pipe = FluxPipeline.from_pretrained(args.model, torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    init = torch.randn(1, 64, 16, generator=g)
    img = pipe(prompt=PARITY_PROMPT, negative_prompt="", true_cfg_scale=3.0, height=64, width=64, num_inference_steps=8,
               latents=init.clone(), max_sequence_length=32, output_type="np").images[0]
    os.makedirs(args.vectors, exist_ok=True)
    save_file({"latents": init[0].contiguous(), "image": torch.from_numpy(np.ascontiguousarray(img)).float()},
              os.path.join(args.vectors, "parity.safetensors"), metadata={"prompt": PARITY_PROMPT})
    print("wrote", os.path.join(args.model, "eval_prompts.json"), "and", args.vectors)


if __name__ == "__main__":
    main()
