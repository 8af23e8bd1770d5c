"""AutoencoderKLLTX2Video decoder vectors: tiny random VAEs and diffusers' decode.

Run from the repository root with the tools virtualenv (deterministic: fixed seeds,
so a rerun rewrites the same files):
    tools/venv/bin/python tools/parity/make_ltx2_vae_vectors.py
Writes, for each VAE <v> in {a, b}:
    tests/data/ltx2_vae/<v>/model_index.json   a pipeline naming one component, vae
    tests/data/ltx2_vae/<v>/vae/config.json    save_pretrained's config
    tests/data/ltx2_vae/<v>/vae/diffusion_pytorch_model.safetensors
        save_pretrained's weights less encoder.* (the decoder's, latents_mean and
        latents_std only, to keep the fixtures small)
and tests/data/ltx2_vae/vectors.safetensors, for each case <c>:
    <c>.z      [zc, F, h, w] f32 a latent as the pipeline hands vae.decode (already
               de-normalised with latents_mean / latents_std / scaling_factor)
    <c>.temb   [1] f32 the decode timestep (VAEs with timestep conditioning only)
    <c>.video  [3, frames, H, W] f32 diffusers' vae.decode(z, temb).sample (no clamp;
               use_tiling and use_framewise_decoding are off by default: one decode)
VAEs (every norm-free weight random; scale_shift_tables, timestep_scale_multiplier,
latents_mean / latents_std randomised too):
    a  latent_channels 8, decoder_block_out_channels (4, 8, 16), layers (1, 1, 1, 1),
       upsample_type (spatiotemporal, spatial, temporal), residual, factor 2 (no up
       block conv_in), patch 3 x 1, timestep conditioning, non-causal decoder,
       reflect padding: 12x space, 4x time
    b  latent_channels 4, decoder_block_out_channels (4, 8, 8), layers (1, 2, 0, 1),
       scaling (False, True, True): blocks 0 (temporal, residual, factor 2) and 1
       (spatiotemporal, residual, factor 1, a conv_in 4 -> 8 with LayerNorm and a
       1x1x1 shortcut), block 2 (conv_in 8 -> 4, no upsampler); patch 2 x 1, no
       timestep conditioning, causal decoder, zeros padding: 8x space, 4x time
    c  like b with patch_size_t 2 and out_channels 6 (diffusers' unpatchify then
       gives 3 channels of 2 frames per decoded frame), replicate padding
    b.circular  b's weights with decoder_spatial_padding_mode "circular" (no folder of
       its own: the test writes that config next to b's weights)
Cases: non-square latents, two frame counts per VAE (also in the file's metadata).
"""
import json
import os

import torch
from diffusers import AutoencoderKLLTX2Video
from safetensors.torch import load_file, save_file

ROOT = "tests/data/ltx2_vae"
VAES = {
    "a": dict(latent_channels=8, block_out_channels=(4, 8), decoder_block_out_channels=(4, 8, 16),
              layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
              spatio_temporal_scaling=(True, True), decoder_spatio_temporal_scaling=(True, True, True),
              decoder_inject_noise=(False, False, False, False),
              down_block_types=("LTX2VideoDownBlock3D",) * 2, downsample_type=("spatial", "temporal"),
              upsample_type=("spatiotemporal", "spatial", "temporal"), upsample_residual=(True, True, True),
              upsample_factor=(2, 2, 2), timestep_conditioning=True, patch_size=3, patch_size_t=1,
              decoder_causal=False, decoder_spatial_padding_mode="reflect", scaling_factor=0.7, seed=1),
    "b": dict(latent_channels=4, block_out_channels=(4, 8), decoder_block_out_channels=(4, 8, 8),
              layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 2, 0, 1),
              spatio_temporal_scaling=(True, True), decoder_spatio_temporal_scaling=(False, True, True),
              decoder_inject_noise=False, down_block_types=("LTX2VideoDownBlock3D",) * 2,
              downsample_type=("spatial", "temporal"), upsample_type=("temporal", "spatiotemporal", "spatial"),
              upsample_residual=(False, True, False), upsample_factor=(1, 1, 2), timestep_conditioning=False,
              patch_size=2, patch_size_t=1, decoder_causal=True, decoder_spatial_padding_mode="zeros", seed=2),
}
VAES["c"] = dict(VAES["b"], patch_size_t=2, out_channels=6, decoder_spatial_padding_mode="replicate", seed=3)
# case: (vae, (F, h, w), decode timestep, seed)
CASES = {
    "a.three": ("a", (3, 2, 3), 0.05, 11),
    "a.two": ("a", (2, 3, 2), 0.6, 12),
    "b.four": ("b", (4, 3, 2), None, 13),
    "b.one": ("b", (1, 2, 5), None, 14),
    "c.two": ("c", (2, 2, 3), None, 15),
    "c.three": ("c", (3, 1, 2), None, 16),
    "b.circular": ("b.circular", (2, 2, 3), None, 17),
}


def make_vae(cfg):
    cfg = dict(cfg)
    torch.manual_seed(cfg.pop("seed"))
    cfg.setdefault("out_channels", 3)
    vae = AutoencoderKLLTX2Video(in_channels=3, **cfg).float().eval()
    with torch.no_grad():  # non-trivial buffers and tables (defaults: zeros, ones, 1000)
        for name, p in list(vae.named_parameters()) + list(vae.named_buffers()):
            if name.endswith("scale_shift_table") or "norm3" in name:
                p.copy_(p + 0.3 * torch.randn_like(p))
            elif name.endswith("timestep_scale_multiplier"):
                p.fill_(900.0)
            elif name == "latents_mean":
                p.copy_(0.2 * torch.randn_like(p))
            elif name == "latents_std":
                p.copy_(0.5 + torch.rand_like(p))
    return vae


def save(vae, v):
    path = os.path.join(ROOT, v)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model_index.json"), "w") as f:
        json.dump({"_class_name": "LTX2Pipeline", "_diffusers_version": "0.42.1",
                   "vae": ["diffusers", "AutoencoderKLLTX2Video"]}, f, indent=2)
        f.write("\n")
    vae.save_pretrained(os.path.join(path, "vae"))
    st = os.path.join(path, "vae", "diffusion_pytorch_model.safetensors")
    w = load_file(st)
    save_file({k: t.contiguous() for k, t in sorted(w.items()) if not k.startswith("encoder.")}, st,
              metadata={"format": "pt"})


def main():
    torch.set_grad_enabled(False)
    vaes = {}
    for v, cfg in VAES.items():
        vaes[v] = make_vae(cfg)
        save(vaes[v], v)
    circ = AutoencoderKLLTX2Video.from_config({**vaes["b"].config, "decoder_spatial_padding_mode": "circular"})
    circ.load_state_dict(vaes["b"].state_dict())
    vaes["b.circular"] = circ.float().eval()
    out, meta = {}, {}
    for name, (v, (F, h, w), t, seed) in CASES.items():
        vae = vaes[v]
        zc = vae.config.latent_channels
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(1, zc, F, h, w, generator=g) * 1.5
        temb = None if t is None else torch.tensor([t], dtype=torch.float32)
        video = vae.decode(z, temb).sample
        out[f"{name}.z"] = z[0].contiguous()
        if temb is not None:
            out[f"{name}.temb"] = temb
        out[f"{name}.video"] = video[0].contiguous()
        meta[name] = {"vae": v, "latent": [F, h, w], "temb": t, "video": list(video.shape[1:]),
                      "max_abs": float(video.abs().max())}
    save_file(out, os.path.join(ROOT, "vectors.safetensors"), metadata={"cases": json.dumps(meta)})
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
