"""UMT5 (Wan 2.1's text encoder) and masked T5 test vectors: transformers'
UMT5EncoderModel and T5EncoderModel run with an attention mask (padding to
max_length, as Wan's pipeline calls its text encoder), every hidden state kept.

Run from the repository root with the tools virtualenv (make tools-venv), after
make_wan_vectors.py (the tiny UMT5 and its tokenizer, tests/data/wan/a) and
make_encoder_vectors.py (the tiny T5, tests/data/enc/t5):
    tools/venv/bin/python tools/parity/make_umt5_vectors.py
Writes tests/data/enc/umt5_vectors.safetensors, per case <key>:
  <key>.ids     [S] input ids (F32)
  <key>.valid   [1] number of valid (unmasked) keys: the mask is 1 on [0, valid)
  <key>.h<k>    [S, D] hidden states (h0 = embeddings ... hN = last_hidden_state),
                every row including the padded query rows
  <key>.bf16    [S, D] last_hidden_state of the same model with difflet's bf16 scheme
                emulated in torch: weight matrices and every linear's input rounded to
                bf16, q, k, v, wi_0, wi_1 outputs rounded to bf16, residual stream and
                everything else f32. Its distance to .h<N> is the error that scheme
                alone makes (this UMT5's unit-scale weights give sharp attention, so
                it exceeds 2^-5 of max|ref|); difflet's bf16 is checked against it.
Cases:
  umt5.p0  a short prompt padded to 32
  umt5.p1  the empty prompt (EOS only) padded to 16: one valid key
  umt5.p2  a long prompt padded to 192 (over 128 valid tokens: the far buckets)
  umt5.p3  a long prompt truncated to 48: no padding (mask all ones)
  t5m.p0   tests/data/enc/t5 (plain T5, layer 0's bias shared) on a prompt padded to 48
"""
import copy
import os

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, T5EncoderModel, UMT5EncoderModel

WAN = os.path.join("tests", "data", "wan", "a")
ENC = os.path.join("tests", "data", "enc")
LONG = "Photo of an astronaut riding a horse on Mars, cinematic lighting, ultra detailed, 8k "
UMT5_CASES = [("a red circle on a blue background", 32),
              ("", 16),
              (LONG * 5, 192),
              (LONG * 3, 48)]


def bf16_emulated(model):
    """A copy of model computing as difflet's bf16 path rounds (see the docstring)."""
    m = copy.deepcopy(model)
    r = lambda t: t.to(torch.bfloat16).float()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 2 and "relative_attention_bias" not in n and "shared" not in n:
                p.copy_(r(p))
    for n, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(lambda mod, a: (r(a[0]),))
            if n.split(".")[-1] in ("q", "k", "v", "wi_0", "wi_1"):
                mod.register_forward_hook(lambda mod, a, o: r(o))
    return m


def run(vec, key, model, tok, prompt, n):
    ti = tok([prompt], padding="max_length", max_length=n, truncation=True, add_special_tokens=True,
             return_attention_mask=True, return_tensors="pt")
    mask = ti.attention_mask[0]
    valid = int(mask.sum())
    assert valid >= 1 and bool((mask[:valid] == 1).all()) and bool((mask[valid:] == 0).all()), "mask is not a prefix"
    with torch.no_grad():
        out = model(ti.input_ids, ti.attention_mask, output_hidden_states=True)
        emu = bf16_emulated(model)(ti.input_ids, ti.attention_mask).last_hidden_state
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    vec[key + ".ids"] = ti.input_ids[0].float()
    vec[key + ".valid"] = torch.tensor([float(valid)])
    vec[key + ".bf16"] = emu[0].clone()
    for k, h in enumerate(out.hidden_states):
        vec[f"{key}.h{k}"] = h[0].clone()
    ref = out.last_hidden_state[0]
    print(f"{key}: S {n}, valid {valid}, max|last| {ref.abs().max():.3f}, "
          f"bf16 scheme {float((emu[0] - ref).abs().max() / ref.abs().max()):.3g} of it")
    return valid


def main():
    vec = {}
    tok = AutoTokenizer.from_pretrained(os.path.join(WAN, "tokenizer"))
    umt5 = UMT5EncoderModel.from_pretrained(os.path.join(WAN, "text_encoder")).eval()
    valid = [run(vec, f"umt5.p{i}", umt5, tok, p, n) for i, (p, n) in enumerate(UMT5_CASES)]
    assert valid[1] == 1 and 128 < valid[2] < 192 and valid[3] == 48, valid
    t5 = T5EncoderModel.from_pretrained(os.path.join(ENC, "t5")).eval()
    t5_tok = AutoTokenizer.from_pretrained(os.path.join("tests", "data", "tok", "t5_tiny"))
    v = run(vec, "t5m.p0", t5, t5_tok, "small green triangle in the top left, white background", 48)
    assert v < 48
    save_file(vec, os.path.join(ENC, "umt5_vectors.safetensors"))


if __name__ == "__main__":
    main()
