"""Peer measurement for `difflet bench qwen-step`: diffusers' QwenImageTransformer2DModel
(the folder's one-block config) on the same weights and inputs, torch CPU, the same
dtype (default bf16) and thread count, called as QwenImagePipeline calls it for one
prompt: the prompt's own rows with no mask, img_shapes [[(1, gh, gw)]], timestep =
the pipeline's t / 1000.

    python qwen_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
INPUTS holds latents [N, in] (packed), prompt_embeds [L, joint_dim] (the valid rows),
timestep [1] (= t / 1000), grid [2] (packed gh, gw) (f32).
Prints one JSON line and writes the output tensor [N, out] as peer_common.py describes.
"""
import torch
from diffusers import QwenImageTransformer2DModel

import peer_common


def make_step(tr, x, dt):
    lat = x["latents"].to(dt)[None]
    txt = x["prompt_embeds"].to(dt)[None]
    t = torch.tensor([float(x["timestep"][0])])
    gh, gw = int(x["grid"][0]), int(x["grid"][1])
    return lambda: tr(hidden_states=lat, encoder_hidden_states=txt, encoder_hidden_states_mask=None, timestep=t,
                      img_shapes=[[(1, gh, gw)]], return_dict=False)[0]


if __name__ == "__main__":
    peer_common.run(QwenImageTransformer2DModel, make_step)
