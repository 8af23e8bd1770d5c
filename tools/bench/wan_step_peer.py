"""Peer measurement for `difflet bench wan-step`: diffusers' WanTransformer3DModel
(the folder's one-block config) on the same weights and inputs, torch CPU, the same
dtype (default bf16) and thread count.

    python wan_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
INPUTS holds latents [C, F, H, W], prompt_embeds [T, text_dim], timestep [1] (f32).
Prints one JSON line and writes the output tensor [C_out, F, H, W] as peer_common.py
describes.
"""
import torch
from diffusers import WanTransformer3DModel

import peer_common


def make_step(tr, x, dt):
    lat = x["latents"].to(dt)[None]
    txt = x["prompt_embeds"].to(dt)[None]
    t = torch.tensor([float(x["timestep"][0])])
    return lambda: tr(hidden_states=lat, timestep=t, encoder_hidden_states=txt, return_dict=False)[0]


if __name__ == "__main__":
    peer_common.run(WanTransformer3DModel, make_step)
