"""HunyuanVideo transformer parity vectors, component by component: tiny random
HunyuanVideoTransformer3DModel configs in the diffusers layout and what their pieces
compute (diffusers 0.42.1, f32).

    tools/venv/bin/python tools/parity/make_hunyuan_vectors.py
Writes tests/data/hunyuan/{a,b}/transformer and tests/data/hunyuan/vectors.safetensors:
  a: 2 heads x 16, 1 dual + 1 single block, 2 refiner blocks, text_embed_dim 64,
     pooled 64 (the tiny Llama's and CLIP's widths, tests/data/llama and enc/clip), patch (1, 2, 2), RoPE axes 4+6+6, guidance embedded, mlp_ratio 4
  b: 2 heads x 24, 2 dual + 2 single blocks, 1 refiner block, text_embed_dim 64,
     pooled 64, patch (2, 1, 1), RoPE axes 8+8+8, no guidance, mlp_ratio 2
     (the refiner stays 4x wide), out_channels 8
  refiner.text [T, 64], refiner.valid, refiner.t, refiner.out [T, 32]: a's token
  refiner (`context_embedder`) with a right-padded mask, refiner_full.*: every row real;
  step_<c>.{latents [C, F, H, W], text [T, Td], valid, pooled [Pd], t, g, out}: one
  transformer forward of config c (the mask right-padded to `valid` rows; g the
  guidance scale, the model gets g x 1000 as HunyuanVideoPipeline passes it).
"""
import json
import os
import shutil

import torch
from diffusers import HunyuanVideoTransformer3DModel
from safetensors.torch import save_file

OUT = os.path.join("tests", "data", "hunyuan")
CONFIGS = {
    "a": dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
              num_single_layers=1, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1,
              guidance_embeds=True, text_embed_dim=64, pooled_projection_dim=64, rope_theta=256.0,
              rope_axes_dim=(4, 6, 6)),
    "b": dict(in_channels=4, out_channels=8, num_attention_heads=2, attention_head_dim=24, num_layers=2,
              num_single_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=2,
              guidance_embeds=False, text_embed_dim=64, pooled_projection_dim=64, rope_theta=256.0,
              rope_axes_dim=(8, 8, 8)),
}
# config: latent (F, H, W), text rows, valid rows, timestep, guidance scale
STEPS = {"a": ((3, 6, 10), 20, 13, 700.5, 6.0), "b": ((4, 5, 7), 16, 16, 250.0, 1.0)}


def make(name, seed):
    torch.manual_seed(seed)
    tr = HunyuanVideoTransformer3DModel(**CONFIGS[name]).eval()
    with torch.no_grad():
        for pname, p in tr.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if "norm" in pname and "weight" in pname else 0.0) + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / p[0].numel() ** 0.5)
    tr.save_pretrained(os.path.join(OUT, name, "transformer"))
    return tr


def main():
    torch.set_grad_enabled(False)
    for name in CONFIGS:
        shutil.rmtree(os.path.join(OUT, name, "transformer"), ignore_errors=True)
    os.makedirs(OUT, exist_ok=True)
    models = {"a": make("a", 9), "b": make("b", 19)}
    for name in CONFIGS:
        idx = os.path.join(OUT, name, "model_index.json")
        if not os.path.exists(idx):  # the pipeline script adds the other components
            with open(idx, "w") as f:
                json.dump({"_class_name": "HunyuanVideoPipeline",
                           "transformer": ["diffusers", "HunyuanVideoTransformer3DModel"]}, f, indent=2)
    g = torch.Generator().manual_seed(10)
    tr = models["a"]
    T, valid, t = 40, 23, 700.0
    vec = {}
    for key, v in (("refiner", valid), ("refiner_full", T)):
        text = torch.randn(1, T, 64, generator=g)
        mask = torch.zeros(1, T, dtype=torch.long)
        mask[:, :v] = 1
        out = tr.context_embedder(text, torch.tensor([t]), mask)
        vec[f"{key}.text"] = text[0].clone()
        vec[f"{key}.valid"] = torch.tensor([float(v)])
        vec[f"{key}.t"] = torch.tensor([t])
        vec[f"{key}.out"] = out[0].clone()
    for name, ((F, H, W), T, valid, t, gs) in STEPS.items():
        tr, c = models[name], CONFIGS[name]
        lat = torch.randn(1, c["in_channels"], F, H, W, generator=g)
        text = torch.randn(1, T, c["text_embed_dim"], generator=g)
        pooled = torch.randn(1, c["pooled_projection_dim"], generator=g)
        mask = torch.zeros(1, T)
        mask[:, :valid] = 1
        out = tr(hidden_states=lat, timestep=torch.tensor([t]), encoder_hidden_states=text,
                 encoder_attention_mask=mask, pooled_projections=pooled,
                 guidance=torch.tensor([gs]) * 1000.0, return_dict=False)[0]
        k = f"step_{name}"
        vec[f"{k}.latents"], vec[f"{k}.text"], vec[f"{k}.pooled"] = lat[0].clone(), text[0].clone(), pooled[0].clone()
        vec[f"{k}.valid"], vec[f"{k}.t"], vec[f"{k}.g"] = (torch.tensor([float(valid)]), torch.tensor([t]),
                                                          torch.tensor([gs]))
        vec[f"{k}.out"] = out[0].clone()
    save_file(vec, os.path.join(OUT, "vectors.safetensors"), metadata={"generator": "tools/parity/make_hunyuan_vectors.py"})
    print("wrote", len(vec), "tensors")


if __name__ == "__main__":
    main()
