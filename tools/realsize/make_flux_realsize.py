#!/usr/bin/env python3
"""A FLUX.1-dev-size pipeline folder with random weights, in the diffusers layout.

The transformer has FLUX.1-dev's configuration (19 double + 38 single blocks, hidden
3072, 24 heads of 128, guidance embedding: 11.9 B parameters), text_encoder_2 is a
T5-XXL-width encoder (d_model 4096, 24 layers, 64 heads, d_ff 10240, vocabulary 32128:
4.8 B parameters), text_encoder CLIP-L's width, the VAE FLUX's (16 latent channels,
[128, 256, 512, 512]). Weights are random bf16 (as FLUX.1-dev ships), uniform in
+-1/sqrt(fan_in), norm weights near 1, written shard by shard (<= 2 GB each, with the
`.index.json` diffusers and transformers write), so the machine never holds a whole
component. Tensor names and shapes come from the diffusers and transformers classes
themselves, built on the meta device (no memory). Tokenizers and the scheduler are
copied from a small FLUX folder (token ids stay below every vocabulary).

For `difflet compile --dtype int8` of a real-size model within 24 GiB (issue 26):

    tools/venv/bin/python tools/realsize/make_flux_realsize.py --out /tmp/flux-real \\
        --tokenizers tests/data/flux/dev
"""
import argparse
import json
import math
import os
import shutil
import time

import torch
from safetensors.torch import save_file

SHARD = 2 << 30

TRANSFORMER = {"_class_name": "FluxTransformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56],
               "guidance_embeds": True, "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24,
               "num_layers": 19, "num_single_layers": 38, "patch_size": 1, "pooled_projection_dim": 768}
VAE = {"_class_name": "AutoencoderKL", "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
       "down_block_types": ["DownEncoderBlock2D"] * 4, "force_upcast": True, "in_channels": 3, "latent_channels": 16,
       "latents_mean": None, "latents_std": None, "layers_per_block": 2, "mid_block_add_attention": True,
       "norm_num_groups": 32, "out_channels": 3, "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159,
       "up_block_types": ["UpDecoderBlock2D"] * 4, "use_post_quant_conv": False, "use_quant_conv": False}
CLIP = {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model", "hidden_size": 768, "intermediate_size": 3072,
        "num_hidden_layers": 12, "num_attention_heads": 12, "vocab_size": 49408, "max_position_embeddings": 77,
        "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "projection_dim": 768, "bos_token_id": 0, "eos_token_id": 2,
        "pad_token_id": 1}
T5 = {"architectures": ["T5EncoderModel"], "model_type": "t5", "d_model": 4096, "d_kv": 64, "d_ff": 10240,
      "num_layers": 24, "num_decoder_layers": 24, "num_heads": 64, "vocab_size": 32128, "feed_forward_proj": "gated-gelu",
      "dense_act_fn": "gelu_new", "is_gated_act": True, "layer_norm_epsilon": 1e-6, "relative_attention_num_buckets": 32,
      "relative_attention_max_distance": 128, "tie_word_embeddings": False, "is_encoder_decoder": False,
      "pad_token_id": 0, "eos_token_id": 1}


def shapes_of(kind):
    """(name, shape) of every tensor the class stores, from a meta-device instance"""
    with torch.device("meta"):
        if kind == "transformer":
            from diffusers import FluxTransformer2DModel
            m = FluxTransformer2DModel(**{k: v for k, v in TRANSFORMER.items() if not k.startswith("_")})
        elif kind == "vae":
            from diffusers import AutoencoderKL
            m = AutoencoderKL(**{k: v for k, v in VAE.items() if not k.startswith("_")})
        elif kind == "clip":
            from transformers import CLIPTextConfig, CLIPTextModel
            m = CLIPTextModel(CLIPTextConfig(**{k: v for k, v in CLIP.items() if k not in ("architectures",)}))
        else:
            from transformers import T5Config, T5EncoderModel
            m = T5EncoderModel(T5Config(**{k: v for k, v in T5.items() if k not in ("architectures",)}))
    seen, out = set(), []
    for name, t in m.state_dict().items():
        if kind == "t5" and name == "encoder.embed_tokens.weight":
            continue  # stored once, as `shared.weight`, as the FLUX repository stores it
        if name in seen:
            continue
        seen.add(name)
        out.append((name, tuple(t.shape)))
    return out


def rand_tensor(name, shape, gen):
    n = math.prod(shape)
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        a = 1.0 / math.sqrt(fan_in)
        if "embed" in name or "shared" in name:
            a = 0.5
        return torch.empty(shape, dtype=torch.float32).uniform_(-a, a, generator=gen).to(torch.bfloat16)
    t = torch.empty(n, dtype=torch.float32).uniform_(-0.02, 0.02, generator=gen)
    if "norm" in name or "layer_norm" in name or name.endswith("ln_1.weight") or name.endswith("ln_2.weight"):
        if name.endswith("weight") or name.endswith("scale"):
            t += 1.0
    return t.reshape(shape).to(torch.bfloat16)


def write_component(out_dir, folder, kind, config, stem, seed):
    d = os.path.join(out_dir, folder)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shapes = shapes_of(kind)
    total = sum(2 * math.prod(s) for _, s in shapes)
    nshards = max(1, -(-total // SHARD))
    gen = torch.Generator().manual_seed(seed)
    shard, size, k, weight_map, t0 = {}, 0, 1, {}, time.time()
    fmt = "%s-%05d-of-%05d.safetensors"
    files = []

    def flush():
        nonlocal shard, size, k
        if not shard:
            return
        fn = fmt % (stem, k, nshards)
        save_file(shard, os.path.join(d, fn), metadata={"format": "pt"})
        for n in shard:
            weight_map[n] = fn
        files.append(fn)
        print(f"  {folder}/{fn}: {len(shard)} tensors, {size / 2**30:.2f} GiB ({time.time() - t0:.0f} s)", flush=True)
        shard, size, k = {}, 0, k + 1

    for name, shape in shapes:
        b = 2 * math.prod(shape)
        if size and size + b > SHARD:
            flush()
        shard[name] = rand_tensor(name, shape, gen)
        size += b
    flush()
    if len(files) != nshards:  # the file names promised a count: rename to the real one
        for i, fn in enumerate(files):
            real = fmt % (stem, i + 1, len(files))
            os.rename(os.path.join(d, fn), os.path.join(d, real))
            for n, v in list(weight_map.items()):
                if v == fn:
                    weight_map[n] = real
    with open(os.path.join(d, stem + ".safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    params = total // 2
    print(f"{folder}: {params / 1e9:.2f} B parameters, {total / 2**30:.1f} GiB bf16", flush=True)
    return params


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizers", required=True, help="a FLUX folder to copy tokenizer, tokenizer_2, scheduler from")
    ap.add_argument("--only", default="transformer,text_encoder,text_encoder_2,vae")
    ap.add_argument("--double", type=int, default=19, help="double blocks (FLUX.1-dev: 19)")
    ap.add_argument("--single", type=int, default=38, help="single blocks (FLUX.1-dev: 38)")
    ap.add_argument("--t5-layers", type=int, default=24, help="T5 encoder layers (T5-XXL: 24)")
    args = ap.parse_args()
    TRANSFORMER.update(num_layers=args.double, num_single_layers=args.single)
    T5.update(num_layers=args.t5_layers, num_decoder_layers=args.t5_layers)
    os.makedirs(args.out, exist_ok=True)
    for c in ("tokenizer", "tokenizer_2", "scheduler"):
        dst = os.path.join(args.out, c)
        if not os.path.exists(dst):
            shutil.copytree(os.path.join(args.tokenizers, c), dst)
    index = {"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1", "feature_extractor": [None, None],
             "image_encoder": [None, None], "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5Tokenizer"],
             "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    with open(os.path.join(args.out, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)
    only = set(args.only.split(","))
    plan = [("transformer", "transformer", TRANSFORMER, "diffusion_pytorch_model", 1),
            ("text_encoder_2", "t5", T5, "model", 2), ("text_encoder", "clip", CLIP, "model", 3),
            ("vae", "vae", VAE, "diffusion_pytorch_model", 4)]
    for folder, kind, cfg, stem, seed in plan:
        if folder in only:
            write_component(args.out, folder, kind, cfg, stem, seed)


if __name__ == "__main__":
    main()
