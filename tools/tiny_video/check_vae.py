"""How well a difflet-tiny-video VAE carries what the evaluation reads: whole clips
(fresh training scenes, jittered as in training) through encode (posterior mean) and
decode, then the evaluation's pixel reader (reader.py) on the reconstructions. The
reader's rates on reconstructions bound what any transformer on this VAE can reach.

    tools/venv/bin/python tools/tiny_video/check_vae.py --vae models/difflet-tiny-video/vae
"""
import argparse
import json
import os
import random
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reader  # noqa: E402
import scenes  # noqa: E402
from diffusers import AutoencoderKLWan  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vae", default="models/difflet-tiny-video/vae")
    ap.add_argument("--clips", type=int, default=96)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    vae = AutoencoderKLWan.from_pretrained(args.vae).eval()
    train, _ = scenes.split()
    rng = random.Random(args.seed)
    picked = [rng.choice(train) for _ in range(args.clips)]
    clips = np.stack([scenes.render(s, jitter=rng) for s in picked])
    x = torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    with torch.no_grad():
        rec = torch.cat([vae.decode(vae.encode(x[i:i + 8]).latent_dist.mean).sample for i in range(0, len(x), 8)])
    rec = rec.clamp(-1, 1)
    bg = np.asarray([scenes.COLOURS[s[2]] for s in picked], np.uint8)[:, None, None, None, :]
    on = torch.from_numpy((clips != bg).any(-1))[:, None].expand_as(x)
    err = (rec - x) ** 2
    u8 = ((rec + 1) * 127.5).round().clamp(0, 255).byte().permute(0, 2, 3, 4, 1).numpy()
    rates = reader.score(u8, picked)
    print(json.dumps({"vae": args.vae, "clips": len(picked), "mse": round(err.mean().item(), 5),
                      "mse_on_shape": round(err[on].mean().item(), 5), "read_background": round(float(rates[0]), 3),
                      "read_shape_colour": round(float(rates[1]), 3), "read_motion": round(float(rates[2]), 3)}))


if __name__ == "__main__":
    main()
