"""LTX-2's text path end to end: diffusers' LTX2Pipeline._get_gemma_prompt_embeds (the
prompt stripped, Gemma's tokenizer with LEFT padding and truncation, every Gemma 3
hidden state stacked) and LTX2TextConnectors on a tiny random Gemma 3 whose vocabulary
fits tests/data/tok/gemma_tiny (made by make_gemma_tokenizer_vectors.py).

    tools/venv/bin/python tools/parity/make_ltx2_text_vectors.py
Writes tests/data/ltx2/text/: model_index.json, tokenizer -> ../../tok/gemma_tiny,
text_encoder/ (Gemma3ForConditionalGeneration: 72 wide, 6 layers, sliding window 4,
stored bf16), connectors/ (LTX-2.3 generation: per-modality projections of the 72 x 7 stacked states,
8 registers; stored bf16), and
tests/data/ltx2/text_vectors.safetensors with, per prompt i: <i>.embeds [16, 72 x 7]
(the stacked hidden states), <i>.valid, <i>.video [16, 64], <i>.audio [16, 72]; the
prompts are in the file's metadata.
"""
import json
import os
import shutil
import types

import torch
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
from safetensors.torch import save_file
from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

OUT = os.path.join("tests", "data", "ltx2", "text")
T = 16
PROMPTS = ["  A red circle moves to the right.  ",
           "a small green square slides down on a blue background while the camera pans slowly and the light "
           "changes from morning to evening over the whole scene",
           "café 🎥 x"]


def main():
    torch.set_grad_enabled(False)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    os.symlink(os.path.join("..", "..", "tok", "gemma_tiny"), os.path.join(OUT, "tokenizer"))
    tok = AutoTokenizer.from_pretrained(os.path.join(OUT, "tokenizer"))
    torch.manual_seed(21)
    text = dict(vocab_size=len(tok), hidden_size=72, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=4, rms_norm_eps=1e-6,
                hidden_activation="gelu_pytorch_tanh", max_position_embeddings=512,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1, image_size=8,
                  patch_size=4, vision_use_head=False)
    te = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4))
    for name, p in te.named_parameters():
        v = 0.2 * torch.randn(p.shape) if "norm" in name else (
            torch.randn(p.shape) * 0.5 if "embed_tokens" in name else torch.randn(p.shape) / p.shape[-1] ** 0.5)
        p.copy_(v.bfloat16().float())
    te.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "text_encoder"))
    te = Gemma3ForConditionalGeneration.from_pretrained(os.path.join(OUT, "text_encoder"), dtype=torch.float32).eval()
    conn = LTX2TextConnectors(caption_channels=72, text_proj_in_factor=7, video_connector_num_attention_heads=4,
                              video_connector_attention_head_dim=16, video_connector_num_layers=2,
                              video_connector_num_learnable_registers=8, audio_connector_num_attention_heads=4,
                              audio_connector_attention_head_dim=18, audio_connector_num_layers=1,
                              audio_connector_num_learnable_registers=8, connector_rope_base_seq_len=64,
                              per_modality_projections=True, video_hidden_dim=64, audio_hidden_dim=72).eval()
    for name, p in conn.named_parameters():
        if "learnable_registers" not in name:
            p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn(p.shape) if p.dim() == 1
                    else torch.randn(p.shape) / p.shape[1] ** 0.5)
        p.copy_(p.bfloat16().float())  # stored bf16: the f32 run uses exactly these values
    conn.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "connectors"))
    conn = LTX2TextConnectors.from_pretrained(os.path.join(OUT, "connectors"), torch_dtype=torch.float32).eval()
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump({"_class_name": "LTX2Pipeline", "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
                   "tokenizer": ["transformers", "GemmaTokenizerFast"],
                   "connectors": ["diffusers", "LTX2TextConnectors"]}, f, indent=2)
    ns = types.SimpleNamespace(text_encoder=te, tokenizer=tok, _execution_device=torch.device("cpu"))
    vec = {}
    for i, p in enumerate(PROMPTS):
        embeds, mask = LTX2Pipeline._get_gemma_prompt_embeds(ns, p, max_sequence_length=T, device=torch.device("cpu"),
                                                             dtype=torch.float32)
        video, audio, _ = conn(embeds, mask, padding_side="left")
        vec[f"{i}.embeds"] = embeds[0].clone()
        vec[f"{i}.valid"] = torch.tensor([float(mask.sum())])
        vec[f"{i}.video"] = video[0].clone()
        vec[f"{i}.audio"] = audio[0].clone()
        print(i, "valid", int(mask.sum()))
    save_file(vec, os.path.join("tests", "data", "ltx2", "text_vectors.safetensors"),
              metadata={"prompts": json.dumps(PROMPTS)})


if __name__ == "__main__":
    main()
