"""HunyuanVideo end-to-end parity vectors: two complete tiny HunyuanVideoPipeline folders in the
diffusers layout and what diffusers' HunyuanVideoPipeline (0.42.1, f32, CPU) generates with them.

    tools/venv/bin/python tools/parity/make_hunyuan_pipeline_vectors.py
Prerequisites (their outputs are committed; they are read here, never rewritten):
  tools/parity/make_hunyuan_vectors.py       tests/data/hunyuan/a/transformer
  tools/parity/make_hunyuan_vae_vectors.py   tests/data/hunyuan_vae/{a,b}/vae
  tools/parity/make_hunyuan_text_vectors.py  tests/data/llama/tokenizer (and make_llama_vectors.py's
                                             tests/data/llama/text_encoder)
  plus tests/data/enc/clip and tests/data/tok/clip_tiny (the tiny CLIP text model / tokenizer).
Writes:
  tests/data/hunyuan/a/  pipeline a: transformer (as make_hunyuan_vectors.py left it: patch (1, 2, 2),
      guidance embedded), vae -> ../../hunyuan_vae/a/vae (spatial ratio 4)
  tests/data/hunyuan/c/  pipeline c: transformer made here (seed 29, make_hunyuan_vectors.py's init;
      2 heads x 24, 2 dual + 2 single blocks, 1 refiner block, mlp_ratio 2, patch (1, 1, 1), RoPE 8+8+8,
      no guidance embedding, in = out = 4), vae -> ../../hunyuan_vae/b/vae (spatial ratio 8)
  both: model_index.json, scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler, shift 7),
      relative symlinks text_encoder -> ../../llama/text_encoder, tokenizer -> ../../llama/tokenizer,
      text_encoder_2 -> ../../enc/clip, tokenizer_2 -> ../../tok/clip_tiny, and difflet.json (the prompt
      template with the crop_start that fits the tiny tokenizer, max_sequence_length 48)
  tests/data/hunyuan/pipeline_vectors.safetensors, per case <k>:
      <k>.latents [4, lf, lh, lw]   the initial noise handed to the pipeline as `latents`
      <k>.frames [F, H, W, 3]       the output video (output_type "np": f32 in [0, 1], not rounded)
      <k>.prompt_embeds [48, 64], <k>.prompt_mask [48] (0/1 as f32), <k>.pooled [64]: encode_prompt's
      <k>.neg_prompt_embeds, <k>.neg_prompt_mask, <k>.neg_pooled: the same for the negative prompt (true CFG)
    metadata: "cases" (JSON: per case folder, prompt, prompt_2, negative_prompt, width, height, num_frames,
      steps, guidance_scale, true_cfg_scale, max_sequence_length, latent_shape), "prompt_template" (JSON
      {"template", "crop_start"}), "generator".
The reference behaviours are diffusers' own: sigmas linspace(1, 0, steps + 1)[:-1] shifted by 7,
guidance_scale x 1000 into the transformer, latents / scaling_factor before decoding, the VAE's default
framewise (temporally tiled, blended) decoding (case a2 has 6 latent frames > the 4 of one tile).
Deterministic: a rerun writes identical files.
"""
import json
import os
import shutil
import struct

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline, HunyuanVideoTransformer3DModel
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
from transformers import CLIPTextModel, CLIPTokenizer, PreTrainedTokenizerFast

DATA = os.path.join("tests", "data")
OUT = os.path.join(DATA, "hunyuan")
MAXSEQ = 48
VERSION = "0.42.1"

C_CONFIG = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=24, num_layers=2,
                num_single_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
                guidance_embeds=False, text_embed_dim=64, pooled_projection_dim=64, rope_theta=256.0,
                rope_axes_dim=(8, 8, 8))
C_SEED = 29

# pipeline folder name -> the VAE it links to
PIPES = {"a": "../../hunyuan_vae/a/vae", "c": "../../hunyuan_vae/b/vae"}
LINKS = {"text_encoder": "../../llama/text_encoder", "tokenizer": "../../llama/tokenizer",
         "text_encoder_2": "../../enc/clip", "tokenizer_2": "../../tok/clip_tiny"}
MODEL_INDEX = {
    "_class_name": "HunyuanVideoPipeline",
    "_diffusers_version": VERSION,
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "LlamaModel"],
    "text_encoder_2": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
    "tokenizer_2": ["transformers", "CLIPTokenizer"],
    "transformer": ["diffusers", "HunyuanVideoTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLHunyuanVideo"],
}

LONG_PROMPT = ("a red circle moving from left to right on a blue background, then a small green square appears and "
               "the camera pans slowly to the right while the light changes from morning to evening over the whole "
               "scene, and finally a yellow triangle spins in the middle of the frame as the colours fade to grey")
CASES = {
    "a1": dict(folder="a", prompt="a red circle moving from left to right", negative_prompt=None, width=48,
               height=32, num_frames=9, steps=3, guidance_scale=6.0, true_cfg_scale=1.0, seed=101),
    "a2": dict(folder="a", prompt=LONG_PROMPT, negative_prompt="blurry, low quality", width=32, height=48,
               num_frames=21, steps=2, guidance_scale=3.5, true_cfg_scale=2.0, seed=102),
    "c1": dict(folder="c", prompt="A cat walks.", negative_prompt=None, width=32, height=32, num_frames=5,
               steps=3, guidance_scale=1.0, true_cfg_scale=1.0, seed=103),
}


def save_sorted(tensors, path, metadata):
    """safetensors.torch.save_file's format, but with the header's keys (metadata included) sorted, so a rerun
    is byte-identical (save_file keeps the metadata in a hash map, whose order changes from run to run)."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        data = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_c_transformer():
    """make_hunyuan_vectors.py's random init, for pipeline c's transformer."""
    torch.manual_seed(C_SEED)
    tr = HunyuanVideoTransformer3DModel(**C_CONFIG).eval()
    with torch.no_grad():
        for pname, p in tr.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if "norm" in pname and "weight" in pname else 0.0) + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / p[0].numel() ** 0.5)
    path = os.path.join(OUT, "c", "transformer")
    shutil.rmtree(path, ignore_errors=True)
    tr.save_pretrained(path)


def link(folder, name, target):
    path = os.path.join(folder, name)
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
    os.symlink(target, path)
    assert os.path.isdir(path), f"{path} -> {target} is dangling"


def assemble(name, vae, crop):
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    for comp, target in LINKS.items():
        link(folder, comp, target)
    link(folder, "vae", vae)
    sched = os.path.join(folder, "scheduler")
    shutil.rmtree(sched, ignore_errors=True)
    FlowMatchEulerDiscreteScheduler(shift=7.0).save_pretrained(sched)
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump(MODEL_INDEX, f, indent=2)
        f.write("\n")
    with open(os.path.join(folder, "difflet.json"), "w") as f:
        json.dump({"_comment": "Settings difflet uses for this test pipeline: the prompt template with the crop_start of "
                               "this tiny tokenizer (HunyuanVideoPipeline's call argument prompt_template; the default "
                               "crop_start 95 fits only the real Llama 3 tokenizer) and the text length the parity vectors "
                               "were made at.",
                   "prompt_template": {"template": DEFAULT_PROMPT_TEMPLATE["template"], "crop_start": crop},
                   "defaults": {"max_sequence_length": MAXSEQ}}, f, indent=2)
        f.write("\n")


def main():
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    # the text components must load with the classes model_index.json names
    CLIPTextModel.from_pretrained(os.path.join(DATA, "enc", "clip"))
    CLIPTokenizer.from_pretrained(os.path.join(DATA, "tok", "clip_tiny"))
    tok = PreTrainedTokenizerFast.from_pretrained(os.path.join(DATA, "llama", "tokenizer"))
    # crop_start for the tiny tokenizer: the tokens before an empty prompt's <|eot_id|>, so
    # that even "" (the negative prompt of serve's start-up check) keeps one real row, as
    # crop_start 95 does with the real Llama 3 tokenizer. (The pipeline's own rule for a
    # template without one, len(tokens of the template) - 2, is one more here: this tiny
    # BPE splits the "\n\n" before `{}` differently when nothing follows it, and "" would
    # then leave no real row at all: NaN in diffusers, refused by difflet.)
    crop = len(tok(DEFAULT_PROMPT_TEMPLATE["template"].format(""))["input_ids"]) - 1
    template = {"template": DEFAULT_PROMPT_TEMPLATE["template"], "crop_start": crop}

    make_c_transformer()
    for name, vae in PIPES.items():
        assemble(name, vae, crop)

    pipes = {name: HunyuanVideoPipeline.from_pretrained(os.path.join(OUT, name), dtype=torch.float32)
             for name in PIPES}
    for p in pipes.values():
        p.set_progress_bar_config(disable=True)

    vec, meta = {}, {}
    for k, c in CASES.items():
        pipe = pipes[c["folder"]]
        s, st = pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal
        ch = pipe.transformer.config.in_channels
        shape = (1, ch, (c["num_frames"] - 1) // st + 1, c["height"] // s, c["width"] // s)
        latents = torch.randn(shape, generator=torch.Generator().manual_seed(c["seed"]), dtype=torch.float32)
        for pre, prompt in (("", c["prompt"]), ("neg_", c["negative_prompt"])):
            if prompt is None:
                continue
            e, pooled, m = pipe.encode_prompt(prompt=prompt, prompt_template=template, device="cpu",
                                              dtype=torch.float32, max_sequence_length=MAXSEQ)
            vec[f"{k}.{pre}prompt_embeds"] = e[0].clone()
            vec[f"{k}.{pre}prompt_mask"] = m[0].float().clone()
            vec[f"{k}.{pre}pooled"] = pooled[0].clone()
        video = pipe(prompt=c["prompt"], negative_prompt=c["negative_prompt"], height=c["height"], width=c["width"],
                     num_frames=c["num_frames"], num_inference_steps=c["steps"], guidance_scale=c["guidance_scale"],
                     true_cfg_scale=c["true_cfg_scale"], prompt_template=template, max_sequence_length=MAXSEQ,
                     latents=latents.clone(), output_type="np", return_dict=False)[0]
        frames = torch.from_numpy(np.ascontiguousarray(video[0], dtype=np.float32))
        assert frames.shape == (c["num_frames"], c["height"], c["width"], 3), frames.shape
        vec[f"{k}.latents"] = latents[0].clone()
        vec[f"{k}.frames"] = frames.clone()
        meta[k] = {key: c[key] for key in ("folder", "prompt", "negative_prompt", "width", "height", "num_frames",
                                           "steps", "guidance_scale", "true_cfg_scale")}
        meta[k].update(prompt_2=None, max_sequence_length=MAXSEQ, latent_shape=list(shape[1:]))
    assert int(vec["a2.prompt_mask"].sum()) == MAXSEQ, "a2's prompt must be truncated at max_sequence_length"
    save_sorted(vec, os.path.join(OUT, "pipeline_vectors.safetensors"),
                metadata={"generator": "tools/parity/make_hunyuan_pipeline_vectors.py",
                          "cases": json.dumps(meta, sort_keys=True), "prompt_template": json.dumps(template)})
    print("crop_start", crop)
    for k in CASES:
        print(k, {n.split(".", 1)[1]: tuple(t.shape) for n, t in vec.items() if n.startswith(k + ".")},
              "mask valid", [int(vec[n].sum()) for n in sorted(vec) if n.startswith(k + ".") and n.endswith("mask")],
              "frames range", (float(vec[f"{k}.frames"].min()), float(vec[f"{k}.frames"].max())))


if __name__ == "__main__":
    main()
