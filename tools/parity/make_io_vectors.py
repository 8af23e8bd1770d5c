"""Safetensors files written by the reference libraries, for tests/test_io.c.

Run from the repository root with the tools virtualenv (make tools-venv):
    tools/venv/bin/python tools/parity/make_io_vectors.py
Writes tests/data/io/:
  py_basic.safetensors   -- safetensors' own writer: F32, F16, BF16, I64, metadata.
                            Values are v[i] = (i % 17) * 0.25 - 2, reshaped, so the C
                            test recomputes them without a second file.
  clip_sharded/          -- a tiny CLIPTextModel saved by transformers with a small
                            max_shard_size: real shard files and index.json.
"""
import os

import torch
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel

OUT = os.path.join("tests", "data", "io")
os.makedirs(OUT, exist_ok=True)


def pattern(n, dtype):
    return ((torch.arange(n) % 17).to(torch.float64) * 0.25 - 2).to(dtype)


tensors = {
    "a.f32": pattern(15, torch.float32).reshape(3, 5),
    "b.f16": pattern(7, torch.float16),
    "c.bf16": pattern(24, torch.bfloat16).reshape(2, 3, 4),
    "d.position_ids": torch.arange(4, dtype=torch.int64).reshape(1, 4),
    "e.scalar": pattern(1, torch.float32).reshape(()),
}
save_file(tensors, os.path.join(OUT, "py_basic.safetensors"), metadata={"format": "pt"})

torch.manual_seed(0)
cfg = CLIPTextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, max_position_embeddings=16)
model = CLIPTextModel(cfg).eval()
model.save_pretrained(os.path.join(OUT, "clip_sharded"), max_shard_size="20KB", safe_serialization=True)
print("wrote", OUT)
