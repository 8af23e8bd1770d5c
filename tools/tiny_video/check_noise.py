"""At which noise level a difflet-tiny-video transformer loses a clip's motion: fresh
training clips of moving shapes (jittered as in training) are encoded, noised to level
s0 (x = (1 - s0) z + s0 n, the flow-matching path), and sampled back to s = 0 from
there with the clip's caption (Euler on Wan's shifted sigmas, 20 steps over the whole
range, classifier-free guidance); the evaluation's pixel reader (reader.py) reads the
decoded clips. s0 = 1 is ordinary generation; where the rates fall between two levels is
where the transformer fails to lay the clip out.

    tools/venv/bin/python tools/tiny_video/check_noise.py --model models/difflet-tiny-video

--mean-prediction S,...: instead, where the transformer puts the shape when it has to
guess: for one moving clip per direction, the clean-clip prediction x0 = x - s v at
level s averaged over 32 noises, decoded, and the centroid of its difference from each
frame's median colour printed frame by frame. At s = 1 (no trace of the clip) a model
that knew where the track starts would draw it there; Wan's transformer has no absolute
position signal (3-D RoPE is relative, the patch embedding has no padding), so it can
only put the shape where the noise suggests it, and the average sits mid-frame.
"""
import argparse
import os
import random
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reader  # noqa: E402
import scenes  # noqa: E402
from train import latent_stats, render_batch, tokenize  # noqa: E402  (tools/tiny_video/train.py)
from diffusers import WanPipeline  # noqa: E402


def embed(pipe, caps):
    enc = tokenize(pipe.tokenizer, caps)
    hidden = pipe.text_encoder(enc.input_ids, enc.attention_mask).last_hidden_state
    return hidden * enc.attention_mask[..., None]  # zero past the prompt, as WanPipeline pads it


def mean_prediction(pipe, levels, seed, n=32):
    vae, tr = pipe.vae, pipe.transformer
    mean, std = latent_stats(vae)
    rng = random.Random(seed)
    train, _ = scenes.split()
    for motion in scenes.MOTIONS[:4]:
        scene = rng.choice([s for s in train if s[3] == motion])
        cap = scenes.caption(scene, rng)
        with torch.no_grad():
            z = (vae.encode(render_batch([scene], rng)).latent_dist.mean - mean) / std
            cond = embed(pipe, [cap] * n)
            noise = torch.randn((n,) + tuple(z.shape[1:]), generator=torch.Generator().manual_seed(seed))
            for s in levels:
                xt = (1 - s) * z + s * noise
                v = tr(hidden_states=xt, timestep=torch.full((n,), s * 1000), encoder_hidden_states=cond,
                       return_dict=False)[0]
                x0 = (xt - s * v).mean(0, keepdim=True)
                img = vae.decode(x0 * std + mean).sample[0].permute(1, 2, 3, 0).numpy()  # F, H, W, 3
                d = abs(img - np.median(img.reshape(img.shape[0], -1, 3), axis=1)[:, None, None]).sum(-1)
                ys, xs = np.mgrid[0:d.shape[1], 0:d.shape[2]]
                track = [f"({(w * xs).sum() / w.sum():.0f},{(w * ys).sum() / w.sum():.0f})" for w in d]
                print(f"{motion:>13} s = {s:.2f}: {' '.join(track)}   \"{cap}\"", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/difflet-tiny-video")
    ap.add_argument("--clips", type=int, default=40, help="moving-shape clips")
    ap.add_argument("--levels", default="0.3,0.5,0.7,0.85,0.95,1.0")
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--mean-prediction", metavar="S,...", help="levels for the mean-prediction check (see above)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    pipe = WanPipeline.from_pretrained(args.model, torch_dtype=torch.float32)
    if args.mean_prediction:
        return mean_prediction(pipe, [float(v) for v in args.mean_prediction.split(",")], args.seed)
    vae, tr = pipe.vae, pipe.transformer
    shift = pipe.scheduler.config.flow_shift
    train, _ = scenes.split()
    rng = random.Random(args.seed)
    batch = []
    while len(batch) < args.clips:
        s = rng.choice(train)
        if s[3] != "still":
            batch.append(s)
    x = render_batch(batch, rng)
    mean, std = latent_stats(vae)
    full = torch.linspace(1, 0, 21)
    full = (shift * full / (1 + (shift - 1) * full)).tolist()
    print(f"{args.model}: {len(batch)} moving clips, guidance {args.guidance}, flow shift {shift}")
    with torch.no_grad():
        z = (vae.encode(x).latent_dist.mean - mean) / std
        cond = embed(pipe, [scenes.caption(s, rng) for s in batch])
        unc = embed(pipe, [""] * len(batch))
        noise = torch.randn(z.shape, generator=torch.Generator().manual_seed(args.seed))
        for s0 in (float(v) for v in args.levels.split(",")):
            sig = [s0] + [s for s in full if s < s0 - 1e-6]
            xt = (1 - s0) * z + s0 * noise
            for a, b in zip(sig[:-1], sig[1:]):
                t = torch.full((len(batch),), a * 1000)
                vc = tr(hidden_states=xt, timestep=t, encoder_hidden_states=cond, return_dict=False)[0]
                vu = tr(hidden_states=xt, timestep=t, encoder_hidden_states=unc, return_dict=False)[0]
                xt = xt + (b - a) * (vu + args.guidance * (vc - vu))
            out = vae.decode(xt * std + mean).sample
            clips = ((out.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 4, 1).numpy()
            bg, fg, motion = reader.score(clips, batch)
            print(f"from s0 = {s0:.2f}: background {bg:.0%}, shape colour {fg:.0%}, motion {motion:.0%}", flush=True)


if __name__ == "__main__":
    main()
