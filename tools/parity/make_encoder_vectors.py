"""Text-encoder test vectors: tiny random-weight CLIPTextModel and T5EncoderModel in
the official layout, run by transformers on token ids from the tiny tokenizers.

Run from the repository root with the tools virtualenv (make tools-venv), after
make_tokenizer_vectors.py:
    tools/venv/bin/python tools/parity/make_encoder_vectors.py
Writes tests/data/enc/:
  clip/          CLIPTextModel (save_pretrained): 2 layers, quick_gelu, EOS pooling by id
  clip_legacy/   the same with eos_token_id=2: pooling at argmax(input_ids), as CLIP-L,
                 and tensor names with the `text_model.` prefix of transformers 4 checkpoints
  t5/            T5EncoderModel v1.1 (gated-gelu, relative position buckets)
  t5_relu/       original T5 feed-forward (DenseReluDense wi/wo)
  t5_buckets.txt transformers' relative position buckets for -2000..2000
  vectors.safetensors  per model and prompt: input ids (F32), every hidden state
                       (name.h0 = embeddings ... name.hN), last_hidden_state, pooled
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

TOK = os.path.join("tests", "data", "tok")
OUT = os.path.join("tests", "data", "enc")
PROMPTS = ["a red circle on a blue background",
           "small green triangle in the top left, white background",
           "Photo of an astronaut riding a horse on Mars, cinematic lighting, ultra detailed, 8k " * 3,
           ""]


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def randomize(model, seed):
    """Random weights with some scale, including norms (default init leaves them at 1/0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if "weight" in name else 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5) if "embed" not in name and "bias" not in name
                        else torch.randn(p.shape, generator=g) * 0.5)


def main():
    fresh(OUT)
    vectors = {}
    clip_tok = CLIPTokenizer.from_pretrained(os.path.join(TOK, "clip_tiny"))
    for name, eos in (("clip", clip_tok.eos_token_id), ("clip_legacy", 2)):
        cfg = CLIPTextConfig(vocab_size=len(clip_tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, max_position_embeddings=77, hidden_act="quick_gelu",
                             layer_norm_eps=1e-5, bos_token_id=clip_tok.bos_token_id, eos_token_id=eos,
                             pad_token_id=clip_tok.pad_token_id, projection_dim=32)
        torch.manual_seed(1)
        model = CLIPTextModel(cfg).eval()
        randomize(model, 11)
        model.save_pretrained(os.path.join(OUT, name))
        for i, p in enumerate(PROMPTS):
            ids = clip_tok(p, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
            with torch.no_grad():
                out = model(ids, output_hidden_states=True)
            key = f"{name}.p{i}"
            vectors[key + ".ids"] = ids[0].float()
            for k, h in enumerate(out.hidden_states):
                vectors[f"{key}.h{k}"] = h[0].clone()
            vectors[key + ".last"] = out.last_hidden_state[0].clone()
            vectors[key + ".pooled"] = out.pooler_output[0].clone()
        if name == "clip_legacy":  # the layout of checkpoints saved by transformers 4 (FLUX's CLIP-L)
            from safetensors.torch import load_file
            path = os.path.join(OUT, name, "model.safetensors")
            sd = load_file(path)
            save_file({"text_model." + k: v for k, v in sd.items()}, path, metadata={"format": "pt"})

    t5_tok = T5Tokenizer.from_pretrained(os.path.join(TOK, "t5_tiny"))
    for name, ff in (("t5", "gated-gelu"), ("t5_relu", "relu")):
        cfg = T5Config(vocab_size=len(t5_tok), d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                       relative_attention_num_buckets=32, relative_attention_max_distance=128,
                       feed_forward_proj=ff, layer_norm_epsilon=1e-6, is_encoder_decoder=False, use_cache=False,
                       tie_word_embeddings=False)
        torch.manual_seed(2)
        model = T5EncoderModel(cfg).eval()
        randomize(model, 12)
        model.save_pretrained(os.path.join(OUT, name))
        for i, p in enumerate(PROMPTS):
            n = 512 if i == 2 else 64  # one long sequence reaches the far position buckets
            ids = t5_tok(p, padding="max_length", max_length=n, truncation=True, return_tensors="pt").input_ids
            with torch.no_grad():
                out = model(ids, output_hidden_states=True)
            key = f"{name}.p{i}"
            vectors[key + ".ids"] = ids[0].float()
            for k, h in enumerate(out.hidden_states):
                vectors[f"{key}.h{k}"] = h[0].clone()
            vectors[key + ".last"] = out.last_hidden_state[0].clone()
    # T5's bucket function over relative positions -2000..2000 (32 buckets, max distance 128)
    from transformers.models.t5.modeling_t5 import T5Attention
    rel = torch.arange(-2000, 2001)
    buckets = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    with open(os.path.join(OUT, "t5_buckets.txt"), "w") as f:
        f.write(" ".join(map(str, buckets.tolist())) + "\n")
    with open(os.path.join(OUT, "model_index.json"), "w") as f:  # so the folder reads as a model folder
        json.dump({"_class_name": "EncoderParity", "clip": ["transformers", "CLIPTextModel"],
                   "clip_legacy": ["transformers", "CLIPTextModel"], "t5": ["transformers", "T5EncoderModel"],
                   "t5_relu": ["transformers", "T5EncoderModel"]}, f, indent=1)
    save_file(vectors, os.path.join(OUT, "vectors.safetensors"), metadata={"generator": "tools/parity/make_encoder_vectors.py"})
    print("wrote", OUT, len(vectors), "tensors")


if __name__ == "__main__":
    main()
