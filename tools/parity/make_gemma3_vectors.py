"""Gemma 3 text-encoder parity vectors: LTX2Pipeline._get_gemma_prompt_embeds runs
Gemma3ForConditionalGeneration on left-padded ids with the attention mask and keeps
every hidden state (the embeddings, each layer's output, the last through the final
norm), padded rows included.

    tools/venv/bin/python tools/parity/make_gemma3_vectors.py
Writes tests/data/gemma3/:
  model_index.json, text_encoder/  a tiny random Gemma3ForConditionalGeneration
      (save_pretrained: the checkpoint names `language_model.model.*`, which
      transformers 5 maps to its `model.language_model.*` on load; weights stored
      bf16 to stay small, the reference loads them in f32). Text: hidden 72 (sqrt(72)
      is not a bf16 number, so the embedding scale's dtype shows), 4 heads / 2 KV
      heads of dim 16 (64 != hidden), query_pre_attn_scalar 24 (not head_dim), 6
      layers sliding, sliding, full x 2, sliding_window 4, full layers RoPE theta 1e6
      with linear scaling x8, sliding layers theta 1e4, gelu_pytorch_tanh MLP 128.
      Norm weights random around 0 (the norms scale by 1 + w). Vision: the smallest
      SigLIP tower that constructs (never run).
  config_v4.json  the same text model as a transformers-4 style config (rope_theta,
      rope_local_base_freq, rope_scaling, sliding_window_pattern, no layer_types),
      checked here to give transformers 5 the same layer types and RoPE settings.
  vectors.safetensors  per sequence s: s.ids [n] i32 (pad id 0 in the padded
      positions, as the tokenizer pads), s.mask [n] i32 (0 for the left padding),
      s.hidden [L+1, n, D] f32 = torch.stack(hidden_states) (the default attention,
      sdpa, as the pipeline loads it). a.emb_bf16 [n, D]: hidden_states[0] of the
      same weights run in bf16 (the embedding scale rounded to bf16 first).
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig

OUT = os.path.join("tests", "data", "gemma3")

TEXT = dict(vocab_size=300, hidden_size=72, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=4, rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=512,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1, image_size=8,
              patch_size=4, vision_use_head=False)

# the same text model as transformers 4.x wrote it (Gemma 3's Hub configs look so)
TEXT_V4 = {k: v for k, v in TEXT.items() if k not in ("layer_types", "rope_parameters")}
TEXT_V4.update(model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window_pattern=3)

# (name, n, left padding): padded and not, one token, fewer valid tokens than the
# window (sliding = full), more (the window matters), two 128-row matmul chunks
SEQS = [("a", 16, 5), ("b", 12, 0), ("c", 1, 0), ("d", 10, 8), ("e", 140, 9)]


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    torch.manual_seed(11)
    cfg = Gemma3Config(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4)
    m = Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                v = 0.2 * torch.randn(p.shape)  # the norms scale by (1 + w)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape) * 0.5
            else:
                v = torch.randn(p.shape) / (p.shape[-1] ** 0.5)
            p.copy_(v.bfloat16().float())  # stored bf16: the f32 run uses exactly these values
    m.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "text_encoder"))
    # the reference loads the saved weights in f32 as a user would (casting m back
    # would leave its bf16-rounded RoPE and embedding-scale buffers behind)
    m = Gemma3ForConditionalGeneration.from_pretrained(os.path.join(OUT, "text_encoder"), dtype=torch.float32).eval()
    assert m.config._attn_implementation == "sdpa", m.config._attn_implementation
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump({"_class_name": "LTX2Pipeline", "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"]},
                  f, indent=2)

    # the v4-style config means the same model to transformers 5
    t5 = m.config.text_config
    t4 = Gemma3TextConfig(**{k: v for k, v in TEXT_V4.items() if k != "model_type"})
    assert t4.layer_types == t5.layer_types, (t4.layer_types, t5.layer_types)
    assert t4.rope_parameters == t5.rope_parameters, (t4.rope_parameters, t5.rope_parameters)
    with open(os.path.join(OUT, "config_v4.json"), "w") as f:
        json.dump(TEXT_V4, f, indent=2)

    g = torch.Generator().manual_seed(12)
    vec = {}
    L = TEXT["num_hidden_layers"]
    for name, n, pad in SEQS:
        ids = torch.randint(1, TEXT["vocab_size"], (1, n), generator=g)
        ids[0, :pad] = 0
        mask = torch.ones(1, n, dtype=torch.long)
        mask[0, :pad] = 0
        with torch.no_grad():
            out = m(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            hs = out.hidden_states
            last = m.model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert len(hs) == L + 1 and torch.equal(hs[-1], last)
        h = torch.stack([x[0] for x in hs])  # [L+1, n, D]
        assert torch.isfinite(h).all()
        vec[f"{name}.ids"] = ids[0].int()
        vec[f"{name}.mask"] = mask[0].int()
        vec[f"{name}.hidden"] = h.contiguous()
        # how much the padded rows depend on the attention implementation (eager: the
        # all-masked rows average every key; sdpa: they attend to nothing)
        if pad:
            m.set_attn_implementation("eager")
            with torch.no_grad():
                he = torch.stack([x[0] for x in m(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states])
            m.set_attn_implementation("sdpa")
            dv = (he[:, pad:] - h[:, pad:]).abs().max().item()
            dp = (he[:, :pad] - h[:, :pad]).abs().max().item()
            print(f"{name}: eager vs sdpa: valid rows {dv:.3g}, padded rows {dp:.3g}")
        # the per-layer view of LTX2Pipeline's packed prompt_embeds
        packed = torch.stack(hs, dim=-1).flatten(2, 3)[0]  # [n, D * (L+1)], d-major
        assert torch.equal(packed.view(n, -1, L + 1).permute(2, 0, 1), h)
        print(f"{name}: n {n}, left padding {pad}, max|h| per state",
              [round(x.abs().max().item(), 2) for x in hs])

    # the bf16 model's embeddings: the scale rounded to bf16 (sqrt(72) = 8.485 -> 8.5)
    mb = Gemma3ForConditionalGeneration.from_pretrained(os.path.join(OUT, "text_encoder"), dtype=torch.bfloat16).eval()
    ids = vec["a.ids"].long()[None]
    with torch.no_grad():
        e = mb(input_ids=ids, attention_mask=vec["a.mask"].long()[None], output_hidden_states=True).hidden_states[0][0]
    vec["a.emb_bf16"] = e.float()

    # attn_logit_softcapping is never applied by transformers' Gemma3Attention: a
    # config setting it gives the same numbers (the C side accepts and ignores it)
    cfg2 = Gemma3Config(text_config=dict(TEXT, attn_logit_softcapping=50.0), vision_config=VISION, mm_tokens_per_image=4)
    m2 = Gemma3ForConditionalGeneration(cfg2).eval()
    m2.load_state_dict(m.state_dict())
    ids, mask = vec["a.ids"].long()[None], vec["a.mask"].long()[None]
    with torch.no_grad():
        h2 = torch.stack(m2(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states)[:, 0]
    assert torch.equal(h2, vec["a.hidden"]), "attn_logit_softcapping changed the output"

    save_file(vec, os.path.join(OUT, "vectors.safetensors"),
              metadata={"generator": "tools/parity/make_gemma3_vectors.py", "layers": str(L),
                        "layout": "hidden [L+1, n, D]"})
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print("wrote", len(vec), "tensors;", total, "bytes in", OUT)


if __name__ == "__main__":
    main()
