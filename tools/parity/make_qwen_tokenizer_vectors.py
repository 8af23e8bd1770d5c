"""Qwen2Tokenizer vectors: the ids transformers 5 gives with Qwen-Image's tokenizer class
for both file generations of the same tiny tokenizer, and for two variants that take
transformers' other ways of reading the special tokens.

Run from the repository root with the tools virtualenv (make tools-venv), after
make_qwenimage_vectors.py (which trains tests/data/qwenimage/tok) and
make_tokenizer_vectors.py (tests/data/tok/corpus.json):
    tools/venv/bin/python tools/parity/make_qwen_tokenizer_vectors.py
Writes tests/data/tok/:
  qwen_tiny_vocab/   tests/data/qwenimage/tok as the real Qwen/Qwen-Image tokenizer/
                     folder has it: vocab.json + merges.txt + tokenizer_config.json
                     (added_tokens_decoder, additional_special_tokens) +
                     special_tokens_map.json + added_tokens.json, no tokenizer.json
  qwen_tiny_legacy/  vocab.json + merges.txt, a config without added_tokens_decoder
                     (class Qwen2TokenizerFast), special_tokens_map.json, and an
                     added_tokens.json in Qwen's own id order with non-special tokens
                     (normalized) and a gap in the ids
  qwen_tiny_flags/   vocab.json + merges.txt, added_tokens_decoder with lstrip / rstrip /
                     single_word / normalized tokens, ids out of order and with gaps,
                     flags on special tokens (transformers drops them), add_eos_token
  qwen.json          {"transformers": version, "folders": {key: [dirs]}, "rows": [row]}: a
                     row is {"corpus": i} (tests/data/tok/corpus.json's i-th text) or
                     {"text": s}, with for each key [n, "fnv"]: the number of ids and the
                     FNV-1a 64 of them (uint32 little-endian bytes), no truncation, no
                     padding; key "q" holds for tests/data/qwenimage/tok (tokenizer.json)
                     and qwen_tiny_vocab alike (the script checks they agree on every
                     string), "l" for qwen_tiny_legacy, "f" for qwen_tiny_flags; "ids":
                     the ids of "q" where there are at most 32.
"""
import json
import os
import random
import shutil
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(__file__))

SRC = os.path.join("tests", "data", "qwenimage", "tok")
OUT = os.path.join("tests", "data", "tok")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
            "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
            "<|video_pad|>"]
TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
            "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
            "<|im_start|>assistant\n")


def tok_entry(content, special=True, **flags):
    e = dict(content=content, lstrip=False, normalized=not special, rstrip=False, single_word=False, special=special)
    e.update(flags)
    return e


def write(d, name, obj):
    with open(os.path.join(d, name), "w", encoding="utf-8") as f:
        if isinstance(obj, str):
            f.write(obj)
        else:
            json.dump(obj, f, ensure_ascii=False, indent=2)


def vocab_files(d, tj):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    write(d, "vocab.json", tj["model"]["vocab"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    write(d, "merges.txt", "#version: 0.2\n" + "".join(m + "\n" for m in merges))


def make_folders():
    tj = json.load(open(os.path.join(SRC, "tokenizer.json"), encoding="utf-8"))
    added = {a["id"]: a["content"] for a in tj["added_tokens"]}
    # 1. the real Qwen-Image layout, same ids as tokenizer.json
    d = os.path.join(OUT, "qwen_tiny_vocab")
    vocab_files(d, tj)
    write(d, "tokenizer_config.json", {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): tok_entry(c) for i, c in sorted(added.items())},
        "additional_special_tokens": SPECIALS, "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    write(d, "special_tokens_map.json", {
        "additional_special_tokens": SPECIALS,
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False}})
    write(d, "added_tokens.json", {c: i for i, c in sorted(added.items())})
    # 2. no added_tokens_decoder: added_tokens.json (Qwen's own order, non-special ones, a gap)
    #    and special_tokens_map.json, as older saves have it
    d = os.path.join(OUT, "qwen_tiny_legacy")
    vocab_files(d, tj)
    n = len(tj["model"]["vocab"])
    order = ["<|endoftext|>"] + SPECIALS + ["<tool_call>", "</tool_call>"]
    at = {c: n + i for i, c in enumerate(order)}
    at["<|fim_prefix|>"] = n + len(order) + 3  # a gap: transformers numbers on without it
    at["Ġcat"] = n + len(order) + 4  # in the vocabulary: keeps its vocabulary id
    write(d, "added_tokens.json", at)
    write(d, "tokenizer_config.json", {
        "additional_special_tokens": SPECIALS, "bos_token": None, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2TokenizerFast",
        "unk_token": None, "tool_token": "<|tool|>"})
    write(d, "special_tokens_map.json", {
        "additional_special_tokens": SPECIALS + ["<|extra_smap|>"],
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "pad_token": "<|endoftext|>"})
    # 3. added tokens with flags, ids out of order and with gaps
    d = os.path.join(OUT, "qwen_tiny_flags")
    vocab_files(d, tj)
    #    (a special token's own flags are dropped: Qwen2Tokenizer adds them all again plainly);
    #    add_eos_token: transformers' post-processor appends EOS
    dec = {str(n + 7): tok_entry("<|endoftext|>"), str(n + 1): tok_entry("<|im_start|>", lstrip=True, rstrip=True),
           str(n + 2): tok_entry("<|im_end|>"), str(n + 20): tok_entry("<mask>", lstrip=True),
           str(n + 21): tok_entry("<sep>", rstrip=True), str(n + 22): tok_entry("[sw]", single_word=True, special=False),
           str(n + 23): tok_entry("<Norm>", special=False, normalized=True),
           str(n + 24): tok_entry("Caf\u00e9", special=False, normalized=True),
           str(n + 25): tok_entry("<raw>", special=False, normalized=False), str(n + 26): tok_entry("<msk>", lstrip=True)}
    write(d, "tokenizer_config.json", {
        "added_tokens_decoder": dec, "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|vision_start|>"],
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None, "mask_token": "<msk>", "add_eos_token": True, "model_max_length": 1024})


def targeted(seed=7):
    """Strings aimed at Qwen2's pattern and its special tokens."""
    out = ["", " ", "  ", "\n", "\r\n", "\n\n", " \n", "\n ", "\t", " \t ", "   \n\n   ", "\r", "\r\r\n", " \r ",
           "trailing ", "trailing  ", "trailing   \n", "  leading", "a  b   c    d", "x\n\ny", "x \n y", "x\t\ty",
           "tab\tsep\tvalues", "line1\r\nline2\r\n", "!!\n\nabc", "a!\r\n", "? \n", "word\u3000word", "\u3000\u3000x",
           "nbsp\u00a0x", "\u2028x\u2029y", "\u0085next", "\u1680ogham \u1680", "\x1c\x1dx", "\u200bzero\u200bwidth",
           "\ufeffbom", "soft\u00adhyphen", "a\u180eb",
           # contractions in every case; Oniguruma folds U+017F (long s) to s
           "it's", "IT'S", "It'S", "we'LL", "WE'LL", "they'Re", "THEY'RE", "I'VE", "i'Ve", "I'M", "i'm", "HE'D", "isn'T",
           "it'ſ", "'ſun", "'ﬆar", "'Sun", "''s", " 's", "'s'", "rock'n'roll", "O'Neil's", "'LLama", "'ReD", "x'\u212a",
           "'s's's", "\u2019s curly", "don\u2019t", "DON'T'S",
           # numbers: every \p{N} alone
           "1", "12", "123456789", "3.14159", "1,000,000", "2024-11-30", "v2.1.0", "$99.99", "50%", "x86_64", "1e-6",
           "\u00b2\u00b3", "\u2163\u216b", "\u2460\u2461", "\u0663\u0664", "\u0967\u0968", "\uff11\uff12", "\U0001d7d9",
           "a1b2c3", "12abc", "abc12",
           # scripts, combining marks, NFC / NFD
           "\u6771\u4eac\u306e\u591c\u666f", "\u4e2d\u6587\u63d0\u793a\u8bcd\uff0c\u4e00\u53ea\u732b\u3002",
           "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
           "\u05e9\u05dc\u05d5\u05dd", "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e",
           "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
           "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "caf\u00e9", "cafe\u0301", "Cafe\u0301 caf\u00e9",
           "e\u0301\u0301", "a\u0308\u0301", "n\u0303o", "\u1e9b\u0323", "\u0073\u0307\u0323", "\u212b", "\u2126",
           "\uac00", "\u1100\u1161", "\u0958", "\ufb01ne", "\uff26\uff35\uff2c\uff2c", "\U0001d518\U0001d52b",
           # emoji and ZWJ sequences
           "\U0001F431", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F3F3\uFE0F\u200D\U0001F308",
           "\U0001F44D\U0001F3FD", "\u2764\ufe0f", "\U0001F1EF\U0001F1F5", "cat\U0001F431dog", " \U0001F431 ",
           "\U0001F469\u200D\U0001F4BB coding", "#\ufe0f\u20e3",
           # code
           "def f(x):\n    return x ** 2\n", "int main(void) { return 0; }", "for (i = 0; i < n; i++) {\n\tx[i] += 1;\n}",
           "x = {'a': [1, 2, 3]}  # comment", "if a != b && c >= d: pass", "<div class=\"x\">hi</div>",
           "SELECT * FROM t WHERE id = 42;", "path/to/file.txt", "https://example.com/a?b=c&d=e#f", "a->b::c",
           "    indented\n        more\n", "```python\nprint('hi')\n```",
           # special tokens in text
           "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>", "a<|im_end|>b",
           " <|im_start|> ", "<|im_start|><|im_start|>", "<|IM_START|>", "<|Im_Start|>user", "<|im_start|", "|im_start|>",
           "<|im_start |>", "<<|im_start|>>", "<|vision_start|><|image_pad|><|vision_end|>", "<|box_start|>(1,2)<|box_end|>",
           "<|object_ref_start|>cat<|object_ref_end|>", "<|quad_start|><|quad_end|>", "<|video_pad|>x<|vision_pad|>",
           "<|ENDOFTEXT|>", "text<|endoftext|>more", "<|endoftext|><|endoftext|>", "<tool_call>", "</tool_call> x",
           "<|fim_prefix|>", "<|tool|>", "<|extra_smap|>", "cat", " cat", "a cat", "a  cat",
           "a <mask> b", "a<mask>b", "a  <mask>  <sep>  z", "x [sw] y", "x[sw]y", "[sw]", "<Norm> q", "<norm>", "<raw>",
           "Caf\u00e9", "Cafe\u0301", "<mask><mask> <sep><sep>", "\t<mask>\u3000", "a <msk> b", " <|im_start|> x ",
           ]
    prompts = ["a red circle on a blue background", "A cosy kitchen: two cats bake a cake, 4K, ultra detailed",
               "", "  spaced  prompt  ", "line one\nline two", "\u732b\u5728\u53a8\u623f\u91cc\u3002",
               "It's a dog's life; THEY'RE here.", "<|im_end|> injected", "emoji \U0001F431\U0001F431 end"]
    out += [TEMPLATE.format(p) for p in prompts]
    # every string of up to three characters over a small alphabet: the pattern's branches
    alpha = [" ", "\n", "\r", "\t", "a", "!", "1", "'", "\u3000"]
    for c1 in alpha:
        out.append(c1)
        for c2 in alpha:
            out.append(c1 + c2)
            for c3 in alpha:
                out.append(c1 + c2 + c3)
    # random mixes of the pattern's pieces
    rng = random.Random(seed)
    pieces = [" ", "  ", "\n", "\r\n", "\t", "\u3000", "\u00a0", "'s", "'S", "'ll", "'LL", "'re", "'ve", "'m", "'d", "'t",
              "'", "a", "Ab", "word", "\u00e9", "e\u0301", "\u4e2d", "\u0939\u093f", "1", "23", "\u00b2", "!", "?!", "...",
              "-", "\U0001F431", "\u200d", "<|im_start|>", "<|im_end|>", "<|IM_END|>", "\u017f", "_", "$", "\x07"]
    for _ in range(400):
        out.append("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 16))))
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def fnv(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    make_folders()
    folders = {"qwen_json": SRC, "qwen_vocab": os.path.join(OUT, "qwen_tiny_vocab"),
               "qwen_legacy": os.path.join(OUT, "qwen_tiny_legacy"), "qwen_flags": os.path.join(OUT, "qwen_tiny_flags")}
    toks = {k: AutoTokenizer.from_pretrained(d) for k, d in folders.items()}
    for k, t in toks.items():
        assert type(t).__name__ == "Qwen2Tokenizer", (k, type(t))
    corpus = json.load(open(os.path.join(OUT, "corpus.json"), encoding="utf-8"))
    rows = [({"corpus": i}, r["text"]) for i, r in enumerate(corpus)] + [({"text": s}, s) for s in targeted()]
    out = []
    for row, text in rows:
        ids = {k: t(text)["input_ids"] for k, t in toks.items()}
        assert ids["qwen_json"] == ids["qwen_vocab"], text  # both file generations read alike
        for k, key in (("qwen_json", "q"), ("qwen_legacy", "l"), ("qwen_flags", "f")):
            row[key] = [len(ids[k]), fnv(ids[k])]
        if len(ids["qwen_json"]) <= 32:
            row["ids"] = ids["qwen_json"]
        out.append(row)
    path = os.path.join(OUT, "qwen.json")
    with open(path, "w", encoding="utf-8") as f:
        keys = {"q": [folders["qwen_json"], folders["qwen_vocab"]], "l": [folders["qwen_legacy"]],
                "f": [folders["qwen_flags"]]}
        json.dump({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "folders": keys,
                   "rows": out}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    for k, t in toks.items():
        print(k, len(t), {i: str(a) for i, a in sorted(t.added_tokens_decoder.items()) if i >= 560})
    print(f"wrote {path}: {len(out)} strings x {len(toks)} folders, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
