"""After training: the held-out evaluation prompts and a diffusers parity vector for
difflet-tiny-video (run with the tools virtualenv from the repository root).

    tools/venv/bin/python tools/tiny_video/export_eval.py --model models/difflet-tiny-video
Writes:
  <model>/eval_prompts.json   size, frames, colour table, motions, and 96 held-out
                              scenes with a caption each (combinations never seen in
                              training)
  <model>/validation_prompts.json  the same for 96 training scenes (seen in training,
                              the captions fresh): for choosing sampling defaults such
                              as the guidance scale without looking at the held-out
                              prompts (`difflet eval-tiny-video --prompts-file`)
  tests/data/tiny_video/parity.safetensors  WanPipeline (diffusers) on the model: fixed
                              initial latents, 8 steps, guidance 5 with an empty negative
                              prompt, 32 text tokens; the frames as floats in [0, 1]
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
import scenes  # noqa: E402  (tools/tiny_video/scenes.py)
from diffusers import WanPipeline  # noqa: E402

PARITY_PROMPT = "a large red circle moving from left to right on a blue background"


def write_prompts(path, scene_list, rng):
    prompts = []
    for i, sc in enumerate(scene_list):
        shape, colour, bg, motion, size = sc
        prompts.append({"caption": scenes.caption(sc, rng, template=i % len(scenes.TEMPLATES)), "shape": shape,
                        "colour": colour, "background": bg, "motion": motion, "size": size})
    out = {"size": scenes.SIZE, "frames": scenes.FRAMES, "fps": scenes.FPS,
           "colours": {k: list(v) for k, v in scenes.COLOURS.items()}, "motions": scenes.MOTIONS, "prompts": prompts}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/difflet-tiny-video")
    ap.add_argument("--vectors", default="tests/data/tiny_video")
    args = ap.parse_args()
    train, heldout = scenes.split()
    write_prompts(os.path.join(args.model, "eval_prompts.json"), heldout, random.Random(99))
    write_prompts(os.path.join(args.model, "validation_prompts.json"), random.Random(7).sample(train, 96),
                  random.Random(98))
    torch.set_num_threads(2)
    pipe = WanPipeline.from_pretrained(args.model, torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    lf = (scenes.FRAMES - 1) // 4 + 1
    init = torch.randn(1, 16, lf, scenes.SIZE // 4, scenes.SIZE // 4, generator=g)
    video = pipe(prompt=PARITY_PROMPT, negative_prompt="", height=scenes.SIZE, width=scenes.SIZE,
                 num_frames=scenes.FRAMES, num_inference_steps=8, guidance_scale=5.0, latents=init.clone(),
                 max_sequence_length=32, output_type="np").frames[0]
    os.makedirs(args.vectors, exist_ok=True)
    save_file({"latents": init.contiguous(), "video": torch.from_numpy(np.ascontiguousarray(video)).float()},
              os.path.join(args.vectors, "parity.safetensors"), metadata={"prompt": PARITY_PROMPT})
    print("wrote", os.path.join(args.model, "eval_prompts.json"), "and", args.vectors)


if __name__ == "__main__":
    main()
