"""Wan 2.1 parity vectors: two tiny random-weight WanPipelines in the diffusers layout,
run by diffusers at non-square sizes with fixed initial latents.

Run from the repository root with the tools virtualenv (make tools-venv), after
make_tokenizer_vectors.py (it uses the trained tiny T5 tokenizer, tests/data/tok/t5_tiny):
    tools/venv/bin/python tools/parity/make_wan_vectors.py
Writes tests/data/wan/:
  a/   WanPipeline (save_pretrained): UMT5EncoderModel (2 layers, d_model 32, 4 heads,
       gated-GELU, a relative position bias in every layer) with the tiny T5 tokenizer;
       WanTransformer3DModel (patch (1, 2, 2), 2 heads x 24, 2 layers, FFN 96, text 32,
       cross-attention norm); AutoencoderKLWan (base 8, z 4, dim_mult (1, 2, 2),
       temporal downsampling (True, True): 4x temporal, 4x spatial);
       UniPCMultistepScheduler as Wan configures it (flow_shift 3)
  b/   the same text encoder and tokenizer (symlinks into a/); transformer with patch
       (1, 1, 2), 3 heads x 12, 3 layers, FFN 64, no cross-attention norm; VAE with
       dim_mult (1, 2, 2, 2), temporal downsampling (False, True, True): 4x temporal,
       8x spatial; UniPC with flow_shift 5
  a_euler/  a's components (symlinks) with FlowMatchEulerDiscreteScheduler (shift 3)
  vae_extra.safetensors is make_wan_vae_vectors.py's (kept)
  vectors.safetensors, for each pipeline <v> in (a, b):
    <v>.text.ids / .mask / .hidden   the tokenized prompt (max_sequence_length MAXSEQ) and
                                     UMT5's last_hidden_state with that mask
    <v>.text.embeds                  prompt_embeds as the pipeline makes them (rows past
                                     the valid length zeroed)
    <v>.step.latents / .t / .out     one transformer call on the prompt embeds
    <v>.vae.z / .video               AutoencoderKLWan.decode of a latent (already
                                     un-normalised), video [3, F, H, W] clamped to [-1, 1]
    <v>.gen<k>.latents / .frames     the whole pipeline, STEPS steps, from the given
                                     initial latents [C, F', h, w]: frames [F, H, W, 3]
                                     float in [0, 1] (output_type "np"); k = 0 with CFG
                                     (guidance 5, negative prompt NEG), k = 1 without
                                     (guidance 1)
    a_euler.gen0.*                   the whole pipeline of a_euler, with CFG
  The sizes are in SIZES below (width x height x frames).
"""
import json
import os
import shutil

import numpy as np
import torch
from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline,
                       WanTransformer3DModel)
from safetensors.torch import save_file
from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

TOK = os.path.join("tests", "data", "tok", "t5_tiny")
OUT = os.path.join("tests", "data", "wan")
MAXSEQ, STEPS = 16, 4
PROMPT, NEG = "a red circle moving  from left to right &amp; a blue background", "blurry green square"
SIZES = {"a": (48, 32, 9), "b": (32, 48, 5)}
SCHED = {"beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
         "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "lower_order_final": True,
         "num_train_timesteps": 1000, "predict_x0": True, "prediction_type": "flow_prediction",
         "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
         "solver_type": "bh2", "steps_offset": 0, "thresholding": False, "timestep_spacing": "linspace",
         "trained_betas": None, "use_beta_sigmas": False, "use_exponential_sigmas": False, "use_flow_sigmas": True,
         "use_karras_sigmas": False}


def randomize(model, seed, scale=1.0, skip=()):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(s in name for s in skip):
                continue
            if p.dim() == 1:
                base = 1.0 if (("norm" in name or "gamma" in name) and "weight" in name or name.endswith("gamma")) else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * (scale / fan_in ** 0.5))


def text_encoder(vocab):
    torch.manual_seed(5)
    cfg = UMT5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=32, relative_attention_max_distance=128,
                     feed_forward_proj="gated-gelu", dropout_rate=0.0, layer_norm_epsilon=1e-6,
                     pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    m = UMT5EncoderModel(cfg).eval()
    randomize(m, 31)
    return m


def transformer(v):
    torch.manual_seed(6)
    if v == "a":
        t = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=4,
                                  out_channels=4, text_dim=32, freq_dim=32, ffn_dim=96, num_layers=2,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
    else:
        t = WanTransformer3DModel(patch_size=(1, 1, 2), num_attention_heads=3, attention_head_dim=12, in_channels=4,
                                  out_channels=4, text_dim=32, freq_dim=16, ffn_dim=64, num_layers=3,
                                  cross_attn_norm=False, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
    randomize(t.eval(), 41 if v == "a" else 42)
    return t


def vae(v):
    torch.manual_seed(7)
    mean = [0.1, -0.2, 0.3, -0.05]
    std = [1.5, 0.8, 2.0, 1.2]
    if v == "a":
        m = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1, attn_scales=[],
                             temperal_downsample=[True, True], latents_mean=mean, latents_std=std,
                             scale_factor_temporal=4, scale_factor_spatial=4)
    else:
        m = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                             temperal_downsample=[False, True, True], latents_mean=mean, latents_std=std,
                             scale_factor_temporal=4, scale_factor_spatial=8)
    randomize(m.eval(), 51 if v == "a" else 52, scale=0.9)
    return m


def link_text(dst, src):
    for c in ("text_encoder", "tokenizer"):
        os.symlink(os.path.join("..", src, c), os.path.join(dst, c))


def main():
    extra = os.path.join(OUT, "vae_extra.safetensors")
    keep = open(extra, "rb").read() if os.path.exists(extra) else None
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    if keep is not None:
        open(extra, "wb").write(keep)
    tok = AutoTokenizer.from_pretrained(TOK)
    te = text_encoder(len(tok))
    vec = {}
    for v in ("a", "b"):
        W, H, F = SIZES[v]
        sched = UniPCMultistepScheduler(**dict(SCHED, flow_shift=3.0 if v == "a" else 5.0))
        pipe = WanPipeline(tokenizer=tok, text_encoder=te, vae=vae(v), scheduler=sched, transformer=transformer(v))
        path = os.path.join(OUT, v)
        if v == "a":
            pipe.save_pretrained(path)
        else:  # the text encoder and tokenizer are a's
            os.makedirs(path)
            for c in ("transformer", "vae", "scheduler"):
                getattr(pipe, c).save_pretrained(os.path.join(path, c))
            shutil.copy(os.path.join(OUT, "a", "model_index.json"), path)
            link_text(path, "a")
        pipe = WanPipeline.from_pretrained(path)  # what a user loads from the folder
        with torch.no_grad():
            # text
            ti = pipe.tokenizer(["a red circle moving from left to right & a blue background"], padding="max_length",
                                max_length=MAXSEQ, truncation=True, add_special_tokens=True,
                                return_attention_mask=True, return_tensors="pt")
            hid = pipe.text_encoder(ti.input_ids, ti.attention_mask).last_hidden_state
            emb = pipe.encode_prompt(PROMPT, do_classifier_free_guidance=False, max_sequence_length=MAXSEQ)[0]
            vec[f"{v}.text.ids"] = ti.input_ids[0].to(torch.int32)
            vec[f"{v}.text.mask"] = ti.attention_mask[0].to(torch.int32)
            vec[f"{v}.text.hidden"] = hid[0]
            vec[f"{v}.text.embeds"] = emb[0]
            # one transformer step
            lf = (F - 1) // pipe.vae_scale_factor_temporal + 1
            lh, lw = H // pipe.vae_scale_factor_spatial, W // pipe.vae_scale_factor_spatial
            g = torch.Generator().manual_seed(11)
            lat = torch.randn(1, 4, lf, lh, lw, generator=g)
            t = torch.tensor([723.0])
            out = pipe.transformer(hidden_states=lat, timestep=t, encoder_hidden_states=emb, return_dict=False)[0]
            vec[f"{v}.step.latents"], vec[f"{v}.step.t"], vec[f"{v}.step.out"] = lat[0], t, out[0]
            # VAE decode
            z = torch.randn(1, 4, lf, lh, lw, generator=g) * 1.5
            video = pipe.vae.decode(z, return_dict=False)[0]
            vec[f"{v}.vae.z"], vec[f"{v}.vae.video"] = z[0], video[0]
            print(f"{v}: video range [{video.min():.3f}, {video.max():.3f}] std {video.std():.3f}, "
                  f"clamped {(video.abs() >= 1).float().mean():.3f}, step out std {out.std():.3f}")
            # whole pipeline
            for k, gs in enumerate((5.0, 1.0)):
                init = torch.randn(1, 4, lf, lh, lw, generator=g)
                frames = pipe(prompt=PROMPT, negative_prompt=NEG if k == 0 else None, height=H, width=W,
                              num_frames=F, num_inference_steps=STEPS, guidance_scale=gs, latents=init.clone(),
                              max_sequence_length=MAXSEQ, output_type="np").frames[0]
                vec[f"{v}.gen{k}.latents"] = init[0]
                vec[f"{v}.gen{k}.frames"] = torch.from_numpy(np.ascontiguousarray(frames)).float()
                print(f"{v}.gen{k}: frames {frames.shape}, mean {frames.mean():.3f} std {frames.std():.3f}")
    # a's pipeline with FlowMatchEulerDiscreteScheduler (a config some Wan ports use)
    path = os.path.join(OUT, "a_euler")
    os.makedirs(path)
    for c in ("text_encoder", "tokenizer", "transformer", "vae"):
        os.symlink(os.path.join("..", "a", c), os.path.join(path, c))
    pipe = WanPipeline.from_pretrained(os.path.join(OUT, "a"))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    pipe.scheduler.save_pretrained(os.path.join(path, "scheduler"))
    idx = json.load(open(os.path.join(OUT, "a", "model_index.json")))
    idx["scheduler"] = ["diffusers", "FlowMatchEulerDiscreteScheduler"]
    json.dump(idx, open(os.path.join(path, "model_index.json"), "w"), indent=2)
    W, H, F = SIZES["a"]
    with torch.no_grad():
        g = torch.Generator().manual_seed(13)
        init = torch.randn(1, 4, (F - 1) // 4 + 1, H // 4, W // 4, generator=g)
        frames = pipe(prompt=PROMPT, negative_prompt=NEG, height=H, width=W, num_frames=F, num_inference_steps=STEPS,
                      guidance_scale=5.0, latents=init.clone(), max_sequence_length=MAXSEQ, output_type="np").frames[0]
    vec["a_euler.gen0.latents"] = init[0]
    vec["a_euler.gen0.frames"] = torch.from_numpy(np.ascontiguousarray(frames)).float()
    save_file({k: t.contiguous() for k, t in vec.items()}, os.path.join(OUT, "vectors.safetensors"))
    with open(os.path.join(OUT, "vectors.json"), "w") as f:
        json.dump({"prompt": PROMPT, "negative_prompt": NEG, "max_sequence_length": MAXSEQ, "steps": STEPS,
                   "sizes": SIZES, "guidance": [5.0, 1.0]}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
