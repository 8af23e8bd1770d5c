"""Qwen-Image parity vectors: two tiny random-weight QwenImagePipelines in the
diffusers layout with a tokenizer trained here, run by diffusers at non-square sizes
with fixed initial latents.

Run from the repository root with the tools virtualenv (make tools-venv):
    tools/venv/bin/python tools/parity/make_qwenimage_vectors.py
Writes tests/data/qwenimage/:
  tok/  a Qwen2-style tokenizer (byte-level BPE with Qwen2's pre-tokenisation regex and
        NFC, <|endoftext|> <|im_start|> <|im_end|> and the vision specials as added
        tokens), trained on captions, the pipeline's prompt template and a mixed corpus
  a/    QwenImagePipeline (save_pretrained): Qwen2_5_VLForConditionalGeneration (text:
        2 layers, hidden 64, 4 heads / 2 KV heads, mrope [2, 3, 3], theta 1e6; a tiny
        vision tower the text path never uses), the tokenizer, QwenImageTransformer2DModel
        (2 layers, 2 heads x 32, axes (8, 12, 12), joint dim 64, in 16 = 4 x z 4),
        AutoencoderKLQwenImage (base 8, z 4, dim_mult (1, 2, 2): 4x), the pipeline's
        FlowMatchEulerDiscreteScheduler config (dynamic shift, shift_terminal 0.02)
  b/    the same text encoder and tokenizer (symlinks into a/); transformer with 3
        layers, 3 heads x 24, axes (8, 8, 8), in 32 = 4 x z 8; VAE base 8, z 8,
        dim_mult (1, 2, 2, 2): 8x
  vectors.safetensors, for each pipeline <v> in (a, b), k in 0..len(PROMPTS):
    <v>.text<k>.ids / .hidden / .embeds   the template-wrapped prompt's ids, the text
                                          encoder's hidden_states[-1], and prompt_embeds
                                          (template prefix dropped)
    <v>.step.latents / .t / .txt / .out   one transformer call (packed latents [N, 4z],
                                          timestep / 1000, prompt_embeds of PROMPTS[0])
    <v>.vae.z / .image                    AutoencoderKLQwenImage.decode of [z, 1, h, w]
    <v>.gen<k>.latents / .image           the whole pipeline, STEPS steps, packed initial
                                          latents, image [H, W, 3] in [0, 1] (np); k = 0 true
                                          CFG 4 with NEG, k = 1 without a negative prompt
"""
import json
import os
import shutil

import numpy as np
import torch
from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                       QwenImageTransformer2DModel)
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2TokenizerFast

OUT = os.path.join("tests", "data", "qwenimage")
STEPS = 4
PROMPTS = ["a red circle on a blue background", "A cosy kitchen: two cats bake a cake, sunlight through the window, "
           "flour everywhere, 4K, ultra detailed, warm colours"]
NEG = "blurry, low quality"
SIZES = {"a": (48, 32), "b": (32, 64)}  # width, height
QWEN_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
            r"|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
SCHED = {"base_image_seq_len": 256, "base_shift": 0.5, "invert_sigmas": False, "max_image_seq_len": 8192,
         "max_shift": 0.9, "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": 0.02,
         "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
         "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False}


def corpus():
    words = ["red", "green", "blue", "yellow", "circle", "square", "triangle", "cat", "dog", "kitchen", "window",
             "sunlight", "background", "a", "the", "on", "in", "with", "two", "small", "large", "cosy", "bake",
             "cake", "flour", "everywhere", "ultra", "detailed", "warm", "colours", "quality", "blurry", "low"]
    g = np.random.default_rng(5)
    lines = [" ".join(g.choice(words, size=g.integers(3, 12))) for _ in range(3000)]
    lines += PROMPTS + [NEG, QwenImagePipeline.__init__.__doc__ or ""]
    lines += ["<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
              "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"]
    lines += ["日本語のテキスト 中文提示词 한국어 😀🎉 123 4567 x=1; y += 2 // code", "naïve café Ωmega ﬁre"]
    return lines


def tokenizer(path):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    t = Qwen2TokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", unk_token=None,
                           pad_token="<|endoftext|>", errors="replace", model_max_length=131072)
    t.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    t.add_tokens([SPECIALS[0]], special_tokens=True)
    t.save_pretrained(path)
    return Qwen2TokenizerFast.from_pretrained(path)


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


def text_encoder(vocab):
    torch.manual_seed(5)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0],
                           window_size=112),
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    m = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    randomize(m, 61)
    return m


def transformer(v):
    torch.manual_seed(6)
    if v == "a":
        t = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                        attention_head_dim=32, num_attention_heads=2, joint_attention_dim=64,
                                        axes_dims_rope=(8, 12, 12))
    else:
        t = QwenImageTransformer2DModel(patch_size=2, in_channels=32, out_channels=8, num_layers=3,
                                        attention_head_dim=24, num_attention_heads=3, joint_attention_dim=64,
                                        axes_dims_rope=(8, 8, 8))
    randomize(t.eval(), 71 if v == "a" else 72)
    return t


def vae(v):
    torch.manual_seed(7)
    if v == "a":
        m = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=1, attn_scales=[],
                                   temperal_downsample=[False, True], latents_mean=[0.1, -0.2, 0.3, -0.05],
                                   latents_std=[1.5, 0.8, 2.0, 1.2])
    else:
        m = AutoencoderKLQwenImage(base_dim=8, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                                   temperal_downsample=[False, True, True],
                                   latents_mean=[0.1, -0.2, 0.3, -0.05, 0.0, 0.2, -0.1, 0.05],
                                   latents_std=[1.5, 0.8, 2.0, 1.2, 1.0, 0.9, 1.1, 1.3])
    randomize(m.eval(), 81 if v == "a" else 82, scale=0.9)
    return m


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    tok = tokenizer(os.path.join(OUT, "tok"))
    te = text_encoder(len(tok))
    vec = {}
    for v in ("a", "b"):
        W, H = SIZES[v]
        pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHED), vae=vae(v), text_encoder=te,
                                 tokenizer=tok, transformer=transformer(v))
        path = os.path.join(OUT, v)
        if v == "a":
            pipe.save_pretrained(path)
        else:
            os.makedirs(path)
            for c in ("transformer", "vae", "scheduler"):
                getattr(pipe, c).save_pretrained(os.path.join(path, c))
            shutil.copy(os.path.join(OUT, "a", "model_index.json"), path)
            for c in ("text_encoder", "tokenizer"):
                os.symlink(os.path.join("..", "a", c), os.path.join(path, c))
        pipe = QwenImagePipeline.from_pretrained(path)
        z = pipe.vae.config.z_dim
        with torch.no_grad():
            for k, p in enumerate(PROMPTS):
                txt = pipe.prompt_template_encode.format(p)
                ti = pipe.tokenizer([txt], max_length=1024 + 34, padding=True, truncation=True, return_tensors="pt")
                hid = pipe.text_encoder(input_ids=ti.input_ids, attention_mask=ti.attention_mask,
                                        output_hidden_states=True).hidden_states[-1]
                emb, _ = pipe.encode_prompt(p, max_sequence_length=512)
                vec[f"{v}.text{k}.ids"] = ti.input_ids[0].to(torch.int32)
                vec[f"{v}.text{k}.hidden"] = hid[0]
                vec[f"{v}.text{k}.embeds"] = emb[0]
            emb, mask = pipe.encode_prompt(PROMPTS[0], max_sequence_length=512)
            lh, lw = H // pipe.vae_scale_factor, W // pipe.vae_scale_factor
            g = torch.Generator().manual_seed(11)
            lat = torch.randn(1, (lh // 2) * (lw // 2), 4 * z, generator=g)
            t = torch.tensor([0.62])
            out = pipe.transformer(hidden_states=lat, timestep=t, encoder_hidden_states=emb,
                                   encoder_hidden_states_mask=mask, img_shapes=[[(1, lh // 2, lw // 2)]],
                                   return_dict=False)[0]
            vec[f"{v}.step.latents"], vec[f"{v}.step.t"], vec[f"{v}.step.txt"], vec[f"{v}.step.out"] = lat[0], t, emb[0], out[0]
            zz = torch.randn(1, z, 1, lh, lw, generator=g) * 1.5
            img = pipe.vae.decode(zz, return_dict=False)[0]
            vec[f"{v}.vae.z"], vec[f"{v}.vae.image"] = zz[0], img[0]
            print(f"{v}: text {emb.shape}, step out std {out.std():.3f}, vae range [{img.min():.2f}, {img.max():.2f}] "
                  f"clamped {(img.abs() >= 1).float().mean():.3f}")
            for k in range(2):
                init = torch.randn(1, (lh // 2) * (lw // 2), 4 * z, generator=g)
                image = pipe(prompt=PROMPTS[k % 2], negative_prompt=NEG if k == 0 else None, height=H, width=W,
                             num_inference_steps=STEPS, true_cfg_scale=4.0, latents=init.clone(),
                             output_type="np").images[0]
                vec[f"{v}.gen{k}.latents"] = init[0]
                vec[f"{v}.gen{k}.image"] = torch.from_numpy(np.ascontiguousarray(image)).float()
                print(f"{v}.gen{k}: image {image.shape}, mean {image.mean():.3f} std {image.std():.3f}")
    save_file({k: t.contiguous() for k, t in vec.items()}, os.path.join(OUT, "vectors.safetensors"))
    with open(os.path.join(OUT, "vectors.json"), "w") as f:
        json.dump({"prompts": PROMPTS, "negative_prompt": NEG, "steps": STEPS, "sizes": SIZES,
                   "true_cfg_scale": 4.0, "max_sequence_length": 512}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
