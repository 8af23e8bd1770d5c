"""LTX-2 audio decoder vectors: tiny random audio VAEs and vocoders, diffusers' outputs.

Run from the repository root with the tools virtualenv (deterministic: fixed seeds,
so a rerun rewrites the same files):
    tools/venv/bin/python tools/parity/make_ltx2_audio_vectors.py
Writes tests/data/ltx2_audio/<f>/ for each fixture folder <f>:
    model_index.json                 a pipeline naming its components
    audio_vae/config.json, audio_vae/diffusion_pytorch_model.safetensors
        AutoencoderKLLTX2Audio.save_pretrained in bf16 (to keep the fixtures small;
        the references run in f32 on exactly those weights), less encoder.* (the
        decoder's weights and latents_mean / latents_std only)
    vocoder/config.json, vocoder/diffusion_pytorch_model.safetensors
        LTX2Vocoder.save_pretrained, bf16 likewise
and tests/data/ltx2_audio/vectors.safetensors (f32), for each VAE case <c>:
    <c>.packed  [L, C M] audio latents as the transformer leaves them (packed, normalised)
    <c>.z       [C, L, M] after the pipeline's _denormalize_audio_latents and
                _unpack_audio_latents (what audio_vae.decode takes)
    <c>.mel     [out_channels, max(4 L - 3, 1), mel_bins] audio_vae.decode(z).sample
and for each vocoder case <c>:
    <c>.mel     [in_channels, T] the vocoder's input with time last
    <c>.wave    [out_channels, samples] vocoder(mel, time_last=True)
and the pipeline case pipe (VAE a then vocoder a, as LTX2Pipeline's audio tail):
    pipe.packed, pipe.wave
and for each LTX2VocoderWithBWE case <c> (fixtures e, f: tests/data/ltx2_audio/<f>/vocoder
only, bf16 likewise; mel_stft.stft_fn.forward_basis a Hann-windowed DFT basis and
mel_stft.mel_basis a random non-negative filterbank, as the real checkpoint stores them;
the resampler's Hann-sinc filter is not stored and stays f32 in the reference):
    <c>.mel     [in_channels, T] the input with time last
    <c>.wave    [out_channels, samples] the clamped, cut BWE output
Fixtures (M = mel_bins / 4 latent mel bins; base_channels = C M, the size of the
latents_mean / latents_std the pipeline applies to packed latents):
    a  VAE causality_axis height, pixel norm, ch_mult (1, 2, 4), 1 res block, mid
       attention and attention at the lowest resolution, C 2, mel_bins 16;
       vocoder leaky_relu, kernels [16, 15] factors [6, 5] (the real model's first
       two), resnets k [3, 7], tanh
    b  VAE causality_axis width, pixel norm, ch_mult (1, 2), 2 res blocks, C 4,
       mel_bins 8 (the decoder's output is cropped / zero-padded to 4 L - 3 x 8);
       vocoder snakebeta with the anti-aliased activation, kernels [11, 5] factors
       [5, 2] (5 - 2 odd: 2 T + 1 samples), no final activation or bias
    c  VAE causality_axis none, group norm (32 groups), ch_mult (1, 1), mid
       attention, C 2, mel_bins 64; vocoder snake (no beta in the resnets), no
       antialias in the resnets, clamp (weights at their default scale: about a
       quarter of the samples clamped)
    d  VAE causality_axis width-compatibility, pixel norm, ch_mult (1, 2), no
       extra res blocks (num_res_blocks 0), C 2, mel_bins 8; vocoder leaky_relu
       with slope 0.2 and one stage
    e  LTX2VocoderWithBWE: stage 1 snakebeta anti-aliased, factors [4, 2]; STFT
       filter 64 / hop 16 / window 64, 8 mel bins; BWE generator snakebeta with
       factors [6, 4, 2] (= 3 x hop), 16000 -> 48000 Hz (resampler ratio 3); 7 frames
       give 56 samples, padded to 64 for the STFT
    f  LTX2VocoderWithBWE: stage 1 leaky_relu with tanh and bias, one output
       channel; STFT 32 / 8 / 32, 6 mel bins; BWE generator snake without
       antialias, tanh and bias, factors [4, 4]; 24000 -> 48000 Hz (ratio 2)
Every norm-free parameter and the latent statistics are random.
"""
import json
import os

import torch
from diffusers import AutoencoderKLLTX2Audio
from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE
from safetensors.torch import load_file, save_file

ROOT = "tests/data/ltx2_audio"
VAES = {
    "a": dict(base_channels=8, ch_mult=(1, 2, 4), num_res_blocks=1, attn_resolutions=(64,), latent_channels=2,
              norm_type="pixel", causality_axis="height", mid_block_add_attention=True, mel_bins=16, seed=1),
    "b": dict(base_channels=8, ch_mult=(1, 2), num_res_blocks=2, attn_resolutions=None, latent_channels=4,
              norm_type="pixel", causality_axis="width", mid_block_add_attention=False, mel_bins=8, seed=2),
    "c": dict(base_channels=32, ch_mult=(1, 1), num_res_blocks=1, attn_resolutions=None, latent_channels=2,
              norm_type="group", causality_axis="none", mid_block_add_attention=True, mel_bins=64, seed=3),
    "d": dict(base_channels=4, ch_mult=(1, 2), num_res_blocks=0, attn_resolutions=None, latent_channels=2,
              norm_type="pixel", causality_axis="width-compatibility", mid_block_add_attention=False, mel_bins=8,
              seed=4),
}
VOCODERS = {
    "a": dict(in_channels=32, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[16, 15],
              upsample_factors=[6, 5], resnet_kernel_sizes=[3, 7], resnet_dilations=[[1, 3, 5], [1, 3]],
              act_fn="leaky_relu", antialias=False, final_act_fn="tanh", final_bias=True,
              output_sampling_rate=24000, seed=5),
    "b": dict(in_channels=16, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[11, 5],
              upsample_factors=[5, 2], resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 3], [2]],
              act_fn="snakebeta", antialias=True, antialias_ratio=2, antialias_kernel_size=12, final_act_fn=None,
              final_bias=False, output_sampling_rate=16000, seed=6),
    "c": dict(in_channels=12, hidden_channels=8, out_channels=1, upsample_kernel_sizes=[8, 4],
              upsample_factors=[4, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 2]], act_fn="snake",
              antialias=False, final_act_fn="clamp", final_bias=True, output_sampling_rate=8000, seed=7,
              scale=1.0),
    "d": dict(in_channels=16, hidden_channels=8, out_channels=2, upsample_kernel_sizes=[4], upsample_factors=[2],
              resnet_kernel_sizes=[3, 5], resnet_dilations=[[1], [1, 3]], act_fn="leaky_relu",
              leaky_relu_negative_slope=0.2, antialias=False, final_act_fn="tanh", final_bias=True,
              output_sampling_rate=22050, seed=8),
}
BWES = {
    "e": dict(in_channels=16, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[8, 4], upsample_factors=[4, 2],
              resnet_kernel_sizes=[3], resnet_dilations=[[1, 3]], act_fn="snakebeta", antialias=True,
              final_act_fn=None, final_bias=False, bwe_in_channels=16, bwe_hidden_channels=16, bwe_out_channels=2,
              bwe_upsample_kernel_sizes=[12, 8, 4], bwe_upsample_factors=[6, 4, 2], bwe_resnet_kernel_sizes=[3, 5],
              bwe_resnet_dilations=[[1, 2], [1]], bwe_act_fn="snakebeta", bwe_antialias=True, bwe_final_act_fn=None,
              bwe_final_bias=False, filter_length=64, hop_length=16, window_length=64, num_mel_channels=8,
              input_sampling_rate=16000, output_sampling_rate=48000, seed=41, scale=0.5),
    "f": dict(in_channels=12, hidden_channels=8, out_channels=1, upsample_kernel_sizes=[11, 4], upsample_factors=[5, 2],
              resnet_kernel_sizes=[3, 5], resnet_dilations=[[1], [1, 2]], act_fn="leaky_relu", antialias=False,
              final_act_fn="tanh", final_bias=True, bwe_in_channels=6, bwe_hidden_channels=8, bwe_out_channels=1,
              bwe_upsample_kernel_sizes=[8, 8], bwe_upsample_factors=[4, 4], bwe_resnet_kernel_sizes=[3],
              bwe_resnet_dilations=[[1, 2]], bwe_act_fn="snake", bwe_antialias=False, bwe_final_act_fn="tanh",
              bwe_final_bias=True, filter_length=32, hop_length=8, window_length=32, num_mel_channels=6,
              input_sampling_rate=24000, output_sampling_rate=48000, seed=42),
}
# BWE case: (fixture, mel frames, seed)
BWE_CASES = {"we.seven": ("e", 7, 51), "we.two": ("e", 2, 52), "wf.six": ("f", 6, 53)}
# VAE case: (fixture, latent frames L, seed); the latent mel bins are mel_bins / 4
VAE_CASES = {"a.five": ("a", 5, 11), "a.one": ("a", 1, 12), "b.three": ("b", 3, 13), "b.one": ("b", 1, 14),
             "c.four": ("c", 4, 15), "d.six": ("d", 6, 16)}
# vocoder case: (fixture, mel frames, seed)
VOC_CASES = {"va.seven": ("a", 7, 21), "vb.six": ("b", 6, 22), "vb.one": ("b", 1, 23), "vc.nine": ("c", 9, 24),
             "vd.five": ("d", 5, 25)}


def bf16_round(model):
    with torch.no_grad():
        for p in list(model.parameters()) + list(model.buffers()):
            p.copy_(p.to(torch.bfloat16).float())
    return model


def make_vae(cfg):
    cfg = dict(cfg)
    torch.manual_seed(cfg.pop("seed"))
    vae = AutoencoderKLLTX2Audio(output_channels=2, in_channels=2, resolution=256, **cfg).float().eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "norm" in name and name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
        vae.latents_mean.copy_(0.5 * torch.randn_like(vae.latents_mean))
        vae.latents_std.copy_(0.5 + torch.rand_like(vae.latents_std))
    return bf16_round(vae)


def make_vocoder(cfg):
    cfg = dict(cfg)
    torch.manual_seed(cfg.pop("seed"))
    scale = cfg.pop("scale", 2.0)
    voc = LTX2Vocoder(**cfg).float().eval()
    with torch.no_grad():
        for name, p in voc.named_parameters():
            if name.endswith(".alpha") or name.endswith(".beta"):  # log-scale; zeros by default
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith(".weight"):  # the default init is small: keep the signal alive (but unclamped)
                p.mul_(scale)
    return bf16_round(voc)


def make_bwe(cfg):
    cfg = dict(cfg)
    torch.manual_seed(cfg.pop("seed"))
    scale = cfg.pop("scale", 1.0)
    m = LTX2VocoderWithBWE(**cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".alpha") or name.endswith(".beta"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith(".weight"):
                p.mul_(scale)
        # the checkpoint's STFT buffers: a periodic-Hann-windowed DFT basis (real rows, then imaginary)
        # and a non-negative filterbank
        N, W = cfg["filter_length"], cfg["window_length"]
        F_ = N // 2 + 1
        win = torch.zeros(N, dtype=torch.float64)
        off = (N - W) // 2
        win[off:off + W] = torch.hann_window(W, periodic=True, dtype=torch.float64)
        n = torch.arange(N, dtype=torch.float64)
        k = torch.arange(F_, dtype=torch.float64)[:, None]
        ang = 2 * torch.pi * k * n / N
        basis = torch.cat([torch.cos(ang) * win, -torch.sin(ang) * win], 0)
        m.mel_stft.stft_fn.forward_basis.copy_(basis.float()[:, None, :])
        m.mel_stft.stft_fn.inverse_basis.copy_(basis.float()[:, None, :] / N)
        m.mel_stft.mel_basis.copy_(0.2 * torch.rand_like(m.mel_stft.mel_basis))
    keep = m.resampler.filter.clone()  # not stored: diffusers rebuilds it in f32 at load
    bf16_round(m)
    m.resampler.filter.copy_(keep)
    return m


def save_bwe_folder(f, m):
    path = os.path.join(ROOT, f)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model_index.json"), "w") as fh:
        json.dump({"_class_name": "LTX2Pipeline", "_diffusers_version": "0.42.1",
                   "vocoder": ["ltx2", "LTX2VocoderWithBWE"]}, fh, indent=2)
        fh.write("\n")
    keep = m.resampler.filter.clone()
    m.to(torch.bfloat16).save_pretrained(os.path.join(path, "vocoder"))
    m.float()
    m.resampler.filter.copy_(keep)


def save_folder(f, vae, voc):
    path = os.path.join(ROOT, f)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model_index.json"), "w") as fh:
        json.dump({"_class_name": "LTX2Pipeline", "_diffusers_version": "0.42.1",
                   "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"], "vocoder": ["ltx2", "LTX2Vocoder"]}, fh,
                  indent=2)
        fh.write("\n")
    for comp, model in (("audio_vae", vae), ("vocoder", voc)):
        d = os.path.join(path, comp)
        model.to(torch.bfloat16).save_pretrained(d)
        model.float()
        if comp == "audio_vae":  # the decoder's only
            w = os.path.join(d, "diffusion_pytorch_model.safetensors")
            sd = {k: v for k, v in load_file(w).items() if not k.startswith("encoder.")}
            save_file(sd, w, metadata={"format": "pt"})


def vae_decode(vae, packed, L):
    """LTX2Pipeline's audio tail up to the VAE: de-normalise, unpack, decode"""
    M = vae.config.mel_bins // 4
    z = LTX2Pipeline._denormalize_audio_latents(packed, vae.latents_mean, vae.latents_std)
    z = LTX2Pipeline._unpack_audio_latents(z, L, num_mel_bins=M)
    return z, vae.decode(z, return_dict=False)[0]


def main():
    vaes = {k: make_vae(c) for k, c in VAES.items()}
    vocs = {k: make_vocoder(c) for k, c in VOCODERS.items()}
    for f in VAES:
        save_folder(f, vaes[f], vocs[f])
    out, meta = {}, {}
    with torch.no_grad():
        for key, (f, L, seed) in VAE_CASES.items():
            vae = vaes[f]
            C, M = vae.config.latent_channels, vae.config.mel_bins // 4
            g = torch.Generator().manual_seed(seed)
            packed = torch.randn(1, L, C * M, generator=g)
            z, mel = vae_decode(vae, packed, L)
            assert mel.shape == (1, 2, max(4 * L - 3, 1), vae.config.mel_bins), mel.shape
            out[key + ".packed"], out[key + ".z"], out[key + ".mel"] = packed[0], z[0], mel[0]
            meta[key] = f"{f} L={L}"
        for key, (f, T, seed) in VOC_CASES.items():
            voc = vocs[f]
            g = torch.Generator().manual_seed(seed)
            mel = 2 * torch.randn(1, voc.config.in_channels, T, generator=g) - 3
            wave = voc(mel.unsqueeze(1), time_last=True)  # [1, 1, in_channels, T]
            out[key + ".mel"], out[key + ".wave"] = mel[0], wave[0]
            meta[key] = f"{f} T={T}"
        # the pipeline's audio tail: VAE a then vocoder a
        g = torch.Generator().manual_seed(31)
        packed = torch.randn(1, 3, 8, generator=g)
        _, mel = vae_decode(vaes["a"], packed, 3)
        wave = vocs["a"](mel)
        out["pipe.packed"], out["pipe.wave"] = packed[0], wave[0]
        meta["pipe"] = "a L=3, vocoder a"
        bwes = {k: make_bwe(c) for k, c in BWES.items()}
        for f, m in bwes.items():
            save_bwe_folder(f, m)
        for key, (f, T, seed) in BWE_CASES.items():
            m = bwes[f]
            g = torch.Generator().manual_seed(seed)
            mel = 2 * torch.randn(1, m.config.in_channels, T, generator=g) - 3
            wave = m(mel.unsqueeze(1).transpose(2, 3))  # forward takes [B, 1, T, in_channels]
            out[key + ".mel"], out[key + ".wave"] = mel[0], wave[0]
            meta[key] = f"{f} T={T}"
    out = {k: v.contiguous().float() for k, v in out.items()}
    save_file(out, os.path.join(ROOT, "vectors.safetensors"), metadata={k: str(v) for k, v in meta.items()})
    total = 0
    for dp, _, fs in os.walk(ROOT):
        total += sum(os.path.getsize(os.path.join(dp, x)) for x in fs)
    print(f"wrote {ROOT}: {total} bytes")


if __name__ == "__main__":
    main()
