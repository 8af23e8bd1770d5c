"""HunyuanVideo transformer parity vectors, component by component (the engine builds
the model piece by piece): a tiny random HunyuanVideoTransformer3DModel in the
diffusers layout and what its pieces compute.

    tools/venv/bin/python tools/parity/make_hunyuan_vectors.py
Writes tests/data/hunyuan/: model_index.json, transformer/ (2 heads x 16, 1 dual + 1
single block, 2 refiner blocks, text_embed_dim 48, patch 2x2, RoPE axes 4+6+6) and
vectors.safetensors:
  refiner.text [T, 48], refiner.valid, refiner.t, refiner.out [T, 32]: the token refiner
  (`context_embedder`) with a right-padded mask (valid of T rows real), f32;
  refiner_full.*: the same with every row real.
"""
import json
import os
import shutil

import torch
from diffusers import HunyuanVideoTransformer3DModel
from safetensors.torch import save_file

OUT = os.path.join("tests", "data", "hunyuan")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    torch.manual_seed(9)
    tr = HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                                        num_layers=1, num_single_layers=1, num_refiner_layers=2, mlp_ratio=4.0,
                                        patch_size=2, patch_size_t=1, guidance_embeds=True, text_embed_dim=48,
                                        pooled_projection_dim=24, rope_theta=256.0, rope_axes_dim=(4, 6, 6)).eval()
    with torch.no_grad():
        for name, p in tr.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if "norm" in name and "weight" in name else 0.0) + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / p[0].numel() ** 0.5)
    tr.save_pretrained(os.path.join(OUT, "transformer"))
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump({"_class_name": "HunyuanVideoPipeline", "transformer": ["diffusers", "HunyuanVideoTransformer3DModel"]}, f,
                  indent=2)
    g = torch.Generator().manual_seed(10)
    T, valid, t = 40, 23, 700.0
    vec = {}
    for key, v in (("refiner", valid), ("refiner_full", T)):
        text = torch.randn(1, T, 48, generator=g)
        mask = torch.zeros(1, T, dtype=torch.long)
        mask[:, :v] = 1
        with torch.no_grad():
            out = tr.context_embedder(text, torch.tensor([t]), mask)
        vec[f"{key}.text"] = text[0].clone()
        vec[f"{key}.valid"] = torch.tensor([float(v)])
        vec[f"{key}.t"] = torch.tensor([t])
        vec[f"{key}.out"] = out[0].clone()
    save_file(vec, os.path.join(OUT, "vectors.safetensors"), metadata={"generator": "tools/parity/make_hunyuan_vectors.py"})
    print("wrote", len(vec), "tensors")


if __name__ == "__main__":
    main()
