"""FLUX parity vectors: a tiny random-weight FluxPipeline in the diffusers layout,
run by diffusers at a non-square size with fixed initial latents.

Run from the repository root with the tools virtualenv (make tools-venv), after
make_tokenizer_vectors.py and make_encoder_vectors.py:
    tools/venv/bin/python tools/parity/make_flux_vectors.py
Writes tests/data/flux/:
  dev/       FluxPipeline (save_pretrained): transformer with the guidance embedding
             (2 double + 2 single blocks, 2 heads x 32, RoPE axes 8+12+12), tiny
             AutoencoderKL (2 levels, 16/32 channels, 4 latent channels), and symlinks
             to the tiny CLIP and T5 (tests/data/enc) and their tokenizers (tests/data/tok)
  schnell/   the same pipeline, transformer without the guidance embedding (other
             components are symlinks into dev/)
  vectors.safetensors:
    <v>.step.*   one transformer call: inputs, output, and each block's outputs
    vae.*        one VAE decode: latent in, image out
    <v>.gen<k>.* whole pipeline, 4 steps, 48x32: initial packed latents, the image as
                 float [H, W, 3] in [0, 1]; k=0 plain, k=1 with true CFG
"""
import os
import shutil

import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from safetensors.torch import save_file
from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

ENC = os.path.join("tests", "data", "enc")
TOK = os.path.join("tests", "data", "tok")
OUT = os.path.join("tests", "data", "flux")
H, W, STEPS, MAXSEQ = 48, 32, 4, 32
PROMPT, NEG = "a red circle on a blue background", "blurry green square"


def randomize(model, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 1.0 if ("norm" in name and "weight" in name) else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * (scale / fan_in ** 0.5))


def transformer(guidance):
    torch.manual_seed(3)
    t = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=32,
                               num_attention_heads=2, joint_attention_dim=64, pooled_projection_dim=64,
                               guidance_embeds=guidance, axes_dims_rope=(8, 12, 12)).eval()
    randomize(t, 21 if guidance else 22)
    return t


def vae():
    torch.manual_seed(4)
    v = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                      up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), layers_per_block=1,
                      latent_channels=4, norm_num_groups=4, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
                      use_quant_conv=False, use_post_quant_conv=False).eval()
    randomize(v, 23)
    return v


def block_hooks(model, store, prefix):
    handles = []
    for kind, blocks in (("double", model.transformer_blocks), ("single", model.single_transformer_blocks)):
        for i, b in enumerate(blocks):
            def hook(mod, args, kwargs, out, i=i, kind=kind):
                enc, hid = out
                store[f"{prefix}.{kind}{i}.txt"] = enc[0].detach().clone()
                store[f"{prefix}.{kind}{i}.img"] = hid[0].detach().clone()
            handles.append(b.register_forward_hook(hook, with_kwargs=True))
    return handles


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    vec = {}
    scheduler = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096,
                                                max_shift=1.15, num_train_timesteps=1000, shift=3.0,
                                                use_dynamic_shifting=True)
    text_encoder = CLIPTextModel.from_pretrained(os.path.join(ENC, "clip")).eval()
    text_encoder_2 = T5EncoderModel.from_pretrained(os.path.join(ENC, "t5")).eval()
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(TOK, "clip_tiny"))
    tokenizer_2 = T5TokenizerFast.from_pretrained(os.path.join(TOK, "t5_tiny"))
    the_vae = vae()

    # VAE decode of a given latent
    g = torch.Generator().manual_seed(5)
    z = torch.randn(1, 4, H // 2, W // 2, generator=g)
    with torch.no_grad():
        vec["vae.latent"] = z[0].clone()
        vec["vae.image"] = the_vae.decode(z).sample[0].clone()

    for variant, guidance in (("dev", True), ("schnell", False)):
        tr = transformer(guidance)
        pipe = FluxPipeline(scheduler=scheduler, vae=the_vae, text_encoder=text_encoder, tokenizer=tokenizer,
                            text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, transformer=tr)
        path = os.path.join(OUT, variant)
        if variant == "dev":
            pipe.save_pretrained(path)
            # the text encoders and tokenizers are the committed encoder/tokenizer vectors: link, not copy
            for comp, target in (("text_encoder", "enc/clip"), ("text_encoder_2", "enc/t5"),
                                 ("tokenizer", "tok/clip_tiny"), ("tokenizer_2", "tok/t5_tiny")):
                shutil.rmtree(os.path.join(path, comp))
                os.symlink(os.path.join("..", "..", target), os.path.join(path, comp))
        else:
            os.makedirs(path)
            tr.save_pretrained(os.path.join(path, "transformer"))
            shutil.copy(os.path.join(OUT, "dev", "model_index.json"), path)
            for comp in ("vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"):
                os.symlink(os.path.join("..", "dev", comp), os.path.join(path, comp))

        # one transformer call, with every block's output
        g = torch.Generator().manual_seed(6)
        n_img = (H // 4) * (W // 4)
        lat = torch.randn(1, n_img, 16, generator=g)
        emb = torch.randn(1, MAXSEQ, 64, generator=g)
        pooled = torch.randn(1, 64, generator=g)
        img_ids = FluxPipeline._prepare_latent_image_ids(1, H // 4, W // 4, "cpu", torch.float32)
        txt_ids = torch.zeros(MAXSEQ, 3)
        key = f"{variant}.step"
        handles = block_hooks(tr, vec, key)
        with torch.no_grad():
            out = tr(hidden_states=lat, encoder_hidden_states=emb, pooled_projections=pooled,
                     timestep=torch.tensor([0.7]), img_ids=img_ids, txt_ids=txt_ids,
                     guidance=torch.tensor([3.5]) if guidance else None, return_dict=False)[0]
        for h in handles:
            h.remove()
        vec[key + ".latents"] = lat[0].clone()
        vec[key + ".prompt_embeds"] = emb[0].clone()
        vec[key + ".pooled"] = pooled[0].clone()
        vec[key + ".out"] = out[0].clone()

        # the whole pipeline from fixed packed latents
        for k, (neg, cfg) in enumerate(((None, 1.0), (NEG, 2.0))):
            g = torch.Generator().manual_seed(7)
            init = torch.randn(1, n_img, 16, generator=g)
            with torch.no_grad():
                img = pipe(prompt=PROMPT, negative_prompt=neg, true_cfg_scale=cfg, height=H, width=W,
                           num_inference_steps=STEPS, guidance_scale=3.5, latents=init.clone(),
                           max_sequence_length=MAXSEQ, output_type="np").images[0]
            key = f"{variant}.gen{k}"
            vec[key + ".latents"] = init[0].clone()
            vec[key + ".image"] = torch.from_numpy(np.ascontiguousarray(img)).float()
    save_file(vec, os.path.join(OUT, "vectors.safetensors"), metadata={"generator": "tools/parity/make_flux_vectors.py",
                                                                        "prompt": PROMPT, "negative": NEG})
    print("wrote", OUT, len(vec), "tensors")


if __name__ == "__main__":
    main()
