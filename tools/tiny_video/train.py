"""Train difflet-tiny-video: a Wan 2.1-architecture text-to-video pipeline small enough
to train on a 2-core CPU, saved in the ordinary diffusers layout (WanPipeline).

    tools/venv/bin/python tools/tiny_video/train.py --out models/difflet-tiny-video

Phases (fixed seeds, progress logged to stdout):
  1. a SentencePiece Unigram tokenizer trained on the caption corpus (T5-style, as
     UMT5's; tools/parity/make_tokenizer_vectors.py's recipe);
  2. a tiny causal 3-D AutoencoderKLWan (64x64x9 RGB <-> 16x16x3 x 16: 4x spatial, 4x
     temporal) trained on the clips; latents_mean / latents_std per channel from the
     latent statistics, as Wan's VAE carries them;
  3. a tiny UMT5EncoderModel and WanTransformer3DModel trained jointly with the
     flow-matching objective (x_t = (1-s) x0 + s noise, target noise - x0, timestep
     1000 s, s logit-normal then shifted as the sampler shifts it; --motion-loss adds the
     squared frame-to-frame difference of the error, as the shipped model was trained),
     10% empty captions so classifier-free guidance works; the text embedding is masked
     past the prompt's tokens as WanPipeline pads it;
  4. the VAE's decoder alone on whole clips, the encoder frozen (the latents the
     transformer learned keep their meaning): the clip phase leaves each 4-frame
     chunk's last frame lagging, which a few minutes here fix;
  5. WanPipeline.save_pretrained(out) with UniPCMultistepScheduler as Wan configures
     it, written again (with training_log.json) at every checkpoint (every 10 minutes).
--vae-minutes, --minutes and --decoder-minutes bound phases 2, 3 and 4. The shipped
model was trained in two steps that split these phases (models/difflet-tiny-video/README.md):
--vae-only runs phases 1, 2 and 4 (tokenizer, VAE, decoder); --vae-from DIR takes
those and runs phase 3 (with --decoder-minutes 0).
The VAE starts as a per-frame autoencoder (frame_by_frame_init), trains on single
frames, then on clips; training decodes without diffusers' final clamp to [-1, 1].
"""
import argparse
import contextlib
import json
import math
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
import scenes  # noqa: E402  (tools/tiny_video/scenes.py)
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel  # noqa: E402
from transformers import T5TokenizerFast, UMT5Config, UMT5EncoderModel  # noqa: E402

TEXT_LEN = 32  # text tokens the transformer sees (difflet.json's max_sequence_length)
FLOW_SHIFT = 3.0
Z = 16


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_tokenizer(out, train, seed):
    import make_tokenizer_vectors as mtv
    rng = random.Random(seed)
    corpus = [scenes.caption(rng.choice(train), rng) for _ in range(6000)]
    path = os.path.join(out, "tokenizer")
    mtv.train_t5_tiny(corpus, path)
    tok = T5TokenizerFast.from_pretrained(path, model_max_length=TEXT_LEN)
    tok.save_pretrained(path)
    return tok


def render_batch(batch, rng):
    """[B, 3, F, 64, 64] in [-1, 1]"""
    clips = np.stack([scenes.render(s, jitter=rng) for s in batch])
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def new_vae(mean=None, std=None):
    return AutoencoderKLWan(base_dim=16, z_dim=Z, dim_mult=[1, 2, 2], num_res_blocks=1, attn_scales=[],
                            temperal_downsample=[True, True], dropout=0.0,
                            latents_mean=mean or [0.0] * Z, latents_std=std or [1.0] * Z,
                            scale_factor_temporal=4, scale_factor_spatial=4)


def crops(x, size, rng):
    """a random size x size window of each clip (the VAE is convolutional: it trains on
    windows four times cheaper than whole clips and runs on whole ones)"""
    if size >= x.shape[-1]:
        return x
    out = []
    for c in x:
        oy, ox = rng.randint(0, x.shape[-2] - size), rng.randint(0, x.shape[-1] - size)
        out.append(c[..., oy:oy + size, ox:ox + size])
    return torch.stack(out)


def optimizer_step(opt, params, loss, lr):
    """one AdamW step at learning rate lr, gradients clipped to norm 1"""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def decode_unclamped(vae, z):
    """AutoencoderKLWan._decode without its final clamp to [-1, 1], for training: most
    of the palette sits at +-1, and an output clamped on the wrong side of it gets no
    gradient (the first VAE of this model learned slowly and stalled so)."""
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    out = []
    for i in range(z.shape[2]):
        vae._conv_idx = [0]
        out.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=i == 0))
    vae.clear_cache()
    return torch.cat(out, 2)


def frame_by_frame_init(vae):
    """Start the VAE as a per-frame (2-D) autoencoder: every causal 3-D convolution sees
    only its current frame (the taps on earlier frames zero), the encoder's temporal
    downsampling keeps the later frame of each pair and the decoder's temporal upsampling
    repeats each frame. The image phase trains the spatial path on single frames (where
    the zero taps get no gradient and stay zero); the clip phase then learns time from a
    start that already reconstructs still clips."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanResample
    time_convs = set()
    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, WanResample) and hasattr(m, "time_conv"):
                w = m.time_conv.weight  # [out, in, 3, 1, 1]; out = in (down) or 2 in (up: two frames)
                w.zero_()
                m.time_conv.bias.zero_()
                c = w.shape[1]
                for o in range(0, w.shape[0], c):
                    w[o:o + c, :, -1, 0, 0] = torch.eye(c)
                time_convs.add(id(m.time_conv))
        for m in vae.modules():
            if isinstance(m, WanCausalConv3d) and id(m) not in time_convs and m.weight.shape[2] > 1:
                m.weight[:, :, :-1] = 0


def train_vae(train, minutes, seed, batch, crop, frames, lr, image_minutes, fg_weight):
    """image_minutes on single whole frames, then the rest of `minutes` on clips' first
    `frames` frames (1 + 4k: the first frame alone, then chunks of four, as the causal
    VAE sees any clip) in crop x crop windows. Loss: squared error, the shape's pixels
    weighted 1 + fg_weight (the background is most of every frame and easy), plus 1e-6 KL."""
    torch.manual_seed(seed)
    vae = new_vae()
    frame_by_frame_init(vae)
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    t0, step, ema, history = time.time(), 0, None, []
    while time.time() - t0 < minutes * 60:
        image = time.time() - t0 < image_minutes * 60
        x = render_batch([rng.choice(train) for _ in range(batch)], rng)
        if image:
            f = rng.randrange(x.shape[2])
            x = x[:, :, f:f + 1]
        else:
            x = crops(x[:, :, :frames], crop, rng)
        shape = ((x - x[..., :1, :1]).abs().sum(1, keepdim=True) > 0).float()  # the corner is always background
        post = vae.encode(x).latent_dist
        rec = decode_unclamped(vae, post.sample())
        kl = post.kl().mean()
        se = (rec - x) ** 2
        mse = se.mean()
        loss = (se * (1 + fg_weight * shape)).mean() + 1e-6 * kl
        optimizer_step(opt, list(vae.parameters()), loss, lr * min(1.0, (step + 1) / 50))
        step += 1
        ema = mse.item() if ema is None else 0.95 * ema + 0.05 * mse.item()
        if step % 20 == 0:
            log(f"vae step {step} ({'frames' if image else 'clips'}): mse {ema:.5f} kl {kl.item():.1f} "
                f"{(time.time() - t0) / step:.2f} s/step")
            history.append({"step": step, "phase": "frames" if image else "clips", "mse": round(ema, 5),
                            "seconds": round(time.time() - t0, 1)})
    vae.eval()
    with torch.no_grad():
        x = render_batch([rng.choice(train) for _ in range(16)], rng)
        full = F.mse_loss(vae.decode(vae.encode(x).latent_dist.mean).sample, x).item()
        log(f"vae: whole-clip reconstruction mse {full:.5f} (16 fresh clips)")
        zs = torch.cat([vae.encode(render_batch([rng.choice(train) for _ in range(16)], rng)).latent_dist.mean
                        for _ in range(8)])
    mean = zs.mean(dim=(0, 2, 3, 4)).tolist()
    std = zs.std(dim=(0, 2, 3, 4)).tolist()
    vae.register_to_config(latents_mean=[round(v, 5) for v in mean], latents_std=[round(v, 5) for v in std])
    log(f"vae done after {step} steps: mse {ema:.5f}; latent means {min(mean):.3f}..{max(mean):.3f}, "
        f"stds {min(std):.3f}..{max(std):.3f}")
    return vae, step, ema, full, history


def finetune_decoder(vae, train, minutes, seed, batch, lr, fg_weight):
    """The decoder alone on whole clips, the encoder frozen: its latents (what the
    transformer learned to make) keep their meaning, the pixels made from them get
    better. The clip phase of train_vae leaves each chunk's last frame lagging behind
    the shape's track (a centroid that steps back); this phase is where it is fixed."""
    torch.manual_seed(seed)
    vae.train()
    vae.requires_grad_(False)
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    t0, step, ema, history = time.time(), 0, None, []
    budget = minutes * 60
    while time.time() - t0 < budget:
        x = render_batch([rng.choice(train) for _ in range(batch)], rng)
        shape = ((x - x[..., :1, :1]).abs().sum(1, keepdim=True) > 0).float()
        with torch.no_grad():
            z = vae.encode(x).latent_dist.sample()
        se = (decode_unclamped(vae, z) - x) ** 2
        mse = se.mean()
        loss = (se * (1 + fg_weight * shape)).mean()
        frac = min((time.time() - t0) / budget, 1.0)
        optimizer_step(opt, params, loss, lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * frac)))
        step += 1
        ema = mse.item() if ema is None else 0.95 * ema + 0.05 * mse.item()
        if step % 10 == 0:
            log(f"decoder step {step}: mse {ema:.5f} {(time.time() - t0) / step:.2f} s/step")
            history.append({"step": step, "mse": round(ema, 5), "seconds": round(time.time() - t0, 1)})
    vae.eval()
    vae.requires_grad_(False)
    return step, ema, history


def latent_stats(vae):
    """the VAE's per-channel latents_mean and latents_std, shaped to broadcast over
    [B, Z, F, H, W] latents: WanPipeline hands the decoder z * std + mean"""
    return (torch.tensor(vae.config.latents_mean).view(1, Z, 1, 1, 1),
            torch.tensor(vae.config.latents_std).view(1, Z, 1, 1, 1))


def tokenize(tok, captions):
    """captions as WanPipeline tokenizes them: TEXT_LEN tokens, padded, with the mask"""
    return tok(captions, padding="max_length", max_length=TEXT_LEN, truncation=True, add_special_tokens=True,
               return_attention_mask=True, return_tensors="pt")


def encode_latents(vae, train, n, seed):
    """n (scene, latent) training pairs, latents normalised as WanPipeline expects them
    before the decoder: (z - mean) / std."""
    rng = random.Random(seed)
    mean, std = latent_stats(vae)
    picked, lats = [], []
    t0 = time.time()
    with torch.no_grad():
        for i in range(0, n, 32):
            b = [rng.choice(train) for _ in range(min(32, n - i))]
            z = vae.encode(render_batch(b, rng)).latent_dist.mean
            lats.append((z - mean) / std)
            picked += b
            if (i // 32) % 40 == 0:
                log(f"encoded {i + len(b)}/{n} clips ({time.time() - t0:.0f} s)")
    return picked, torch.cat(lats)


def scheduler():
    return UniPCMultistepScheduler(beta_end=0.02, beta_schedule="linear", beta_start=0.0001, disable_corrector=[],
                                   dynamic_thresholding_ratio=0.995, final_sigmas_type="zero", lower_order_final=True,
                                   num_train_timesteps=1000, predict_x0=True, prediction_type="flow_prediction",
                                   rescale_betas_zero_snr=False, sample_max_value=1.0, solver_order=2, solver_p=None,
                                   solver_type="bh2", steps_offset=0, thresholding=False, timestep_spacing="linspace",
                                   trained_betas=None, use_beta_sigmas=False, use_exponential_sigmas=False,
                                   use_flow_sigmas=True, use_karras_sigmas=False, flow_shift=FLOW_SHIFT)


DEFAULTS = {"max_sequence_length": TEXT_LEN, "height": scenes.SIZE, "width": scenes.SIZE,
            "num_frames": scenes.FRAMES, "fps": scenes.FPS, "num_inference_steps": 20,
            "guidance_scale": 3.0}  # chosen on validation_prompts.json (README), never on the held-out prompts


def save(out, vae, te, tok, tr):
    pipe = WanPipeline(tokenizer=tok, text_encoder=te, vae=vae, scheduler=scheduler(), transformer=tr)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp)
    with open(os.path.join(tmp, "difflet.json"), "w") as f:
        json.dump({"_comment": "Generation defaults difflet uses for this model where the request gives none. "
                   "diffusers' WanPipeline defaults to 480x832, 81 frames and 512 text tokens; this model was "
                   f"trained on {scenes.SIZE}x{scenes.SIZE}, {scenes.FRAMES} frames at {scenes.FPS} fps, "
                   f"{TEXT_LEN} text tokens (pass these to diffusers).", "defaults": DEFAULTS}, f, indent=2)
        f.write("\n")
    for f in ("README.md", "training_log.json", "eval_prompts.json", "validation_prompts.json"):  # keep what the folder already documents
        if os.path.exists(os.path.join(out, f)):
            shutil.copy(os.path.join(out, f), tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/difflet-tiny-video")
    ap.add_argument("--minutes", type=float, default=60, help="wall-clock budget of the joint training phase")
    ap.add_argument("--vae-minutes", type=float, default=15)
    ap.add_argument("--vae-image-minutes", type=float, default=3.5, help="of --vae-minutes, on single frames first")
    ap.add_argument("--vae-fg-weight", type=float, default=4.0)
    ap.add_argument("--vae-batch", type=int, default=8)
    ap.add_argument("--vae-crop", type=int, default=32, help="VAE training window (pixels)")
    ap.add_argument("--vae-frames", type=int, default=9, help="VAE training clip length (1 + 4k frames)")
    ap.add_argument("--vae-lr", type=float, default=1e-3)
    ap.add_argument("--vae-only", action="store_true", help="stop after the tokenizer, the VAE and the decoder phase "
                    "(OUT/tokenizer, OUT/vae, OUT/training_log.json): what --vae-from takes")
    ap.add_argument("--clips", type=int, default=10000, help="clips encoded for the joint phase")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--decoder-minutes", type=float, default=7, help="phase 4: the VAE decoder on whole clips")
    ap.add_argument("--decoder-batch", type=int, default=4)
    ap.add_argument("--decoder-lr", type=float, default=5e-4)
    ap.add_argument("--finetune-decoder", metavar="DIR", help="run phase 4 alone on a saved pipeline, save to --out")
    ap.add_argument("--probe", action="store_true", help="time a few steps of each phase and stop")
    ap.add_argument("--aux-text-weight", type=float, default=0.1,
                    help="weight of the text encoder's auxiliary loss (AuxHead; 0: none)")
    ap.add_argument("--text-minutes", type=float, default=3,
                    help="phase 3a, at most: the text encoder alone on the auxiliary loss (with --aux-text-weight)")
    ap.add_argument("--high-noise", type=float, default=0.0,
                    help="share of each batch whose noise level is drawn uniformly from [--high-noise-from, 1] instead")
    ap.add_argument("--high-noise-from", type=float, default=0.85)
    ap.add_argument("--motion-loss", type=float, default=0.0, metavar="BETA",
                    help="add BETA x the squared error of the prediction's frame-to-frame differences (the motion)")
    ap.add_argument("--bf16", action="store_true", help="joint phase under torch.autocast bfloat16 (f32 weights)")
    ap.add_argument("--patch", default="1,2,2", help="the transformer's patch_size (frames, height, width)")
    ap.add_argument("--vae-from", metavar="DIR", help="take the tokenizer and VAE of a saved pipeline (phases 1-2 "
                    "skipped), train a new text encoder and transformer: for trying transformer settings")
    ap.add_argument("--layers", type=int, default=4, help="the transformer's blocks")
    ap.add_argument("--heads", type=int, default=4, help="the transformer's attention heads")
    ap.add_argument("--head-dim", type=int, default=32, help="per head; Wan's 3-D RoPE splits it into frame, row "
                    "and column parts (2 * (head_dim // 6) each for rows and columns)")
    ap.add_argument("--centre-start", action="store_true", help="clips whose moving shapes all start near the "
                    "middle (scenes.CENTRE_START): the start no longer gives the direction away")
    ap.add_argument("--centre-track", type=int, default=scenes.CENTRE_TRACK, metavar="PX",
                    help="with --centre-start: how far a moving shape travels (scenes.CENTRE_TRACK)")
    ap.add_argument("--centre-jitter", type=int, default=scenes.CENTRE_JITTER, metavar="PX",
                    help="with --centre-start: the start is 32 +- this (scenes.CENTRE_JITTER)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--ema", type=float, default=0.0, metavar="DECAY",
                    help="also keep an exponential moving average of the text encoder and transformer weights "
                         "(e.g. 0.999) and save that pipeline to --ema-out")
    ap.add_argument("--ema-out", metavar="DIR", help="where the EMA pipeline goes (default: --out with -ema appended)")
    ap.add_argument("--resume", help="a saved pipeline folder: continue training its text encoder and transformer "
                    "(its tokenizer and VAE are kept; phases 1-2 are skipped)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    scenes.CENTRE_START = args.centre_start
    scenes.CENTRE_TRACK, scenes.CENTRE_JITTER = args.centre_track, args.centre_jitter
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    train, heldout = scenes.split()
    log(f"{len(train)} training scenes, {len(heldout)} held out")
    if args.resume:
        resume(args)
        return
    if args.finetune_decoder:
        finetune_only(args)
        return
    if args.vae_from:
        tok = T5TokenizerFast.from_pretrained(os.path.join(args.vae_from, "tokenizer"))
        vae = AutoencoderKLWan.from_pretrained(os.path.join(args.vae_from, "vae")).eval()
        vae_info = {"vae_from": args.vae_from}
        log(f"tokenizer and VAE from {args.vae_from}")
    else:
        tok = make_tokenizer(args.out, train, args.seed)
        log(f"tokenizer: Unigram {len(tok)} pieces")
        vae, vae_steps, vae_mse, vae_full, vae_history = train_vae(
            train, 0.5 if args.probe else args.vae_minutes, args.seed, args.vae_batch, args.vae_crop,
            args.vae_frames, args.vae_lr, 0.25 if args.probe else args.vae_image_minutes, args.vae_fg_weight)
        vae_info = {"vae_steps": vae_steps, "vae_batch": args.vae_batch, "vae_crop": args.vae_crop,
                    "vae_frames": args.vae_frames, "vae_lr": args.vae_lr, "vae_mse": vae_mse,
                    "vae_image_minutes": args.vae_image_minutes, "vae_fg_weight": args.vae_fg_weight,
                    "vae_whole_clip_mse": vae_full, "vae_history": vae_history}
    if args.vae_only:  # phases 1, 2 and 4: a tokenizer and VAE for --vae-from
        if args.decoder_minutes > 0:
            vae_info["decoder"] = decoder_phase(args, vae, train, 0.25 if args.probe else args.decoder_minutes)
        vae.save_pretrained(os.path.join(args.out, "vae"))
        write_log(args, vae_info, t_start)
        return
    vae.requires_grad_(False)
    pairs, lats = encode_latents(vae, train, 64 if args.probe else args.clips, args.seed + 1)
    log(f"encoded {len(pairs)} training latents {tuple(lats.shape)}")

    torch.manual_seed(args.seed)
    te = UMT5EncoderModel(UMT5Config(vocab_size=len(tok), d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2,
                                     relative_attention_num_buckets=32, relative_attention_max_distance=128,
                                     feed_forward_proj="gated-gelu", dropout_rate=0.0, layer_norm_epsilon=1e-6,
                                     pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    patch = tuple(int(v) for v in args.patch.split(","))
    tr = WanTransformer3DModel(patch_size=patch, num_attention_heads=args.heads, attention_head_dim=args.head_dim,
                               in_channels=Z, out_channels=Z, text_dim=64, freq_dim=64, ffn_dim=256,
                               num_layers=args.layers,
                               cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=256)
    joint(args, tok, vae, te, tr, pairs, lats, t_start, {**vae_info, "patch": list(patch)})


def resume(args):
    """continue from a saved pipeline: same tokenizer and VAE, the text encoder and
    transformer trained further (a new warm-up and cosine decay over --minutes)"""
    t_start = time.time()
    train, _ = scenes.split()
    tok = T5TokenizerFast.from_pretrained(os.path.join(args.resume, "tokenizer"))
    vae = AutoencoderKLWan.from_pretrained(os.path.join(args.resume, "vae")).eval()
    vae.requires_grad_(False)
    te = UMT5EncoderModel.from_pretrained(os.path.join(args.resume, "text_encoder"))
    tr = WanTransformer3DModel.from_pretrained(os.path.join(args.resume, "transformer"))
    te.train(), tr.train()
    log(f"resumed from {args.resume}")
    pairs, lats = encode_latents(vae, train, 64 if args.probe else args.clips, args.seed + 3)
    joint(args, tok, vae, te, tr, pairs, lats, t_start, {"resumed_from": args.resume})


class AuxHead(torch.nn.Module):
    """Training only, not saved: from the text encoder's mean output over the prompt's
    tokens, logits for the scene's background, shape colour, shape, size and motion.
    Its cross-entropy teaches the text encoder, from the first steps, which colour word
    belongs to the background and which to the shape (the flow-matching loss alone
    taught it slowly: the first models swapped them in 40 % of clips)."""
    FIELDS = [("bg", list(scenes.COLOURS)), ("colour", list(scenes.COLOURS)), ("shape", list(scenes.SHAPES)),
              ("size", list(scenes.SIZES)), ("motion", scenes.MOTIONS)]

    def __init__(self, dim):
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(dim, len(v)) for _, v in self.FIELDS)

    def loss(self, emb, mask, batch):
        keep = torch.tensor([s is not None for s in batch])
        if not keep.any():
            return emb.sum() * 0
        pooled = (emb * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        total = 0
        for (name, values), head in zip(self.FIELDS, self.heads):
            shape, colour, bg, motion, size = range(5)
            at = {"bg": bg, "colour": colour, "shape": shape, "size": size, "motion": motion}[name]
            target = torch.tensor([values.index(s[at]) if s is not None else 0 for s in batch])
            total = total + F.cross_entropy(head(pooled)[keep], target[keep])
        return total


def pretrain_text(te, aux, tok, train, minutes, seed, lr=1e-3, batch=64):
    """Phase 3a: the text encoder alone on AuxHead's objective, captions only (cheap:
    no latents). It learns which colour is the background's in under a minute (a sudden
    drop of the loss after ~700 steps); the joint phase then starts from a text encoder
    that already says so, and the auxiliary loss keeps it saying so."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = list(te.parameters()) + list(aux.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    t0, step, ema = time.time(), 0, None
    while time.time() - t0 < minutes * 60:
        b = [rng.choice(train) for _ in range(batch)]
        enc = tokenize(tok, [scenes.caption(x, rng) for x in b])
        loss = aux.loss(te(enc.input_ids, enc.attention_mask).last_hidden_state, enc.attention_mask, b)
        optimizer_step(opt, params, loss, lr * min(1.0, (step + 1) / 50))
        step += 1
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if step % 100 == 0:
            log(f"text step {step}: auxiliary loss {ema:.4f}")
        if ema < 0.01:  # learned: every field right with a margin
            break
    log(f"text encoder: {step} steps in {(time.time() - t0) / 60:.1f} min, auxiliary loss {ema:.4f}")
    return {"minutes": round((time.time() - t0) / 60, 2), "max_minutes": minutes, "steps": step, "batch": batch,
            "lr": lr, "aux_loss": ema}


class WeightAverage:
    """an exponential moving average of some parameters: update() after each optimizer step;
    `with swapped():` puts the averages in the model (and the trained weights back after)"""

    def __init__(self, params, decay):
        self.params, self.decay = params, decay
        self.avg = [p.detach().clone() for p in params]

    @torch.no_grad()
    def update(self):
        torch._foreach_mul_(self.avg, self.decay)
        torch._foreach_add_(self.avg, [p.detach() for p in self.params], alpha=1 - self.decay)

    @contextlib.contextmanager
    def swapped(self):
        keep = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, a in zip(self.params, self.avg):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, k in zip(self.params, keep):
                    p.copy_(k)


def motion_error(err):
    """The mean squared frame-to-frame difference of a prediction error [B, C, F, H, W]:
    the part of the error that is motion (a shape drawn in the wrong place in one latent
    frame but not the next). It is a fixed quadratic form of the error, so adding it keeps
    the conditional mean as the loss's minimiser (no bias, unlike weighting the shape's
    pixels); it only makes a wrong track cost more than the plain MSE, where a small
    shape's few latents hardly count."""
    return (err[:, :, 1:] - err[:, :, :-1]).square().mean()


def joint(args, tok, vae, te, tr, pairs, lats, t_start, info):
    """phase 3: the text encoder and transformer, flow matching, wall-clock budget"""
    os.makedirs(args.out, exist_ok=True)
    aux = AuxHead(te.config.d_model) if args.aux_text_weight > 0 else None
    if aux is not None and args.text_minutes > 0:
        info["text"] = pretrain_text(te, aux, tok, scenes.split()[0], 0.25 if args.probe else args.text_minutes,
                                     args.seed + 5)
    params = list(te.parameters()) + list(tr.parameters()) + (list(aux.parameters()) if aux else [])
    log(f"parameters: transformer {sum(p.numel() for p in tr.parameters())/1e6:.2f} M, "
        f"UMT5 {sum(p.numel() for p in te.parameters())/1e6:.2f} M, VAE {sum(p.numel() for p in vae.parameters())/1e6:.2f} M")
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    ema_w = WeightAverage(list(te.parameters()) + list(tr.parameters()), args.ema) if args.ema > 0 else None
    ema_out = args.ema_out or args.out.rstrip("/") + "-ema"
    rng = random.Random(args.seed + 2)
    history, step, t0 = [], 0, time.time()
    budget = (0.5 if args.probe else args.minutes) * 60
    last_save = time.time()
    ema = None
    while time.time() - t0 < budget:
        idx = [rng.randrange(len(pairs)) for _ in range(args.batch)]
        captioned = [rng.random() >= 0.1 for _ in idx]
        caps = [scenes.caption(pairs[i], rng) if c else "" for i, c in zip(idx, captioned)]
        enc = tokenize(tok, caps)
        mask = enc.attention_mask
        x0 = lats[idx]
        noise = torch.randn_like(x0)
        s = torch.sigmoid(torch.randn(args.batch))  # logit-normal, then the sampler's shift
        s = FLOW_SHIFT * s / (1 + (FLOW_SHIFT - 1) * s)
        if args.high_noise > 0:  # a share of the batch at the highest noise, where a clip's layout is decided
            hi = torch.rand(args.batch) < args.high_noise
            s = torch.where(hi, 1 - (1 - args.high_noise_from) * torch.rand(args.batch), s)
        sb = s.view(-1, 1, 1, 1, 1)
        xt = (1 - sb) * x0 + sb * noise
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            hidden = te(enc.input_ids, mask).last_hidden_state
            emb = hidden * mask[..., None]  # WanPipeline zero-pads past the prompt
            v = tr(hidden_states=xt, timestep=s * 1000, encoder_hidden_states=emb, return_dict=False)[0]
        err = v.float() - (noise - x0)
        loss = flow = err.square().mean()
        if args.motion_loss > 0:  # see motion_error
            loss = loss + args.motion_loss * motion_error(err)
        if aux is not None:
            aux_loss = aux.loss(hidden.float(), mask, [pairs[i] if c else None for i, c in zip(idx, captioned)])
            loss = loss + args.aux_text_weight * aux_loss
        frac = (time.time() - t0) / budget  # linear warm-up, then cosine decay over the time budget
        lr = args.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        optimizer_step(opt, params, loss, lr)
        if ema_w is not None:
            ema_w.update()
        step += 1
        ema = flow.item() if ema is None else 0.98 * ema + 0.02 * flow.item()
        if step % 25 == 0:
            el = time.time() - t0
            log(f"step {step}: loss {ema:.4f}" + (f" (aux {aux_loss.item():.3f})" if aux is not None else "") +
                f" lr {lr:.2e} {el / step:.3f} s/step")
            history.append({"step": step, "loss": round(ema, 5), "seconds": round(el, 1)})
        if not args.probe and time.time() - last_save > 600:  # a usable checkpoint every 10 minutes
            te.eval(), tr.eval()
            save(args.out, vae, te, tok, tr)
            if ema_w is not None:
                with ema_w.swapped():
                    save(ema_out, vae, te, tok, tr)
            te.train(), tr.train()
            last_save = time.time()
            write_log(args, {**info, "clips": len(pairs), "steps": step, "batch": args.batch, "lr": args.lr,
                             "minutes": args.minutes, "loss": ema, "history": history,
                             "checkpoint": "written at a 10-minute checkpoint of the joint phase"}, t_start, final=False)
            log(f"checkpoint saved at step {step}")
    te.eval(), tr.eval()
    info.update({"clips": len(pairs), "steps": step, "batch": args.batch, "lr": args.lr, "minutes": args.minutes,
                 "motion_loss": args.motion_loss,
                 "final_loss": ema, "history": history})
    if args.decoder_minutes > 0 and not args.probe:
        save(args.out, vae, te, tok, tr)  # the joint phase's result, should the decoder phase be stopped
        train, _ = scenes.split()
        info["decoder"] = decoder_phase(args, vae, train)
    if ema_w is not None:  # after the decoder phase: both pipelines share its VAE
        with ema_w.swapped():
            save(ema_out, vae, te, tok, tr)
        info["ema"] = {"decay": args.ema, "saved_to": ema_out}
        log(f"EMA weights (decay {args.ema}) saved to {ema_out}")
    save(args.out, vae, te, tok, tr)
    write_log(args, info, t_start)


def decoder_phase(args, vae, train, minutes=None):
    minutes = args.decoder_minutes if minutes is None else minutes
    steps, mse, history = finetune_decoder(vae, train, minutes, args.seed + 4, args.decoder_batch,
                                           args.decoder_lr, args.vae_fg_weight)
    log(f"decoder fine-tuned: {steps} steps, mse {mse:.5f}")
    return {"minutes": minutes, "batch": args.decoder_batch, "lr": args.decoder_lr, "steps": steps,
            "final_mse": mse, "history": history}


def write_log(args, info, t_start, final=True):
    total = time.time() - t_start
    with open(os.path.join(args.out, "training_log.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "seed": args.seed, "cpu": cpu_name(), **info,
                   "total_minutes": round(total / 60, 1)}, f, indent=1)
        f.write("\n")
    if final:
        log(f"done, {total / 60:.1f} min in all; saved {args.out}")


def finetune_only(args):
    """phase 4 alone on a saved pipeline (--finetune-decoder DIR): its encoder, text
    encoder and transformer kept; what DIR's training_log.json says is carried over"""
    t_start = time.time()
    train, _ = scenes.split()
    src = args.finetune_decoder
    pipe = WanPipeline.from_pretrained(src, torch_dtype=torch.float32)
    info = {}
    if os.path.exists(os.path.join(src, "training_log.json")):
        with open(os.path.join(src, "training_log.json")) as f:
            info["before"] = json.load(f)
    info["finetune_decoder_of"] = src
    info["decoder"] = decoder_phase(args, pipe.vae, train)
    pipe.text_encoder.eval(), pipe.transformer.eval()
    save(args.out, pipe.vae, pipe.text_encoder, pipe.tokenizer, pipe.transformer)
    write_log(args, info, t_start)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
