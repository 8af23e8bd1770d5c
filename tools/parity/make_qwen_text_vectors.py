"""Extra vectors for Qwen-Image's text encoder (Qwen2_5_VLForConditionalGeneration's
language model on text alone; tests/test_qwen_text.c).

Run from the repository root with the tools virtualenv (make tools-venv), after
make_qwenimage_vectors.py (the tiny encoder in tests/data/qwenimage/a):
    tools/venv/bin/python tools/parity/make_qwen_text_vectors.py
Writes:
  tests/data/qwenimage/text_x/  a second tiny encoder whose attention takes the other
        kernel paths: head dim 32 (the AVX-512 kernel's multiple), one KV head for 2
        query heads, mrope [4, 6, 6], theta 1e4, vocab 256; model_index.json and
        text_encoder/{config.json (transformers 5: text_config), model.safetensors
        holding only the language model, under transformers 5's in-memory names
        model.language_model.*}
  tests/data/qwenimage/text_extra.safetensors:
    a.text<k>.bf16   [n, 64] hidden_states[-1] of the encoder in a/ on a.text<k>.ids
                     (vectors.safetensors) with difflet's bf16 scheme emulated in torch
                     (bf16_hidden: every rounding difflet makes, written out). Its
                     distance to .hidden is the error the scheme alone makes; difflet's
                     bf16 is checked against it.
    x.ids            [150] random ids (int32): two 128-row matmul chunks
    x.hidden         [150, 64] hidden_states[-1] of text_x (f32)
    x.bf16           [150, 64] the same with the bf16 scheme emulated
"""
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

Q = os.path.join("tests", "data", "qwenimage")


def bf16_hidden(model, ids):
    """hidden_states[-1] of model's language model on ids, computed as difflet's bf16
    path rounds (a forward written out here, checked in f32 against transformers):
    RMSNorm outputs, weight matrices, q/k/v (bias added in f32), q/k after RoPE, the
    attention's probabilities for P.V (their sum stays f32) and its output, gate
    (after SiLU, applied in f32), up and gate*up rounded to bf16; embeddings, residual
    stream, matmul accumulation, softmax and the final norm in f32. bf16=False: no
    rounding at all (the check)."""
    return _forward(model, ids, True)


def attend(sc, v, r, bk=128):
    """softmax(sc) @ v as difflet's flash kernels take it: keys in blocks of bk, each
    block's probabilities exp(s - m) taken at the running max m of the blocks so far
    and rounded by r for P.V; the accumulator and the sum l in f32, rescaled by
    exp(m_old - m_new) as the max grows. sc: [H, n, n] (masked: -inf), v: [n, H, Dh]."""
    Hh, n, _ = sc.shape
    m = torch.full((Hh, n, 1), float("-inf"))
    acc = torch.zeros(Hh, n, v.shape[-1])
    l = torch.zeros(Hh, n, 1)
    for k0 in range(0, n, bk):
        s = sc[:, :, k0:k0 + bk]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha = torch.where(m == float("-inf"), torch.zeros_like(m), (m - m_new).exp())
        p = torch.where(s == float("-inf"), torch.zeros_like(s), (s - m_new).exp())
        acc = acc * alpha + torch.einsum("hqk,khd->hqd", r(p), v[k0:k0 + bk])
        l = l * alpha + p.sum(-1, keepdim=True)
        m = m_new
    return (acc / l).permute(1, 0, 2)


def _forward(model, ids, bf16):
    tc = model.config.text_config
    lm = model.model.language_model
    r = (lambda t: t.to(torch.bfloat16).float()) if bf16 else (lambda t: t)
    H, KV = tc.num_attention_heads, tc.num_key_value_heads
    Dh = tc.hidden_size // H
    n = len(ids)
    theta = tc.rope_parameters["rope_theta"]
    inv = 1.0 / (theta ** (torch.arange(0, Dh, 2, dtype=torch.float) / Dh))
    ang = torch.arange(n, dtype=torch.float)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None, :], torch.cat([ang.sin()] * 2, -1)[:, None, :]

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + tc.rms_norm_eps) * w

    def rot(x):  # [n, heads, Dh]
        x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]
        return r(x * cos + torch.cat((-x2, x1), -1) * sin)

    def lin(x, mod):
        y = x @ r(mod.weight).T
        return y + mod.bias if mod.bias is not None else y

    with torch.no_grad():
        x = lm.embed_tokens.weight[torch.tensor(ids)].float()
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        for layer in lm.layers:
            at = layer.self_attn
            h = r(rms(x, layer.input_layernorm.weight))
            q = rot(r(lin(h, at.q_proj)).view(n, H, Dh))
            k = rot(r(lin(h, at.k_proj)).view(n, KV, Dh)).repeat_interleave(H // KV, 1)
            v = r(lin(h, at.v_proj)).view(n, KV, Dh).repeat_interleave(H // KV, 1)
            sc = torch.einsum("qhd,khd->hqk", q, k) * (1.0 / Dh ** 0.5)
            sc = sc.masked_fill(~mask, float("-inf"))
            o = attend(sc, v, r)
            x = x + lin(r(o.reshape(n, H * Dh)), at.o_proj)
            h = r(rms(x, layer.post_attention_layernorm.weight))
            g = r(torch.nn.functional.silu(lin(h, layer.mlp.gate_proj)))
            u = r(lin(h, layer.mlp.up_proj))
            x = x + lin(r(g * u), layer.mlp.down_proj)
        return rms(x, lm.norm.weight)


def hidden(model, ids):
    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long)
        out = model(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True)
    return out.hidden_states[-1][0].clone()


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 1.0 if ("norm" in name and "weight" in name) else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)


def text_x():
    torch.manual_seed(9)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0],
                           window_size=112),
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    m = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    randomize(m, 91)
    return m


def main():
    vec = {}
    a = Qwen2_5_VLForConditionalGeneration.from_pretrained(os.path.join(Q, "a", "text_encoder"),
                                                           torch_dtype=torch.float32).eval()
    with safe_open(os.path.join(Q, "vectors.safetensors"), "pt") as f:
        for k in range(2):
            ids = f.get_tensor(f"a.text{k}.ids").tolist()
            ref = f.get_tensor(f"a.text{k}.hidden")
            assert torch.allclose(hidden(a, ids), ref, atol=1e-6), "a/text_encoder does not reproduce .hidden"
            assert torch.allclose(_forward(a, ids, False), ref, atol=1e-5), "the written-out forward is off"
            vec[f"a.text{k}.bf16"] = bf16_hidden(a, ids)
            e = float(((vec[f"a.text{k}.bf16"] - ref).abs().amax(1) / ref.abs().amax(1)).max())
            print(f"a.text{k}: {len(ids)} tokens, bf16 scheme {e:.3g} of max|ref| (worst row)")

    x = text_x()
    g = torch.Generator().manual_seed(92)
    ids = torch.randint(0, 256, (150,), generator=g).tolist()
    vec["x.ids"] = torch.tensor(ids, dtype=torch.int32)
    vec["x.hidden"] = hidden(x, ids)
    assert torch.allclose(_forward(x, ids, False), vec["x.hidden"], atol=1e-5), "the written-out forward is off"
    vec["x.bf16"] = bf16_hidden(x, ids)
    ref = vec["x.hidden"]
    e = float(((vec["x.bf16"] - ref).abs().amax(1) / ref.abs().amax(1)).max())
    print(f"x: 150 tokens, bf16 scheme {e:.3g} of max|ref| (worst row)")

    d = os.path.join(Q, "text_x")
    os.makedirs(os.path.join(d, "text_encoder"), exist_ok=True)
    with open(os.path.join(d, "model_index.json"), "w") as f:
        json.dump({"_class_name": "QwenImagePipeline", "_diffusers_version": "0.36.0",
                   "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"]}, f, indent=2)
    x.config.to_json_file(os.path.join(d, "text_encoder", "config.json"))
    sd = {k: v.contiguous() for k, v in x.state_dict().items() if k.startswith("model.language_model.")}
    assert "model.language_model.embed_tokens.weight" in sd, sorted(x.state_dict())[:5]
    save_file(sd, os.path.join(d, "text_encoder", "model.safetensors"))
    save_file({k: v.contiguous() for k, v in vec.items()}, os.path.join(Q, "text_extra.safetensors"))


if __name__ == "__main__":
    main()
