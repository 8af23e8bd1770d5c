"""Extra AutoencoderKLWan decoder vectors (beyond make_wan_vectors.py's a.vae / b.vae):
shapes that exercise other paths of the chunked decode, on the committed tiny VAEs.

Run from the repository root with the tools virtualenv, after make_wan_vectors.py:
    tools/venv/bin/python tools/parity/make_wan_vae_vectors.py
Writes tests/data/wan/vae_extra.safetensors, for each case <c>:
    <c>.z      [4, F, h, w] a latent (already un-normalised, as vae.decode takes it)
    <c>.video  [3, 1 + 4 (F - 1), H, W] diffusers' vae.decode(z), clamped to [-1, 1]
Cases (also in the file's metadata):
    one    tests/data/wan/b/vae, F = 1, 2 x 3: the first chunk only (no time
           upsampling at all, every conv at one frame)
    long   tests/data/wan/a/vae, F = 5, 3 x 5: odd sizes, four chunks after the
           first (caches carried through full chunks)
"""
import json

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file

CASES = {"one": ("b", (1, 2, 3), 11), "long": ("a", (5, 3, 5), 12)}


def main():
    torch.set_grad_enabled(False)
    out, meta = {}, {}
    for name, (v, (F, h, w), seed) in CASES.items():
        vae = AutoencoderKLWan.from_pretrained(f"tests/data/wan/{v}/vae").float().eval()
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(1, vae.config.z_dim, F, h, w, generator=g) * 1.5
        video = vae.decode(z, return_dict=False)[0]
        out[f"{name}.z"] = z[0].contiguous()
        out[f"{name}.video"] = video[0].contiguous()
        meta[name] = {"vae": v, "latent": [F, h, w], "video": list(video.shape[1:])}
    save_file(out, "tests/data/wan/vae_extra.safetensors", metadata={"cases": json.dumps(meta)})
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
