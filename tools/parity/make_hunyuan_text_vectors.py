"""HunyuanVideo's Llama prompt embeddings: diffusers' HunyuanVideoPipeline.
_get_llama_prompt_embeds (the prompt template, its crop_start, right padding to
max_sequence_length + crop_start, hidden_states[-(skip + 1)], the cropped mask) on
tests/data/llama's tiny LlamaModel and a tiny Llama-3-style tokenizer trained here
(byte-level BPE behind Llama 3's split pattern, <|begin_of_text|> prepended).

    tools/venv/bin/python tools/parity/make_hunyuan_text_vectors.py   (after make_llama_vectors.py)
Writes tests/data/llama/tokenizer/ and tests/data/llama/hunyuan_text.safetensors:
  <i>.embeds [max_sequence_length, D], <i>.mask [max_sequence_length] for each prompt i,
  tok.<j> the tokenizer's ids (with <|begin_of_text|>) of string j,
  metadata: the prompts, the strings, crop_start, max_sequence_length, skip.
"""
import json
import os
import types

import torch
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE, HunyuanVideoPipeline
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaModel, PreTrainedTokenizerFast

OUT = os.path.join("tests", "data", "llama")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
PROMPTS = ["A cat walks.",
           "a red circle moving from left to right on a blue background, then a small green square appears and the camera "
           "pans slowly to the right while the light changes from morning to evening over the whole scene"]
MAXSEQ, SKIP = 48, 2


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [DEFAULT_PROMPT_TEMPLATE["template"]] * 4 + PROMPTS + [
        "the quick brown fox jumps over the lazy dog 12345 times", "Describe the video, camera angles and movements."]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   pad_token="<|end_of_text|>", padding_side="right", model_max_length=131072)
    fast.save_pretrained(os.path.join(OUT, "tokenizer"))
    return fast


def main():
    tok = train_tokenizer()
    te = LlamaModel.from_pretrained(os.path.join(OUT, "text_encoder")).eval()
    assert len(tok) <= te.config.vocab_size
    # crop_start for this tokenizer: the template's tokens less its `{}` and <|eot_id|> (the pipeline's own rule
    # when a template gives none), taken without padding
    crop = len(tok(DEFAULT_PROMPT_TEMPLATE["template"])["input_ids"]) - 2
    template = {"template": DEFAULT_PROMPT_TEMPLATE["template"], "crop_start": crop}
    ns = types.SimpleNamespace(text_encoder=te, tokenizer=tok)
    vec = {}
    for i, p in enumerate(PROMPTS):
        with torch.no_grad():
            e, m = HunyuanVideoPipeline._get_llama_prompt_embeds(ns, p, template, device="cpu", dtype=torch.float32,
                                                                 max_sequence_length=MAXSEQ, num_hidden_layers_to_skip=SKIP)
        vec[f"{i}.embeds"] = e[0].clone()
        vec[f"{i}.mask"] = m[0].float().clone()
    # the tokenizer alone, on strings aimed at Llama 3's split (digit runs of up to three, contractions, newlines)
    strings = ["12345 items on 2024-12-01, 7.5% off", "I'm sure they'll say \"it's 1000000\"\n\n\tok", "  leading spaces, trailing   ",
               "x" * 40 + " 0123456789", "caf\u00e9 na\u00efve \u00fcber 42\u00b2"]
    for i, t in enumerate(strings):
        vec[f"tok.{i}"] = torch.tensor(tok(t)["input_ids"], dtype=torch.float32)
    idx = json.load(open(os.path.join(OUT, "model_index.json")))
    idx["tokenizer"] = ["transformers", "PreTrainedTokenizerFast"]
    json.dump(idx, open(os.path.join(OUT, "model_index.json"), "w"), indent=2)
    save_file(vec, os.path.join(OUT, "hunyuan_text.safetensors"),
              metadata={"generator": "tools/parity/make_hunyuan_text_vectors.py", "prompts": json.dumps(PROMPTS),
                        "crop_start": str(crop), "max_sequence_length": str(MAXSEQ), "skip": str(SKIP),
                        "strings": json.dumps(strings)})
    print("crop_start", crop, "masks", [int(vec[f"{i}.mask"].sum()) for i in range(len(PROMPTS))])


if __name__ == "__main__":
    main()
