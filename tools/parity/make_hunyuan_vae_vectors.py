"""AutoencoderKLHunyuanVideo decoder vectors: tiny random VAEs and diffusers' decode.

Run from the repository root with the tools virtualenv (deterministic: fixed seeds,
so a rerun rewrites the same files):
    tools/venv/bin/python tools/parity/make_hunyuan_vae_vectors.py
Writes, for each VAE <v> in {a, b, c}:
    tests/data/hunyuan_vae/<v>/model_index.json   a pipeline naming one component, vae
    tests/data/hunyuan_vae/<v>/vae/config.json    save_pretrained's config
    tests/data/hunyuan_vae/<v>/vae/diffusion_pytorch_model.safetensors
        save_pretrained's weights less encoder.* and quant_conv.* (the decoder's only,
        to keep the fixtures small; diffusers would re-initialise the encoder)
and tests/data/hunyuan_vae/vectors.safetensors, for each case <c>:
    <c>.z      [4, F, h, w] f32 a latent, already divided by scaling_factor (as
               vae.decode takes it)
    <c>.video  [3, 1 + 4 (F - 1), H, W] f32 diffusers' vae.decode(z).sample (no clamp;
               F > 4 runs its temporal tiling: tiles of 5 latent frames every 3,
               blended over 4 frames)
VAEs (latent_channels 4, temporal ratio 4; norm weights and biases randomised):
    a  block_out_channels (4, 8, 8), layers_per_block 1, groups 4, spatial 4,
       mid attention: up blocks 0, 1 upsample (2, 2, 2), block 2 none
    b  (4, 4, 8, 8), layers_per_block 1, groups 2, spatial 8, no mid attention:
       block 0 upsamples (1, 2, 2), blocks 1, 2 (2, 2, 2), block 3 none
    c  (4, 8, 8), layers_per_block 2, groups 2, spatial 8, mid attention: blocks
       0, 1 upsample (2, 2, 2), the last block (1, 2, 2)
Cases (also in the file's metadata): a.short F 3 (one decode), a.long F 7 (three
tiles, the last a single latent frame that contributes nothing), b.long F 6 (two
tiles), b.one F 1, c.five F 5 (two tiles, the second of two latent frames);
non-square latents throughout.
"""
import json
import os

import torch
from diffusers import AutoencoderKLHunyuanVideo
from safetensors.torch import load_file, save_file

ROOT = "tests/data/hunyuan_vae"
VAES = {
    "a": dict(block_out_channels=(4, 8, 8), layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=4,
              mid_block_add_attention=True, seed=1),
    "b": dict(block_out_channels=(4, 4, 8, 8), layers_per_block=1, norm_num_groups=2, spatial_compression_ratio=8,
              mid_block_add_attention=False, seed=2),
    "c": dict(block_out_channels=(4, 8, 8), layers_per_block=2, norm_num_groups=2, spatial_compression_ratio=8,
              mid_block_add_attention=True, seed=3),
}
# case: (vae, (F, h, w), seed)
CASES = {
    "a.short": ("a", (3, 3, 5), 11),
    "a.long": ("a", (7, 2, 3), 12),
    "b.long": ("b", (6, 1, 2), 13),
    "b.one": ("b", (1, 1, 3), 14),
    "c.five": ("c", (5, 2, 1), 15),
}


def make_vae(cfg):
    cfg = dict(cfg)
    torch.manual_seed(cfg.pop("seed"))
    n = len(cfg["block_out_channels"])
    vae = AutoencoderKLHunyuanVideo(in_channels=3, out_channels=3, latent_channels=4,
                                    down_block_types=("HunyuanVideoDownBlock3D",) * n,
                                    up_block_types=("HunyuanVideoUpBlock3D",) * n, act_fn="silu",
                                    temporal_compression_ratio=4, **cfg).float().eval()
    with torch.no_grad():  # non-trivial norms (the default is weight 1, bias 0)
        for name, p in vae.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "norm" in name and name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return vae


def save(vae, v):
    path = os.path.join(ROOT, v)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model_index.json"), "w") as f:
        json.dump({"_class_name": "HunyuanVideoPipeline", "_diffusers_version": "0.42.1",
                   "vae": ["diffusers", "AutoencoderKLHunyuanVideo"]}, f, indent=2)
        f.write("\n")
    vae.save_pretrained(os.path.join(path, "vae"))
    st = os.path.join(path, "vae", "diffusion_pytorch_model.safetensors")
    w = load_file(st)
    save_file({k: t.contiguous() for k, t in sorted(w.items()) if not k.startswith(("encoder.", "quant_conv."))}, st,
              metadata={"format": "pt"})


def main():
    torch.set_grad_enabled(False)
    vaes = {}
    for v, cfg in VAES.items():
        vaes[v] = make_vae(cfg)
        save(vaes[v], v)
    out, meta = {}, {}
    for name, (v, (F, h, w), seed) in CASES.items():
        vae = vaes[v]
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(1, 4, F, h, w, generator=g) * 1.5
        video = vae.decode(z).sample
        out[f"{name}.z"] = z[0].contiguous()
        out[f"{name}.video"] = video[0].contiguous()
        meta[name] = {"vae": v, "latent": [F, h, w], "video": list(video.shape[1:]),
                      "max_abs": float(video.abs().max())}
    save_file(out, os.path.join(ROOT, "vectors.safetensors"), metadata={"cases": json.dumps(meta)})
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
