"""Llama text-encoder parity vectors (HunyuanVideo's text_encoder is a LlamaModel; its
pipeline takes hidden_states[-(hidden_state_skip_layer + 1)], a layer counted from
the end, not the final normed state).

    tools/venv/bin/python tools/parity/make_llama_vectors.py
Writes tests/data/llama/: a folder with model_index.json and text_encoder/ (a tiny
random LlamaModel: GQA 4 query / 2 key-value heads, rope_theta 500000, no biases) and
vectors.safetensors: ids [n] (int64 as float), hidden.<k> = hidden_states[k] for every
k of the L + 1 transformers returns (k = 0 the embeddings, k = L the final normed
output), f32.
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaModel

OUT = os.path.join("tests", "data", "llama")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=256,
                      attention_bias=False, mlp_bias=False, hidden_act="silu", tie_word_embeddings=False)
    m = LlamaModel(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / (p.shape[-1] ** 0.5))
    m.save_pretrained(os.path.join(OUT, "text_encoder"))
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump({"_class_name": "HunyuanVideoPipeline", "text_encoder": ["transformers", "LlamaModel"]}, f, indent=2)
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 320, (1, 37), generator=g)
    with torch.no_grad():
        hs = m(input_ids=ids, output_hidden_states=True).hidden_states
    vec = {"ids": ids[0].float()}
    for k, h in enumerate(hs):
        vec[f"hidden.{k}"] = h[0].clone()
    # hidden_states in transformers 5: the embeddings, each layer's raw output but the
    # last's, and the last's through the final norm (checked: the final norm of the
    # last layer's output is the model's last_hidden_state)
    with torch.no_grad():
        last = m(input_ids=ids).last_hidden_state
    assert len(hs) == cfg.num_hidden_layers + 1 and torch.equal(hs[-1], last)
    save_file(vec, os.path.join(OUT, "vectors.safetensors"), metadata={"generator": "tools/parity/make_llama_vectors.py",
                                                                      "layers": str(cfg.num_hidden_layers)})
    print("wrote", len(vec), "tensors; hidden states:", len(hs))


if __name__ == "__main__":
    main()
