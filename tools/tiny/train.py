"""Train difflet-tiny: a FLUX-architecture text-to-image pipeline small enough to
train on a 2-core CPU, saved in the ordinary diffusers layout.

    tools/venv/bin/python tools/tiny/train.py --out models/difflet-tiny --minutes 75

Phases (fixed seeds, progress logged to stdout):
  1. tokenizers trained on the caption corpus: CLIP-style byte-level BPE, T5-style
     SentencePiece Unigram (tools/parity/make_tokenizer_vectors.py's recipes);
  2. a tiny AutoencoderKL (3 levels: 64x64 RGB <-> 16x16x4) trained on the scenes;
     scaling/shift factors from the latent statistics;
  3. tiny CLIPTextModel + T5EncoderModel + FluxTransformer2DModel trained jointly
     with the flow-matching objective (x_t = (1-t) x0 + t noise, target noise - x0),
     10% caption dropout (empty prompt) so true classifier-free guidance works;
  4. FluxPipeline.save_pretrained(out), written again at every checkpoint.
The wall-clock budget (--minutes) bounds phase 3; phases 1-2 take a few minutes.
"""
import argparse
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
import scenes  # noqa: E402
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast  # noqa: E402

T5_LEN = 32  # text tokens the transformer sees (tokenizer_2's model_max_length)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def caption_corpus(train, n, seed):
    rng = random.Random(seed)
    return [scenes.caption(rng.choice(train), rng) for _ in range(n)]


def make_tokenizers(out, corpus):
    import make_tokenizer_vectors as mtv
    vocab, merges = mtv.train_clip_tiny(corpus)
    tok = mtv.save_clip(os.path.join(out, "tokenizer"), vocab, merges)
    tok2_slow = mtv.train_t5_tiny(corpus, os.path.join(out, "tokenizer_2"))
    # the transformer sees T5_LEN text tokens: record it where difflet and users look
    tok2 = T5TokenizerFast.from_pretrained(os.path.join(out, "tokenizer_2"), model_max_length=T5_LEN)
    tok2.save_pretrained(os.path.join(out, "tokenizer_2"))
    del tok2_slow
    return tok, tok2


def render_batch(batch, rng):
    imgs = np.stack([scenes.render(s, jitter=rng) for s in batch])
    return torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def train_vae(train, minutes, seed):
    torch.manual_seed(seed)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(32, 64, 64), layers_per_block=1,
                        latent_channels=4, norm_num_groups=16, sample_size=64, use_quant_conv=False,
                        use_post_quant_conv=False)
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    rng = random.Random(seed)
    t0, step = time.time(), 0
    while time.time() - t0 < minutes * 60:
        x = render_batch([rng.choice(train) for _ in range(16)], rng)
        post = vae.encode(x).latent_dist
        z = post.sample()
        rec = vae.decode(z).sample
        kl = post.kl().mean()
        loss = F.mse_loss(rec, x) + 1e-6 * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 50 == 0:
            log(f"vae step {step}: mse {F.mse_loss(rec, x).item():.5f} kl {kl.item():.1f}")
    vae.eval()
    with torch.no_grad():
        zs = torch.cat([vae.encode(render_batch([rng.choice(train) for _ in range(64)], rng)).latent_dist.mean
                        for _ in range(8)])
    shift, std = zs.mean().item(), zs.std().item()
    vae.register_to_config(scaling_factor=1.0 / std, shift_factor=shift)
    log(f"vae done after {step} steps: latent mean {shift:.4f} std {std:.4f}")
    return vae


def encode_latents(vae, train, n, seed):
    """n (scene, latent) training pairs, latents already scaled as FluxPipeline expects."""
    rng = random.Random(seed)
    picked, lats = [], []
    with torch.no_grad():
        for i in range(0, n, 128):
            b = [rng.choice(train) for _ in range(min(128, n - i))]
            z = vae.encode(render_batch(b, rng)).latent_dist.mean
            lats.append((z - vae.config.shift_factor) * vae.config.scaling_factor)
            picked += b
    return picked, torch.cat(lats)


def pack(z):  # [B, C, h, w] -> [B, (h/2)(w/2), 4C] as FluxPipeline packs
    b, c, h, w = z.shape
    return z.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def save(out, vae, te, tok, te2, tok2, tr):
    sched = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096,
                                            max_shift=1.15, num_train_timesteps=1000, shift=3.0,
                                            use_dynamic_shifting=True)
    pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok2,
                        transformer=tr)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp)
    with open(os.path.join(tmp, "difflet.json"), "w") as f:  # the length it was trained at, for difflet's default
        json.dump({"_comment": "Generation defaults difflet uses for this model where the request gives none; "
                   "diffusers' FluxPipeline defaults max_sequence_length to 512, this model was trained with "
                   f"{T5_LEN} text tokens (pass max_sequence_length={T5_LEN} to diffusers).",
                   "defaults": {"max_sequence_length": T5_LEN}}, f, indent=2)
        f.write("\n")
    for f in ("README.md", "training_log.json", "eval_prompts.json"):  # keep what the folder already documents
        if os.path.exists(os.path.join(out, f)):
            shutil.copy(os.path.join(out, f), tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/difflet-tiny")
    ap.add_argument("--minutes", type=float, default=75, help="wall-clock budget of the joint training phase")
    ap.add_argument("--vae-minutes", type=float, default=6)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--probe", action="store_true", help="time a few steps of each phase and stop")
    args = ap.parse_args()
    torch.set_num_threads(2)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    train, heldout = scenes.split()
    log(f"{len(train)} training scenes, {len(heldout)} held out")
    corpus = caption_corpus(train, 6000, args.seed)
    tok, tok2 = make_tokenizers(args.out, corpus)
    log(f"tokenizers: CLIP BPE {len(tok)} tokens, T5 Unigram {len(tok2)} pieces")
    vae = train_vae(train, 0.3 if args.probe else args.vae_minutes, args.seed)
    vae.requires_grad_(False)
    pairs, lats = encode_latents(vae, train, 512 if args.probe else 24000, args.seed + 1)
    log(f"encoded {len(pairs)} training latents {tuple(lats.shape)}")

    torch.manual_seed(args.seed)
    te = CLIPTextModel(CLIPTextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, max_position_embeddings=77, hidden_act="quick_gelu",
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id, projection_dim=64))
    te2 = T5EncoderModel(T5Config(vocab_size=len(tok2), d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2,
                                  feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
                                  dropout_rate=0.0, tie_word_embeddings=False))
    tr = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=3, attention_head_dim=32,
                                num_attention_heads=4, joint_attention_dim=64, pooled_projection_dim=64,
                                guidance_embeds=False, axes_dims_rope=(8, 12, 12))
    params = list(te.parameters()) + list(te2.parameters()) + list(tr.parameters())
    log(f"parameters: transformer {sum(p.numel() for p in tr.parameters())/1e6:.2f} M, "
        f"CLIP {sum(p.numel() for p in te.parameters())/1e6:.2f} M, T5 {sum(p.numel() for p in te2.parameters())/1e6:.2f} M, "
        f"VAE {sum(p.numel() for p in vae.parameters())/1e6:.2f} M")
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    img_ids = FluxPipeline._prepare_latent_image_ids(1, 8, 8, "cpu", torch.float32)
    txt_ids = torch.zeros(T5_LEN, 3)
    mu = 0.5 + (1.15 - 0.5) / (4096 - 256) * (64 - 256)  # FluxPipeline's shift for 64 image tokens
    rng = random.Random(args.seed + 2)
    history, step, t0 = [], 0, time.time()
    budget = (0.5 if args.probe else args.minutes) * 60
    last_save = time.time()
    ema = None
    while time.time() - t0 < budget:
        idx = [rng.randrange(len(pairs)) for _ in range(args.batch)]
        caps = [scenes.caption(pairs[i], rng) if rng.random() >= 0.1 else "" for i in idx]
        ids = tok(caps, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        ids2 = tok2(caps, padding="max_length", max_length=T5_LEN, truncation=True, return_tensors="pt").input_ids
        pooled = te(ids).pooler_output
        emb = te2(ids2).last_hidden_state
        x0 = pack(lats[idx])
        noise = torch.randn_like(x0)
        t = torch.sigmoid(torch.randn(args.batch))  # logit-normal, then the sampler's shift
        t = math.exp(mu) * t / (1 + (math.exp(mu) - 1) * t)
        xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * noise
        v = tr(hidden_states=xt, encoder_hidden_states=emb, pooled_projections=pooled, timestep=t, img_ids=img_ids,
               txt_ids=txt_ids, return_dict=False)[0]
        loss = F.mse_loss(v, noise - x0)
        # linear warm-up, then cosine decay over the time budget
        frac = (time.time() - t0) / budget
        lr = args.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0:
            el = time.time() - t0
            log(f"step {step}: loss {ema:.4f} lr {lr:.2e} {el / step:.3f} s/step")
            history.append({"step": step, "loss": round(ema, 5), "seconds": round(el, 1)})
        if not args.probe and time.time() - last_save > 600:  # a usable checkpoint every 10 minutes
            te.eval(), te2.eval(), tr.eval()
            save(args.out, vae, te, tok, te2, tok2, tr)
            te.train(), te2.train(), tr.train()
            last_save = time.time()
            log(f"checkpoint saved at step {step}")
    te.eval(), te2.eval(), tr.eval()
    save(args.out, vae, te, tok, te2, tok2, tr)
    total = time.time() - t_start
    with open(os.path.join(args.out, "training_log.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "seed": args.seed, "steps": step, "batch": args.batch,
                   "final_loss": ema, "total_minutes": round(total / 60, 1), "history": history}, f, indent=1)
    log(f"done: {step} steps, loss {ema:.4f}, {total / 60:.1f} min in all; saved {args.out}")


if __name__ == "__main__":
    main()
