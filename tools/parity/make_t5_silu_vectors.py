"""A T5 encoder with feed_forward_proj "gated-silu" (published in some T5 configs),
added beside the encoders of make_encoder_vectors.py without touching them:
tests/data/enc/t5_silu/ and its t5_silu.* tensors appended to
tests/data/enc/vectors.safetensors.

    tools/venv/bin/python tools/parity/make_t5_silu_vectors.py   (after make_encoder_vectors.py)
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import T5Config, T5EncoderModel, T5Tokenizer

sys.path.insert(0, os.path.dirname(__file__))
from make_encoder_vectors import OUT, PROMPTS, TOK, randomize  # noqa: E402


def main():
    vec_path = os.path.join(OUT, "vectors.safetensors")
    vectors = {k: v for k, v in load_file(vec_path).items() if not k.startswith("t5_silu.")}
    tok = T5Tokenizer.from_pretrained(os.path.join(TOK, "t5_tiny"))
    cfg = T5Config(vocab_size=len(tok), d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-silu",
                   layer_norm_epsilon=1e-6, is_encoder_decoder=False, use_cache=False, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = T5EncoderModel(cfg).eval()
    randomize(model, 13)
    model.save_pretrained(os.path.join(OUT, "t5_silu"))
    for i, p in enumerate(PROMPTS):
        n = 512 if i == 2 else 64
        ids = tok(p, padding="max_length", max_length=n, truncation=True, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        key = f"t5_silu.p{i}"
        vectors[key + ".ids"] = ids[0].float()
        for k, h in enumerate(out.hidden_states):
            vectors[f"{key}.h{k}"] = h[0].clone()
        vectors[key + ".last"] = out.last_hidden_state[0].clone()
    save_file(vectors, vec_path, metadata={"generator": "tools/parity/make_encoder_vectors.py + make_t5_silu_vectors.py"})
    idx = os.path.join(OUT, "model_index.json")
    mi = json.load(open(idx))
    mi["t5_silu"] = ["transformers", "T5EncoderModel"]
    json.dump(mi, open(idx, "w"), indent=1)
    print("wrote", os.path.join(OUT, "t5_silu"), "and", sum(k.startswith("t5_silu.") for k in vectors), "tensors")


if __name__ == "__main__":
    main()
