"""Peer measurement for `difflet bench hunyuan-step`: diffusers' HunyuanVideoTransformer3DModel
(the folder's one-dual-block, one-single-block config) on the same weights and inputs,
torch CPU, the same dtype (default bf16) and thread count, called as HunyuanVideoPipeline
calls it: every text row with the attention mask of its `valid` rows, the pooled CLIP
vector, timestep t (sigma x 1000) and guidance g x 1000.

    python hunyuan_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
INPUTS holds latents [C, F, H, W], prompt_embeds [T, text_embed_dim], valid [1] (the real
rows, first), pooled [pooled_projection_dim], timestep [1], guidance [1] (the scale) (f32).
Prints one JSON line and writes the output tensor [Cout, F, H, W] as peer_common.py
describes.
"""
import torch
from diffusers import HunyuanVideoTransformer3DModel

import peer_common


def make_step(tr, x, dt):
    lat = x["latents"].to(dt)[None]
    txt = x["prompt_embeds"].to(dt)[None]
    mask = torch.zeros(1, txt.shape[1], dtype=dt)  # the pipeline's prompt_attention_mask, cast to the model's dtype
    mask[:, :int(x["valid"][0])] = 1
    pooled = x["pooled"].to(dt)[None]
    t = torch.tensor([float(x["timestep"][0])])  # f32, as the pipeline passes it
    g = torch.tensor([float(x["guidance"][0])], dtype=dt) * 1000.0
    return lambda: tr(hidden_states=lat, timestep=t, encoder_hidden_states=txt, encoder_attention_mask=mask,
                      pooled_projections=pooled, guidance=g, return_dict=False)[0]


if __name__ == "__main__":
    peer_common.run(HunyuanVideoTransformer3DModel, make_step)
