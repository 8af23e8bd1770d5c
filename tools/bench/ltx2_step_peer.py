"""Peer measurement for `difflet bench ltx2-step`: diffusers' LTX2VideoTransformer3DModel
(the folder's one-block config) on the same weights and inputs, torch CPU, the same dtype
(default bf16) and thread count, called as LTX2Pipeline's denoising loop calls it: timestep
= sigma = t (the scheduler's timestep, f32) for both streams, the connectors' all-ones
attention mask for both text streams, use_cross_timestep on (the pipeline's default), the
video and audio RoPE coordinates prepared once before the loop.

    python ltx2_step_peer.py MODEL_DIR INPUTS.safetensors OUT.safetensors THREADS REPS [bf16|f32 [WARMUP]]
INPUTS holds video [Nv, in_channels], audio [Na, audio_in_channels] (packed latents),
text [T, caption_channels], audio_text [T, caption_channels], grid [5] (latent frames,
height, width, audio frames, fps), timestep [1] (f32). Prints one JSON line and writes the
output as peer_common.py describes: the video then the audio velocity rows concatenated,
[Nv + Na, 128] (both streams have 128 output channels).
"""
import torch
from diffusers import LTX2VideoTransformer3DModel

import peer_common


def make_step(tr, x, dt):
    video = x["video"].to(dt)[None]
    audio = x["audio"].to(dt)[None]
    text = x["text"].to(dt)[None]
    audio_text = x["audio_text"].to(dt)[None]
    F, H, W, Na = (int(v) for v in x["grid"][:4])
    fps = float(x["grid"][4])
    mask = torch.ones(1, text.shape[1], dtype=torch.int64)  # the connectors' binary mask: every row kept
    t = torch.tensor([float(x["timestep"][0])])  # f32, as the scheduler gives it
    video_coords = tr.rope.prepare_video_coords(1, F, H, W, video.device, fps=fps)
    audio_coords = tr.audio_rope.prepare_audio_coords(1, Na, audio.device)

    def step():
        ov, oa = tr(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                    audio_encoder_hidden_states=audio_text, timestep=t, sigma=t, encoder_attention_mask=mask,
                    audio_encoder_attention_mask=mask, num_frames=F, height=H, width=W, fps=fps,
                    audio_num_frames=Na, video_coords=video_coords, audio_coords=audio_coords,
                    isolate_modalities=False, spatio_temporal_guidance_blocks=None, perturbation_mask=None,
                    use_cross_timestep=True, return_dict=False)
        return torch.cat([ov, oa], dim=1)

    return step


if __name__ == "__main__":
    peer_common.run(LTX2VideoTransformer3DModel, make_step)
