"""LTX-2 transformer parity vectors: tiny random LTX2VideoTransformer3DModel (diffusers 0.42.1,
models/transformers/transformer_ltx2.py) in the diffusers layout and one forward of each.

    tools/venv/bin/python tools/parity/make_ltx2_transformer_vectors.py
Writes tests/data/ltx2/transformer_{a,b} (model_index.json, transformer/: config.json + bf16 weights; the f32 reference runs on
exactly those values, loaded back in f32) and tests/data/ltx2/transformer_vectors.safetensors:
  a: LTX-2.0 style: caption projections, interleaved RoPE (video width 32: 32 % 6 = 2 padded
     pairs), default VAE scale factors, 2 x 16 video / 2 x 8 audio heads, use_cross_timestep off
  b: LTX-2.3 style: no caption projections, split RoPE (with padding), gated attention, video
     cross_attn_mod (prompt adaLN) but not audio, f32 RoPE frequencies, 2 x 2 patches, other
     scale factors / bases / fps / sampling rate, a cross-attention gate multiplier of 500 / 1000,
     no feed-forward biases, norm_eps 1e-5, use_cross_timestep on
  <c>.video [Nv, in], <c>.audio [Na, audio_in], <c>.text [T, Ct], <c>.audio_text [T, Cta] (f32);
  <c>.grid = (latent frames, latent height, latent width, audio frames, fps);
  <c>.t = (timestep, audio_timestep, sigma, audio_sigma, use_cross_timestep);
  outputs <c>.out_video [Nv, out], <c>.out_audio [Na, audio_out].
"""
import json
import os
import shutil

import torch
from diffusers import LTX2VideoTransformer3DModel
from safetensors.torch import save_file

OUT = os.path.join("tests", "data", "ltx2")
T = 8
CONFIGS = {
    "a": dict(
        cfg=dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                 audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=8,
                 audio_cross_attention_dim=16, num_layers=2, caption_channels=24),
        grid=(3, 4, 6, 10, 24.0), t=(730.5, 412.25, 730.5, 412.25, False)),
    "b": dict(
        cfg=dict(in_channels=12, out_channels=10, patch_size=2, patch_size_t=1, num_attention_heads=2,
                 attention_head_dim=14, cross_attention_dim=28, vae_scale_factors=(4, 16, 16), pos_embed_max_pos=10,
                 base_height=512, base_width=768, gated_attn=True, cross_attn_mod=True, audio_in_channels=6,
                 audio_out_channels=6, audio_num_attention_heads=2, audio_attention_head_dim=10,
                 audio_cross_attention_dim=20, audio_scale_factor=2, audio_pos_embed_max_pos=24,
                 audio_sampling_rate=8000, audio_hop_length=100, audio_gated_attn=True, audio_cross_attn_mod=False,
                 num_layers=2, norm_eps=1e-5, rope_theta=1000.0, rope_double_precision=False,
                 cross_attn_timestep_scale_multiplier=500, rope_type="split", use_prompt_embeddings=False,
                 perturbed_attn=True, ff_bias=False, audio_ff_bias=True),
        grid=(2, 6, 8, 9, 25.0), t=(650.0, 300.0, 640.0, 310.0, True)),
}


def main():
    torch.set_grad_enabled(False)
    vec = {}
    for i, (name, c) in enumerate(CONFIGS.items()):
        torch.manual_seed(50 + i)
        m = LTX2VideoTransformer3DModel(**c["cfg"]).eval()
        for pname, p in m.named_parameters():
            if p.dim() == 1:  # biases: not zero, so a missed one shows
                p.copy_(0.1 * torch.randn(p.shape))
            p.copy_(p.bfloat16().float())  # stored bf16: the f32 run uses exactly these values
        root = os.path.join(OUT, f"transformer_{name}")
        shutil.rmtree(root, ignore_errors=True)
        path = os.path.join(root, "transformer")
        m.to(torch.bfloat16).save_pretrained(path)
        with open(os.path.join(root, "model_index.json"), "w") as f:
            json.dump({"_class_name": "LTX2Pipeline", "transformer": ["diffusers", "LTX2VideoTransformer3DModel"]}, f)
        m = LTX2VideoTransformer3DModel.from_pretrained(path, torch_dtype=torch.float32).eval()
        cfg = m.config
        F, H, W, Na, fps = c["grid"]
        p, pt = cfg.patch_size, cfg.patch_size_t
        Nv = (F // pt) * (H // p) * (W // p)
        g = torch.Generator().manual_seed(60 + i)
        video = torch.randn(1, Nv, cfg.in_channels, generator=g)
        audio = torch.randn(1, Na, cfg.audio_in_channels, generator=g)
        ct = cfg.caption_channels if cfg.use_prompt_embeddings else cfg.cross_attention_dim
        cta = cfg.caption_channels if cfg.use_prompt_embeddings else cfg.audio_cross_attention_dim
        text = torch.randn(1, T, ct, generator=g)
        atext = torch.randn(1, T, cta, generator=g)
        tv, ta, sv, sa, cross = c["t"]
        ov, oa = m(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                   audio_encoder_hidden_states=atext, timestep=torch.tensor([tv]), audio_timestep=torch.tensor([ta]),
                   sigma=torch.tensor([sv]), audio_sigma=torch.tensor([sa]),
                   encoder_attention_mask=torch.ones(1, T), audio_encoder_attention_mask=torch.ones(1, T),
                   num_frames=F, height=H, width=W, fps=fps, audio_num_frames=Na, use_cross_timestep=cross,
                   return_dict=False)
        vec[f"{name}.video"] = video[0].clone()
        vec[f"{name}.audio"] = audio[0].clone()
        vec[f"{name}.text"] = text[0].clone()
        vec[f"{name}.audio_text"] = atext[0].clone()
        vec[f"{name}.grid"] = torch.tensor([F, H, W, Na, fps], dtype=torch.float32)
        vec[f"{name}.t"] = torch.tensor([tv, ta, sv, sa, float(cross)], dtype=torch.float32)
        vec[f"{name}.out_video"] = ov[0].clone()
        vec[f"{name}.out_audio"] = oa[0].clone()
        print(name, "video", tuple(ov.shape), "audio", tuple(oa.shape), "max", ov.abs().max().item(),
              oa.abs().max().item(), "bytes", sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)))
    save_file(vec, os.path.join(OUT, "transformer_vectors.safetensors"))
    print("wrote", len(vec), "tensors")


if __name__ == "__main__":
    main()
