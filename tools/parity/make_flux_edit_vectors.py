"""FLUX image-to-image and inpainting parity vectors: diffusers' FluxImg2ImgPipeline
and FluxInpaintPipeline on tiny random pipelines, and the AutoencoderKL encoder alone.

Run from the repository root with the tools virtualenv, after make_flux_vectors.py:
    tools/venv/bin/python tools/parity/make_flux_edit_vectors.py
Writes tests/data/flux/:
  edit/     a FluxPipeline folder: dev's transformer, text encoders, tokenizers and
            scheduler (symlinks) and a VAE with dev's decoder whose encoder's
            log-variance is pinned at diffusers' floor (-30, std 3e-7), so the
            pipelines' posterior *sample* equals the mean difflet uses (to 3e-7);
  edit_b/   the same with another AutoencoderKL layout (3 levels, 2 resnets per
            block, quant_conv and post_quant_conv, no mid-block attention, 8 groups);
  edit_vectors.safetensors:
    <m>.enc.image / <m>.enc.mean   one encoder call ([3, H, W] in [-1, 1] -> the mean)
    <m>.i2i.latents / .image       FluxImg2ImgPipeline, strength 0.6, 5 steps: the packed
                                   noise the pipeline drew (replayed from its generator
                                   and checked) and the output [H, W, 3] in [0, 1]
    <m>.inp.latents / .image       FluxInpaintPipeline, strength 0.7, 6 steps, true CFG
    resize.<rgb|luma>.<W>x<H>      PIL's LANCZOS resize of edit/resize_src.png (57x23)
  edit/init.png, edit/mask.png, edit_b/init.png, edit_b/mask.png: the pipelines'
  inputs (the mask is RGB with grey levels: converted to L and binarised as diffusers does)
"""
import os
import shutil

import numpy as np
import torch
from diffusers import AutoencoderKL, FluxImg2ImgPipeline, FluxInpaintPipeline, FluxPipeline
from PIL import Image
from safetensors.torch import save_file

from make_flux_vectors import randomize  # the same weight initialisation as the other FLUX vectors

OUT = os.path.join("tests", "data", "flux")
DEV = os.path.join(OUT, "dev")
PROMPT, NEG = "a red circle on a blue background", "blurry green square"
MAXSEQ = 32


def pin_logvar(vae):
    """the encoder's log-variance channels (the second half of conv_out, or of
    quant_conv when there is one) constant at -30"""
    conv = vae.quant_conv if vae.quant_conv is not None else vae.encoder.conv_out
    z = vae.config.latent_channels
    with torch.no_grad():
        conv.weight[z:] = 0
        conv.bias[z:] = -30.0


def vae_b():
    torch.manual_seed(8)
    v = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                      up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 32, 32), layers_per_block=2,
                      latent_channels=4, norm_num_groups=8, sample_size=64, scaling_factor=0.5, shift_factor=-0.05,
                      use_quant_conv=True, use_post_quant_conv=True, mid_block_add_attention=False).eval()
    randomize(v, 24)
    return v


def picture(w, h, seed):
    """a smooth picture with a shape on it (RGB uint8) and a grey-level RGB mask"""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 255 / w), (yy * 255 / h), np.full((h, w), 90.0)], -1)
    cx, cy, r = w * 0.4, h * 0.55, min(w, h) * 0.25
    img[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = (230, 40, 30)
    img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
    mask = np.zeros((h, w, 3), np.uint8)
    mask[h // 4: 3 * h // 4, w // 3:] = (200, 210, 190)  # light: repainted
    mask[h // 4: h // 2, w // 3: w // 2] = (120, 130, 110)  # luma just under 128: kept
    return Image.fromarray(img), Image.fromarray(mask)


def folder(name, vae):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    shutil.copy(os.path.join(DEV, "model_index.json"), path)
    for comp in ("transformer", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"):
        os.symlink(os.path.join("..", "dev", comp), os.path.join(path, comp))
    vae.save_pretrained(os.path.join(path, "vae"))
    return path


def noise_of(pipe, seed, h, w):
    """the packed noise the pipeline draws: its generator gives the VAE posterior
    sample first (latent shape), then the noise (unpacked [1, 4, lh, lw])"""
    lh, lw = 2 * (h // (pipe.vae_scale_factor * 2)), 2 * (w // (pipe.vae_scale_factor * 2))
    g = torch.Generator().manual_seed(seed)
    torch.randn(1, 4, lh, lw, generator=g)
    return torch.randn(1, 4, lh, lw, generator=g), (lh, lw)


def run_checked(pipe, seed, h, w, **kw):
    """run the pipeline and check the noise it mixed into the image is the replayed one"""
    want, (lh, lw) = noise_of(pipe, seed, h, w)
    seen = []
    orig = pipe.scheduler.scale_noise

    def spy(sample, timestep, noise=None):
        if not seen:
            seen.append(noise.clone())
        return orig(sample, timestep, noise)

    pipe.scheduler.scale_noise = spy
    with torch.no_grad():
        img = pipe(generator=torch.Generator().manual_seed(seed), height=h, width=w, output_type="np",
                   max_sequence_length=MAXSEQ, **kw).images[0]
    pipe.scheduler.scale_noise = orig
    assert torch.equal(seen[0], want), "replayed noise differs from the pipeline's"
    return pipe._pack_latents(want, 1, 4, lh, lw)[0].clone(), torch.from_numpy(np.ascontiguousarray(img)).float()


def main():
    base = FluxPipeline.from_pretrained(DEV)
    vec = {}
    vae_a = AutoencoderKL.from_pretrained(os.path.join(DEV, "vae")).eval()
    for name, vae, (h, w) in (("edit", vae_a, (48, 32)), ("edit_b", vae_b(), (64, 48))):
        pin_logvar(vae)
        path = folder(name, vae)
        init, mask = picture(w, h, 3 if name == "edit" else 4)
        init.save(os.path.join(path, "init.png"))
        mask.save(os.path.join(path, "mask.png"))
        comps = dict(base.components, vae=vae)
        # the encoder alone on a random picture in [-1, 1]
        x = torch.rand(1, 3, h, w, generator=torch.Generator().manual_seed(9)) * 2 - 1
        with torch.no_grad():
            vec[f"{name}.enc.image"] = x[0].clone()
            vec[f"{name}.enc.mean"] = vae.encode(x).latent_dist.mean[0].clone()
        i2i = FluxImg2ImgPipeline(**comps)
        vec[f"{name}.i2i.latents"], vec[f"{name}.i2i.image"] = run_checked(
            i2i, 11, h, w, prompt=PROMPT, image=init, strength=0.6, num_inference_steps=5, guidance_scale=3.5)
        inp = FluxInpaintPipeline(**comps)
        vec[f"{name}.inp.latents"], vec[f"{name}.inp.image"] = run_checked(
            inp, 12, h, w, prompt=PROMPT, negative_prompt=NEG, true_cfg_scale=2.0, image=init, mask_image=mask,
            strength=0.7, num_inference_steps=6, guidance_scale=3.5)
    # VaeImageProcessor's resize (PIL LANCZOS) of a picture of another size: up in one
    # axis, down in the other, RGB and L; the source is edit/resize_src.png
    src, _ = picture(57, 23, 5)
    src.save(os.path.join(OUT, "edit", "resize_src.png"))
    for name, img in (("rgb", src), ("luma", src.convert("L"))):
        for (w, h) in ((32, 48), (20, 12)):
            out = np.asarray(img.resize((w, h), Image.LANCZOS), dtype=np.float32)
            vec[f"resize.{name}.{w}x{h}"] = torch.from_numpy(out.copy())
    save_file(vec, os.path.join(OUT, "edit_vectors.safetensors"),
              metadata={"generator": "tools/parity/make_flux_edit_vectors.py", "prompt": PROMPT, "negative": NEG})
    print("wrote", len(vec), "tensors")


if __name__ == "__main__":
    main()
