"""FLUX GGUF parity vectors: the tiny FLUX transformer (tests/data/flux/dev/transformer)
re-laid out as the original Black Forest Labs checkpoint and written as GGUF files the
way ComfyUI-GGUF / stable-diffusion.cpp FLUX GGUFs are, plus what diffusers computes
when it loads those files with FluxTransformer2DModel.from_single_file.

Run from the repository root with the tools virtualenv, after make_flux_vectors.py:
    tools/venv/bin/python tools/parity/make_flux_gguf_vectors.py
Runs on the CPU, offline, in a few seconds; rerunning gives byte-identical files.

Writes tests/data/flux/gguf/:
  flux-tiny-Q8_0.gguf  2-D weights whose last (input) dim is a multiple of 32: Q8_0;
                       the other 2-D weight (img_in.weight, 64 x 16) and every 1-D tensor: F32
  flux-tiny-Q4_0.gguf  the same with Q4_0
  flux-tiny-F16.gguf   every 2-D weight F16, every 1-D tensor F32
  vectors.safetensors
    in.latents [48, 16]  packed image tokens (a 6 x 8 token grid, row-major)
    in.img_ids [48, 3]   (0, row, col), as FluxPipeline._prepare_latent_image_ids makes them
    in.txt [12, 64]      T5-side hidden states; txt_ids are zeros [12, 3]
    in.pooled [64]       CLIP pooled projection
    in.t [1]             0.7  (FluxPipeline passes t/1000; the model multiplies by 1000)
    in.g [1]             3.5  (guidance; the model multiplies by 1000 as well)
    ref.out [48, 16]     the original f32 diffusers model on these inputs
    <q>.out [48, 16]     the model diffusers loads from flux-tiny-<q>.gguf, q in Q8_0 Q4_0 F16,
                         with ggml's exact f32 dequantization (below)
    <q>.dequant.<diffusers name>  for q in Q8_0 Q4_0: three weights, gguf-py's exact f32
                         dequantization of the rows diffusers takes for them (diffusers holds
                         the same rounded to f16), torch shape [out, in]:
                         transformer_blocks.0.attn.to_k.weight (rows 64..128 of
                         double_blocks.0.img_attn.qkv), single_transformer_blocks.0.attn.to_v.weight
                         (rows 128..192 of single_blocks.0.linear1), norm_out.linear.weight
                         (final_layer.adaLN_modulation.1 with its halves swapped). The script
                         asserts each equals gguf-py's dequantization of those rows, and that the
                         F16 file's are exactly its f16 values (so none are stored for F16).

GGUF layout (what ComfyUI-GGUF's tools/convert.py + its patched llama-quantize write):
  metadata, in this order: general.architecture = "flux" (str),
  general.file_type = 7 (MOSTLY_Q8_0) / 2 (MOSTLY_Q4_0) / 1 (MOSTLY_F16) (u32),
  general.quantization_version = 2 (u32). Tensors sorted by name, no prefix (no
  "model.diffusion_model."), alignment 32; dims are stored ggml-style (ne[0] = the
  last torch dim, i.e. a Linear's input features).

BFL tensor names (D = hidden 64 = heads 2 x head dim 32, M = mlp hidden 4*D = 256), with
the diffusers tensors they come from (the exact inverse of diffusers'
convert_flux_transformer_checkpoint_to_diffusers; all weights [out, in]):
  img_in.{weight,bias}                        x_embedder                       [D, 16]
  txt_in.{weight,bias}                        context_embedder                 [D, 64]
  time_in.{in_layer,out_layer}.{weight,bias}  time_text_embed.timestep_embedder.linear_{1,2}
  vector_in.{in_layer,out_layer}.*            time_text_embed.text_embedder.linear_{1,2}
  guidance_in.{in_layer,out_layer}.*          time_text_embed.guidance_embedder.linear_{1,2}
  double_blocks.i.img_mod.lin.*               transformer_blocks.i.norm1.linear       [6D, D]
  double_blocks.i.txt_mod.lin.*               transformer_blocks.i.norm1_context.linear
  double_blocks.i.img_attn.qkv.*              cat(attn.to_q, attn.to_k, attn.to_v)     [3D, D]
  double_blocks.i.txt_attn.qkv.*              cat(attn.add_q_proj, add_k_proj, add_v_proj)
  double_blocks.i.img_attn.norm.query_norm.scale / key_norm.scale   attn.norm_q / norm_k [32]
  double_blocks.i.txt_attn.norm.query_norm.scale / key_norm.scale   attn.norm_added_q / _k
  double_blocks.i.img_attn.proj.*             attn.to_out.0
  double_blocks.i.txt_attn.proj.*             attn.to_add_out
  double_blocks.i.img_mlp.{0,2}.*             ff.net.0.proj, ff.net.2
  double_blocks.i.txt_mlp.{0,2}.*             ff_context.net.0.proj, ff_context.net.2
  single_blocks.i.modulation.lin.*            single_transformer_blocks.i.norm.linear [3D, D]
  single_blocks.i.linear1.*                   cat(attn.to_q, to_k, to_v, proj_mlp) [3D+M, D]
  single_blocks.i.norm.query_norm.scale / key_norm.scale   attn.norm_q / norm_k
  single_blocks.i.linear2.*                   proj_out                          [D, D+M]
  final_layer.linear.*                        proj_out                          [16, D]
  final_layer.adaLN_modulation.1.*            norm_out.linear with its halves swapped
                                              (diffusers: scale, shift; BFL: shift, scale)
The modulation rows (img_mod, txt_mod, modulation) need no reordering: both layouts
chunk them as shift, scale, gate (x2 for double blocks).

diffusers 0.42.1 cannot load this tiny model from a single file as shipped: its FLUX
converter hard-codes inner_dim = 3072 when it splits single_blocks.*.linear1, so
torch.split fails for any other width. This script swaps that one constant for the tiny
model's width (64) in the converter's code object for the duration of the run; everything
else (GGUF reader, quantizer, dequantizer, converter logic) is diffusers' own.

diffusers dequantizes Q8_0 / Q4_0 in float16 (d * q with d left as float16, then cast
to the f32 compute dtype), whereas ggml (and ComfyUI-GGUF) form d * q in f32. <q>.out is
diffusers' GGUF model run with ggml's exact f32 dequantization (diffusers' dequantize
functions swapped for f32 ones during that call; the loader, converter and model are
diffusers' own); the script prints how far diffusers' float16 rounding moves the output
from it (about 5e-4 of max|ref.out| for Q8_0, 3e-4 for Q4_0).

Real ComfyUI-GGUF quantized FLUX files (its patched llama-quantize) also keep img_in,
time_in/vector_in/guidance_in.in_layer and final_layer.linear in F32 and txt_in,
*.out_layer and final_layer.adaLN_modulation in F16; these files quantize those too (to
cover the quantized path everywhere); the F16 file covers F16 2-D weights.
"""
import contextlib
import functools
import hashlib
import os

import gguf
import numpy as np
import torch
from diffusers import FluxPipeline, FluxTransformer2DModel, GGUFQuantizationConfig
from diffusers.loaders import single_file_utils
from diffusers.quantizers.gguf import utils as gguf_utils
from diffusers.quantizers.gguf.utils import GGUFParameter, dequantize_gguf_tensor
from safetensors.torch import save_file

SRC = os.path.join("tests", "data", "flux", "dev")
OUT = os.path.join("tests", "data", "flux", "gguf")
GH, GW, NTXT = 6, 8, 12
QTYPES = {
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "F16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
}
DEQUANT = [  # stored for the Q8_0 and Q4_0 files (kept few: the data directory must stay under 2 MB)
    "transformer_blocks.0.attn.to_k.weight",          # middle third of double_blocks.0.img_attn.qkv
    "single_transformer_blocks.0.attn.to_v.weight",   # rows 2D..3D of single_blocks.0.linear1 (next: mlp)
    "norm_out.linear.weight",                         # final_layer.adaLN_modulation.1, halves swapped
]


def to_bfl(sd, n_double, n_single):
    """diffusers FluxTransformer2DModel state dict -> BFL checkpoint state dict."""
    b = {}

    def lin(dst, src):
        b[dst + ".weight"] = sd[src + ".weight"]
        b[dst + ".bias"] = sd[src + ".bias"]

    def cat(dst, srcs):
        for s in ("weight", "bias"):
            b[f"{dst}.{s}"] = torch.cat([sd[f"{x}.{s}"] for x in srcs], dim=0)

    def swap(w):
        scale, shift = w.chunk(2, dim=0)
        return torch.cat([shift, scale], dim=0)

    lin("img_in", "x_embedder")
    lin("txt_in", "context_embedder")
    for bfl, dif in (("time_in", "timestep_embedder"), ("vector_in", "text_embedder"),
                     ("guidance_in", "guidance_embedder")):
        lin(f"{bfl}.in_layer", f"time_text_embed.{dif}.linear_1")
        lin(f"{bfl}.out_layer", f"time_text_embed.{dif}.linear_2")
    for i in range(n_double):
        d, p = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        lin(d + "img_mod.lin", p + "norm1.linear")
        lin(d + "txt_mod.lin", p + "norm1_context.linear")
        cat(d + "img_attn.qkv", [p + "attn.to_q", p + "attn.to_k", p + "attn.to_v"])
        cat(d + "txt_attn.qkv", [p + "attn.add_q_proj", p + "attn.add_k_proj", p + "attn.add_v_proj"])
        b[d + "img_attn.norm.query_norm.scale"] = sd[p + "attn.norm_q.weight"]
        b[d + "img_attn.norm.key_norm.scale"] = sd[p + "attn.norm_k.weight"]
        b[d + "txt_attn.norm.query_norm.scale"] = sd[p + "attn.norm_added_q.weight"]
        b[d + "txt_attn.norm.key_norm.scale"] = sd[p + "attn.norm_added_k.weight"]
        lin(d + "img_attn.proj", p + "attn.to_out.0")
        lin(d + "txt_attn.proj", p + "attn.to_add_out")
        lin(d + "img_mlp.0", p + "ff.net.0.proj")
        lin(d + "img_mlp.2", p + "ff.net.2")
        lin(d + "txt_mlp.0", p + "ff_context.net.0.proj")
        lin(d + "txt_mlp.2", p + "ff_context.net.2")
    for i in range(n_single):
        s, p = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        lin(s + "modulation.lin", p + "norm.linear")
        cat(s + "linear1", [p + "attn.to_q", p + "attn.to_k", p + "attn.to_v", p + "proj_mlp"])
        b[s + "norm.query_norm.scale"] = sd[p + "attn.norm_q.weight"]
        b[s + "norm.key_norm.scale"] = sd[p + "attn.norm_k.weight"]
        lin(s + "linear2", p + "proj_out")
    lin("final_layer.linear", "proj_out")
    b["final_layer.adaLN_modulation.1.weight"] = swap(sd["norm_out.linear.weight"])
    b["final_layer.adaLN_modulation.1.bias"] = swap(sd["norm_out.linear.bias"])
    assert len(b) + 8 * n_double + 6 * n_single == len(sd), (len(b), len(sd))  # qkv/linear1 merges
    return {k: v.contiguous().clone() for k, v in b.items()}


def patch_converter_width(inner_dim):
    """Swap the hard-coded inner_dim = 3072 in diffusers' FLUX converter (see docstring)."""
    fn = single_file_utils.convert_flux_transformer_checkpoint_to_diffusers
    code = fn.__code__
    consts = list(code.co_consts)
    assert consts.count(3072) == 1, consts
    consts[consts.index(3072)] = inner_dim
    original = code
    fn.__code__ = code.replace(co_consts=tuple(consts))
    return lambda: setattr(fn, "__code__", original)


def qtype_for(name, t, wtype):
    if t.dim() == 1:
        return gguf.GGMLQuantizationType.F32
    assert t.dim() == 2, name
    if wtype == gguf.GGMLQuantizationType.F16:
        return wtype
    block = gguf.GGML_QUANT_SIZES[wtype][0]
    return wtype if t.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F32


def write_gguf(path, bfl, wtype, ftype):
    w = gguf.GGUFWriter(path=None, arch="flux")  # general.architecture
    w.add_file_type(int(ftype))                   # general.file_type
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)  # general.quantization_version
    types = {}
    for name in sorted(bfl):
        t = bfl[name]
        q = qtype_for(name, t, wtype)
        data = gguf.quants.quantize(t.numpy().astype(np.float32), q)
        w.add_tensor(name, data, raw_dtype=q)
        types[name] = q.name
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def reference_rows(path, name, sd, bfl):
    """The rows of the BFL tensor holding diffusers tensor `name`, dequantized by gguf-py."""
    src, lo, hi, swap = locate(name, sd)
    t = next(x for x in gguf.GGUFReader(path).tensors if x.name == src)
    full = torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).copy())
    full = full.reshape(bfl[src].shape)
    if swap:
        shift, scale = full.chunk(2, dim=0)
        full = torch.cat([scale, shift], dim=0)
    return full[lo:hi].contiguous()


def locate(name, sd):
    """(BFL tensor, first row, end row, halves swapped) for the DEQUANT diffusers names."""
    n = sd[name].shape[0]
    if name.startswith("transformer_blocks.") and ".attn.to_" in name:
        i = name.split(".")[1]
        k = "qkv".index(name.split(".attn.to_")[1][0])
        return f"double_blocks.{i}.img_attn.qkv.weight", k * n, (k + 1) * n, False
    if name.startswith("single_transformer_blocks.") and ".attn.to_" in name:
        i = name.split(".")[1]
        k = "qkv".index(name.split(".attn.to_")[1][0])
        return f"single_blocks.{i}.linear1.weight", k * n, (k + 1) * n, False
    if name == "norm_out.linear.weight":
        return "final_layer.adaLN_modulation.1.weight", 0, n, True
    raise KeyError(name)


@contextlib.contextmanager
def f32_dequant():
    """Make diffusers dequantize as ggml does: d * q in float32 instead of float16."""
    fns = gguf_utils.dequantize_functions
    saved = dict(fns)
    try:
        for k, fn in saved.items():
            fns[k] = functools.partial(fn, dtype=torch.float32)
        yield
    finally:
        fns.clear()
        fns.update(saved)


def held(p):
    if isinstance(p, GGUFParameter):
        return dequantize_gguf_tensor(p).float()
    return p.detach().float().clone()


def main():
    os.makedirs(OUT, exist_ok=True)
    ref = FluxTransformer2DModel.from_pretrained(SRC, subfolder="transformer", torch_dtype=torch.float32,
                                                 local_files_only=True).eval()
    cfg = ref.config
    D = cfg.num_attention_heads * cfg.attention_head_dim
    sd = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    bfl = to_bfl(sd, cfg.num_layers, cfg.num_single_layers)

    restore = patch_converter_width(D)
    try:
        # the inverse is exact: diffusers' own converter maps it back onto the original
        back = single_file_utils.convert_flux_transformer_checkpoint_to_diffusers(dict(bfl), config=cfg)
        assert sorted(back) == sorted(sd), set(back) ^ set(sd)
        for k in sd:
            assert back[k].shape == sd[k].shape and torch.equal(back[k], sd[k]), k

        g = torch.Generator().manual_seed(1234)
        latents = torch.randn(1, GH * GW, cfg.in_channels, generator=g)
        txt = torch.randn(1, NTXT, cfg.joint_attention_dim, generator=g)
        pooled = torch.randn(1, cfg.pooled_projection_dim, generator=g)
        t = torch.tensor([0.7])
        gd = torch.tensor([3.5])
        img_ids = FluxPipeline._prepare_latent_image_ids(1, GH, GW, "cpu", torch.float32)
        txt_ids = torch.zeros(NTXT, 3)

        def run(model):
            with torch.no_grad():
                return model(hidden_states=latents, encoder_hidden_states=txt, pooled_projections=pooled,
                             timestep=t, img_ids=img_ids, txt_ids=txt_ids, guidance=gd,
                             return_dict=False)[0][0].float().contiguous()

        out = {"in.latents": latents[0], "in.img_ids": img_ids, "in.txt": txt[0], "in.pooled": pooled[0],
               "in.t": t, "in.g": gd, "ref.out": run(ref)}
        refmax = out["ref.out"].abs().max().item()
        report = []
        for q, (wtype, ftype) in QTYPES.items():
            path = os.path.join(OUT, f"flux-tiny-{q}.gguf")
            types = write_gguf(path, bfl, wtype, ftype)
            m = FluxTransformer2DModel.from_single_file(
                path, quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
                config=SRC, subfolder="transformer", torch_dtype=torch.float32, local_files_only=True).eval()
            msd = dict(m.named_parameters())
            for name in DEQUANT:
                h = held(msd[name]).contiguous()
                # independent check: diffusers' split + dequantization == gguf-py's dequantize of the
                # same rows rounded to f16 (diffusers computes d * q in float16, see docstring), and
                # the F16 file's weights are held as exactly the file's f16 values
                exact_rows = reference_rows(path, name, sd, bfl)
                want = exact_rows.half().float()
                assert torch.equal(h, want), (q, name, (h - want).abs().max())
                if wtype != gguf.GGMLQuantizationType.F16:
                    out[f"{q}.dequant.{name}"] = exact_rows.contiguous()  # ggml's exact f32 d * q
            plain = run(m)
            if wtype != gguf.GGMLQuantizationType.F16:
                # stored: diffusers' GGUF model with ggml's exact f32 dequantization (d * q in
                # f32, as gguf-py, ggml and ComfyUI compute it); reported: how far diffusers'
                # own float16 dequantization moves the output from it
                with f32_dequant():
                    out[f"{q}.out"] = run(m)
                ex = (plain - out[f"{q}.out"]).abs().max().item() / refmax
            else:
                out[f"{q}.out"], ex = plain, 0.0
            err = (out[f"{q}.out"] - out["ref.out"]).abs().max().item()
            nq = sum(v == wtype.name for v in types.values())
            report.append(f"{q}: {nq} tensors {wtype.name}, {len(types) - nq} other; "
                          f"max|out-ref|/max|ref| = {err / refmax:.3e}; "
                          f"f32-dequant vs diffusers: {ex:.3e}; {os.path.getsize(path)} bytes")
    finally:
        restore()

    out = {k: v.contiguous() for k, v in sorted(out.items())}
    save_file(out, os.path.join(OUT, "vectors.safetensors"))
    for line in report:
        print(line)
    for f in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, f)
        print(f"{f}: {os.path.getsize(p)} bytes sha256 {hashlib.sha256(open(p, 'rb').read()).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
