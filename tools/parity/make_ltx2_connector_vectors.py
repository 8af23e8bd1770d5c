"""LTX-2 text connector parity vectors: tiny random LTX2TextConnectors (diffusers 0.42.1,
pipelines/ltx2/connectors.py) in the diffusers layout and what they compute.

    tools/venv/bin/python tools/parity/make_ltx2_connector_vectors.py
Writes tests/data/ltx2/{a,b}/connectors (config.json + weights) and
tests/data/ltx2/connector_vectors.safetensors:
  a: LTX-2.0 generation: one text_proj_in after the per-layer masked mean/range norm,
     8 learnable registers per connector, interleaved RoPE, video 2 x 16 / audio 4 x 8 heads
  b: LTX-2.3 generation: per-token RMS norm and per-modality projections (with biases),
     no registers (padded keys masked), split RoPE, gated attention, f32 RoPE frequencies
  <c>.<k>.hidden [T, C * L1]: the stacked Gemma hidden states as the pipeline packs them
  (torch.stack(hidden_states, -1).flatten(2, 3)), LEFT padded; <c>.<k>.valid; and the
  connectors' outputs <c>.<k>.video [T, Dv], <c>.<k>.audio [T, Da], f32, for a
  partly padded prompt (k = pad) and a full one (k = full).
"""
import os
import shutil

import torch
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from safetensors.torch import save_file

OUT = os.path.join("tests", "data", "ltx2")
T, C, L1 = 16, 32, 3
CONFIGS = {
    "a": dict(caption_channels=C, text_proj_in_factor=L1, video_connector_num_attention_heads=2,
              video_connector_attention_head_dim=16, video_connector_num_layers=2,
              video_connector_num_learnable_registers=8, audio_connector_num_attention_heads=4,
              audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
              audio_connector_num_learnable_registers=8, connector_rope_base_seq_len=32, rope_theta=10000.0,
              rope_double_precision=True, rope_type="interleaved", per_modality_projections=False),
    "b": dict(caption_channels=C, text_proj_in_factor=L1, video_connector_num_attention_heads=2,
              video_connector_attention_head_dim=24, video_connector_num_layers=2,
              video_connector_num_learnable_registers=None, video_gated_attn=True,
              audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=16,
              audio_connector_num_layers=2, audio_connector_num_learnable_registers=None, audio_gated_attn=True,
              connector_rope_base_seq_len=64, rope_theta=1000.0, rope_double_precision=False, rope_type="split",
              per_modality_projections=True, video_hidden_dim=48, audio_hidden_dim=32, proj_bias=True),
}


def main():
    torch.set_grad_enabled(False)
    vec = {}
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        torch.manual_seed(30 + i)
        m = LTX2TextConnectors(**cfg).eval()
        for pname, p in m.named_parameters():
            if "learnable_registers" in pname:
                continue  # their own uniform(-1, 1) init
            if p.dim() == 1:
                p.copy_((1.0 if "norm" in pname else 0.0) + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / p.shape[1] ** 0.5)
        path = os.path.join(OUT, name, "connectors")
        shutil.rmtree(path, ignore_errors=True)
        m.save_pretrained(path)
        g = torch.Generator().manual_seed(40 + i)
        for key, valid in (("pad", 5), ("full", T)):
            hidden = torch.randn(1, T, C * L1, generator=g) * 3.0
            mask = torch.zeros(1, T, dtype=torch.long)
            mask[:, T - valid:] = 1
            video, audio, _ = m(hidden, mask, padding_side="left")
            vec[f"{name}.{key}.hidden"] = hidden[0].clone()
            vec[f"{name}.{key}.valid"] = torch.tensor([float(valid)])
            vec[f"{name}.{key}.video"] = video[0].clone()
            vec[f"{name}.{key}.audio"] = audio[0].clone()
    save_file(vec, os.path.join(OUT, "connector_vectors.safetensors"))
    print("wrote", len(vec), "tensors")


if __name__ == "__main__":
    main()
