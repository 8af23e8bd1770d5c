"""LTX-2 end to end: diffusers' LTX2Pipeline (0.42.1, pipelines/ltx2/pipeline_ltx2.py) on a complete tiny random
pipeline in the diffusers layout, called with explicit initial noise.

    tools/venv/bin/python tools/parity/make_ltx2_pipeline_vectors.py
Writes tests/data/ltx2/pipe/:
  model_index.json, scheduler/ (LTX-2's FlowMatchEulerDiscreteScheduler config: dynamic exponential shift,
  shift_terminal 0.1), difflet.json (the call's settings the request has no field for), and the components:
    tokenizer    -> ../../tok/gemma_tiny               (Gemma's tiny tokenizer)
    text_encoder -> ../text/text_encoder               (Gemma 3, 72 wide, 6 layers)
    vae          -> ../../ltx2_vae/a/vae               (8 latent channels, 12x spatial, 4x temporal, timestep conditioning)
    audio_vae    -> ../../ltx2_audio/a/audio_vae       (2 x 4 latent mel bins, 16 kHz, hop 160)
    vocoder      -> ../../ltx2_audio/a/vocoder         (stereo, 24 kHz)
    connectors/  new: LTX-2.3 generation, per-modality projections to 32 (video) / 24 (audio), 8 registers (bf16)
    transformer/ new: LTX-2.3 style (no caption projection, split RoPE, gated attention, prompt adaLN,
                 perturbed_attn so STG takes effect), 2 layers, video 2 x 16, audio 2 x 12 (bf16)
  vectors.safetensors (f32): latents [1, 8, 3, 8, 8] and audio_latents [1, 2, 9, 4] (the call's arguments),
  frames [F, H, W, 3] (output_type "np"; stored f16 to keep the file small: its rounding is ~75 dB below the signal), audio [2, samples] (the vocoder's waveform), and for locating a
  divergence: sigmas (the scheduler's), step<i>.latents (packed video latents after step i), final.video_z (the
  latents vae.decode gets), final.audio_z (what audio_vae.decode gets). The call's parameters are in the
  file's metadata.
The reference runs in f32 on exactly the stored bf16 values.
"""
import json
import os
import shutil

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline, LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from safetensors.torch import save_file
from transformers import Gemma3ForConditionalGeneration

OUT = os.path.join("tests", "data", "ltx2", "pipe")
LINKS = {"tokenizer": "../../tok/gemma_tiny", "text_encoder": "../text/text_encoder", "vae": "../../ltx2_vae/a/vae",
         "audio_vae": "../../ltx2_audio/a/audio_vae", "vocoder": "../../ltx2_audio/a/vocoder"}
CALL = dict(prompt="A red circle moves to the right.", negative_prompt="blurry, static", height=96, width=96,
            num_frames=9, frame_rate=24.0, num_inference_steps=3, guidance_scale=3.0, stg_scale=1.0,
            modality_scale=3.0, guidance_rescale=0.7, audio_guidance_scale=7.0, audio_stg_scale=1.0,
            audio_modality_scale=3.0, audio_guidance_rescale=0.7, spatio_temporal_guidance_blocks=[1],
            max_sequence_length=16, decode_timestep=0.0)
SCHED = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
             base_image_seq_len=1024, max_image_seq_len=4096, invert_sigmas=False, shift_terminal=0.1,
             use_karras_sigmas=False, use_exponential_sigmas=False, use_beta_sigmas=False,
             time_shift_type="exponential", stochastic_sampling=False)


def bf16_round(m):
    for _, p in m.named_parameters():
        p.copy_(p.bfloat16().float())


def main():
    torch.set_grad_enabled(False)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    for k, v in LINKS.items():
        os.symlink(v, os.path.join(OUT, k))
    torch.manual_seed(71)
    conn = LTX2TextConnectors(caption_channels=72, text_proj_in_factor=7, video_connector_num_attention_heads=2,
                              video_connector_attention_head_dim=16, video_connector_num_layers=1,
                              video_connector_num_learnable_registers=8, audio_connector_num_attention_heads=2,
                              audio_connector_attention_head_dim=12, audio_connector_num_layers=1,
                              audio_connector_num_learnable_registers=8, connector_rope_base_seq_len=64,
                              per_modality_projections=True, video_hidden_dim=32, audio_hidden_dim=24).eval()
    for name, p in conn.named_parameters():
        if "learnable_registers" not in name:
            p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn(p.shape) if p.dim() == 1
                    else torch.randn(p.shape) / p.shape[1] ** 0.5)
    bf16_round(conn)
    conn.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "connectors"))
    tr = LTX2VideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=16,
        cross_attention_dim=32, vae_scale_factors=(4, 12, 12), audio_in_channels=8, audio_out_channels=8,
        audio_num_attention_heads=2, audio_attention_head_dim=12, audio_cross_attention_dim=24, num_layers=2,
        caption_channels=72, gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
        rope_type="split", use_prompt_embeddings=False, perturbed_attn=True, audio_sampling_rate=16000,
        audio_hop_length=160, audio_scale_factor=4).eval()
    for _, p in tr.named_parameters():
        if p.dim() == 1:  # biases: not zero, so a missed one shows
            p.copy_(0.1 * torch.randn(p.shape))
    bf16_round(tr)
    tr.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "transformer"))
    FlowMatchEulerDiscreteScheduler(**SCHED).save_pretrained(os.path.join(OUT, "scheduler"))
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump({"_class_name": "LTX2Pipeline", "_diffusers_version": "0.42.1",
                   "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                   "vae": ["diffusers", "AutoencoderKLLTX2Video"], "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"],
                   "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
                   "tokenizer": ["transformers", "GemmaTokenizerFast"],
                   "connectors": ["ltx2", "LTX2TextConnectors"],
                   "transformer": ["diffusers", "LTX2VideoTransformer3DModel"],
                   "vocoder": ["ltx2", "LTX2Vocoder"]}, f, indent=2)
    with open(os.path.join(OUT, "difflet.json"), "w") as f:
        json.dump({"defaults": {"width": CALL["width"], "height": CALL["height"], "num_frames": CALL["num_frames"],
                                "fps": CALL["frame_rate"], "num_inference_steps": CALL["num_inference_steps"],
                                "max_sequence_length": CALL["max_sequence_length"],
                                "spatio_temporal_guidance_blocks": CALL["spatio_temporal_guidance_blocks"]}},
                  f, indent=2)

    # the text encoder loaded on its own: through the pipeline loader transformers 5 leaves a buffer on the meta device
    te = Gemma3ForConditionalGeneration.from_pretrained(os.path.join(OUT, "text_encoder"), dtype=torch.float32).eval()
    # the tiny VAEs hold decoders only: their (unused) encoders are made, not left on the meta device
    vae = AutoencoderKLLTX2Video.from_pretrained(os.path.join(OUT, "vae"), torch_dtype=torch.float32,
                                                 low_cpu_mem_usage=False)
    avae = AutoencoderKLLTX2Audio.from_pretrained(os.path.join(OUT, "audio_vae"), torch_dtype=torch.float32,
                                                  low_cpu_mem_usage=False)
    pipe = LTX2Pipeline.from_pretrained(OUT, text_encoder=te, vae=vae, audio_vae=avae, torch_dtype=torch.float32)
    assert pipe.vae_spatial_compression_ratio == 12 and pipe.vae_temporal_compression_ratio == 4
    g = torch.Generator().manual_seed(5)
    latents = torch.randn(1, 8, 3, 8, 8, generator=g)
    audio_latents = torch.randn(1, 2, 9, 4, generator=g)
    vec = {"latents": latents.clone(), "audio_latents": audio_latents.clone()}

    def on_step(p, i, t, kw):
        vec[f"step{i}.latents"] = kw["latents"][0].clone()
        return {}

    vdec, adec = pipe.vae.decode, pipe.audio_vae.decode

    def vae_decode(z, *a, **k):
        vec["final.video_z"] = z[0].clone()
        return vdec(z, *a, **k)

    def audio_decode(z, *a, **k):
        vec["final.audio_z"] = z[0].clone()
        return adec(z, *a, **k)

    pipe.vae.decode, pipe.audio_vae.decode = vae_decode, audio_decode
    video, audio = pipe(**CALL, latents=latents, audio_latents=audio_latents, generator=torch.Generator().manual_seed(0),
                        output_type="np", return_dict=False, callback_on_step_end=on_step)
    vec["sigmas"] = pipe.scheduler.sigmas.float().clone()
    vec["frames"] = torch.from_numpy(video[0]).half().contiguous()  # f16: 1e-4 relative, far below the 45 dB bar
    vec["audio"] = audio[0].float().contiguous()
    print("frames", tuple(vec["frames"].shape), "audio", tuple(vec["audio"].shape), "sigmas", vec["sigmas"].tolist(),
          "audio abs max", vec["audio"].abs().max().item(), "frames mean", vec["frames"].mean().item())
    meta = {k: json.dumps(v) for k, v in CALL.items()}
    meta["sample_rate"] = str(pipe.vocoder.config.output_sampling_rate)
    save_file({k: v.contiguous() for k, v in vec.items()}, os.path.join(OUT, "vectors.safetensors"), metadata=meta)
    new = 0
    for root, _, files in os.walk(OUT):
        for fn in files:
            if not os.path.islink(os.path.join(root, fn)) and not os.path.islink(root):
                new += os.path.getsize(os.path.join(root, fn))
    print("new bytes", new)


if __name__ == "__main__":
    main()
