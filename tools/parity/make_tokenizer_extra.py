"""Extra tokenizer vectors for the classes issue 24 names, as transformers 5 reads each
tokenizer folder of tests/data/tok and difflet-tiny: special tokens typed in other
cases, control-only and whitespace-only strings, trailing and repeated whitespace,
zero-width and BOM characters, mixed scripts, NFC/NFD pairs, emoji ZWJ sequences.

    tools/venv/bin/python tools/parity/make_tokenizer_extra.py
Writes tests/data/tok/extra.json: {"transformers": version, "cases": [{"text": ...,
"<tokenizer>": [ids...]}, ...]} (no truncation, no padding).
"""
import json
import os
import shutil
import tempfile

import transformers
from transformers import AutoTokenizer

DIRS = {"clip_tiny": "tests/data/tok/clip_tiny", "clip_real": "tests/data/tok/clip_real", "t5_tiny": "tests/data/tok/t5_tiny",
        "t5_tiny_legacy": "tests/data/tok/t5_tiny_legacy", "tiny_clip": "models/difflet-tiny/tokenizer",
        "tiny_t5": "models/difflet-tiny/tokenizer_2",
        # added-token flags: CLIP specials matched after normalisation; T5 with lstrip / rstrip /
        # single_word / normalized tokens (folders made by make_tokenizer_flags() below)
        "clip_tiny_norm": "tests/data/tok/clip_tiny_norm", "t5_tiny_flags": "tests/data/tok/t5_tiny_flags"}
TEXTS = ["<|ENDOFTEXT|> cat", "<|EndOfText|>", "<|STARTOFTEXT|>x", "a <|startoftext|> b", "x<|endoftext|>y", "<|endoftext|>",
         "</s> a", "<unk>", "<pad>x", "\x01\x02", "\x07", " \x01 ", "\t\n", "   ", "trail ", "trail  \t", "  lead",
         "a  b   c", "\u200b", "\ufeffa", "\u00e9", "e\u0301", "Caf\u00e9 cafe\u0301", "\U0001F469\u200D\U0001F4BB",
         "\U0001F468\u200D\U0001F469\u200D\U0001F467", "Ελληνικά и русский 中文 日本語 한국어", "I'M HERE, you'RE not",
         "x\u00a0y", "tab\tsep", "\u3000full\u3000width", "ｆｕｌｌ", "1,234.5e-6", "a\r\nb",
         "<extra_id_3> x", "a<extra_id_0>b", "<extra_id_4>", "x <extra_id_9>", "<extra_id_99> <extra_id_100>",
         "a <mask> b", "a<sep>  b", "x [sw] y", "x[sw]y", "[sw]", "<Norm> q", "<norm>", "a  <mask>  <sep>  z",
         "<mask><mask> <sep><sep>", "\t<mask>\u3000"]
# T5 from spiece.model alone with sentinels: extra_ids 5, and the T5Tokenizer default (100)
SPM_CONFIGS = {"t5_spm_extra5": {"tokenizer_class": "T5Tokenizer", "extra_ids": 5},
               "t5_spm_default": {"tokenizer_class": "T5Tokenizer"}}


def make_tokenizer_flags():
    """tests/data/tok/clip_tiny_norm and t5_tiny_flags from clip_tiny and t5_tiny"""
    src, dst = "tests/data/tok/clip_tiny", "tests/data/tok/clip_tiny_norm"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    j = json.load(open(f"{dst}/tokenizer.json"))
    for a in j["added_tokens"]:
        a["normalized"] = True
    json.dump(j, open(f"{dst}/tokenizer.json", "w"), ensure_ascii=False)
    src, dst = "tests/data/tok/t5_tiny", "tests/data/tok/t5_tiny_flags"
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{f}", dst)
    j = json.load(open(f"{dst}/tokenizer.json"))
    vocab = len(j["model"]["vocab"])
    flags = [("<mask>", dict(lstrip=True, rstrip=False, single_word=False, normalized=False)),
             ("<sep>", dict(lstrip=False, rstrip=True, single_word=False, normalized=False)),
             ("[sw]", dict(lstrip=False, rstrip=False, single_word=True, normalized=False)),
             ("<Norm>", dict(lstrip=False, rstrip=False, single_word=False, normalized=True))]
    for i, (c, fl) in enumerate(flags):
        j["added_tokens"].append(dict(id=vocab + i, content=c, special=False, **fl))
    json.dump(j, open(f"{dst}/tokenizer.json", "w"), ensure_ascii=False)


def main():
    make_tokenizer_flags()
    toks = {k: AutoTokenizer.from_pretrained(d) for k, d in DIRS.items()}
    tmp = tempfile.mkdtemp()
    for k, cfg in SPM_CONFIGS.items():  # test_text.c builds the same folders
        d = os.path.join(tmp, k)
        os.makedirs(d)
        shutil.copy("tests/data/tok/t5_tiny/spiece.model", d)
        json.dump(dict(cfg, model_max_length=512, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"),
                  open(os.path.join(d, "tokenizer_config.json"), "w"))
        toks[k] = AutoTokenizer.from_pretrained(d)
    cases = [dict({"text": t}, **{k: tok(t)["input_ids"] for k, tok in toks.items()}) for t in TEXTS]
    out = os.path.join("tests", "data", "tok", "extra.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "spm_configs": SPM_CONFIGS, "cases": cases}, f,
                  ensure_ascii=False)
    shutil.rmtree(tmp)
    print(f"wrote {out}: {len(cases)} strings x {len(toks)} tokenizers")


if __name__ == "__main__":
    main()
