"""Gemma tokenizer vectors: a tiny tokenizer built the way Gemma 3's is, and the ids
transformers 5 gives for it, as LTX2Pipeline calls it.

Gemma 3's tokenizer (GemmaTokenizer in transformers 5, GemmaTokenizerFast before) is a
BPE model with byte_fallback (`<0x00>`..`<0xFF>` in the vocabulary) and fuse_unk, a
normalizer Replace(" ", "▁"), a pre-tokenizer Split(" ", merged_with_previous) (a no-op
after that normalizer), a decoder Replace("▁", " ") + ByteFallback + Fuse, `<bos>`
prepended by the post-processor (add_bos_token), and its special tokens as added
tokens: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, [multimodal] 5, <unusedN>,
<start_of_turn>, <end_of_turn>, <start_of_image>, <end_of_image>, and
<image_soft_token> one past the model's vocabulary. transformers 5 rebuilds that
pipeline from the class, taking only the vocabulary and merges from tokenizer.json.

Here merges are trained with the tokenizers library on a small caption corpus (a
limited alphabet, so CJK, emoji and rare letters go through byte fallback), the
vocabulary is laid out as Gemma 3's is, and GemmaTokenizer(vocab, merges) is saved
with save_pretrained.

Run from the repository root with the tools virtualenv, after make_tokenizer_vectors.py:
    tools/venv/bin/python tools/parity/make_gemma_tokenizer_vectors.py
Writes tests/data/tok/:
  gemma_tiny/       tokenizer.json and tokenizer_config.json as save_pretrained writes
                    them, the config completed as Gemma 3's is (add_bos_token true,
                    add_eos_token false, added_tokens_decoder listing every added token)
  gemma_tiny_fast/  the same tokenizer.json with the config save_pretrained wrote, naming
                    GemmaTokenizerFast: no add_bos_token (tokenizer.json's post-processor
                    adds <bos>), no added_tokens_decoder: the same ids, as the
                    tokenizers library gives for tokenizer.json alone
  gemma_tiny_nobytes/  tokenizer.json with <0x9F> renamed <0x9f> (no config): characters
                    with that byte become <unk> (fuse_unk); the tokenizers library's ids
                    are the row's "nb" [n, fnv] where they differ from "ids"
  gemma.json        {"transformers", "tokenizers", "rows": [row], "padded": [case]}: a row
                    is {"text": s, "n": number of ids, "fnv": FNV-1a 64 of the ids (uint32
                    little-endian), "ids": the ids where there are at most 64}, encoded with
                    add_special_tokens=True, no truncation, no padding; a case is {"text",
                    "max_length", "ids"} as LTX2Pipeline encodes: padding_side "left",
                    padding="max_length", truncation=True.
The strings: tests/data/tok/corpus.json's 1,000, then strings aimed at Gemma's pipeline.
"""
import json
import os
import random
import shutil
import sys

import tokenizers
import transformers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer
from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

sys.path.insert(0, os.path.dirname(__file__))
from corpus import caption_corpus, word_corpus  # noqa: E402

OUT = os.path.join("tests", "data", "tok")
N_UNUSED = 8
META = "\u2581"


def train_merges():
    """BPE merges over the corpus, pieces starting at ▁ as SentencePiece's do."""
    text = caption_corpus(2000, seed=11) + word_corpus(1500, seed=12)
    text += ["caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber", "\u6771\u4eac \u6771\u4eac \u5317\u4eac",
             "line one\nline two\n\nend", "tab\tsep"] * 20
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", META)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="never", split=True)
    # printable ASCII and the corpus's few other letters; the rest falls back to bytes
    trainer = trainers.BpeTrainer(vocab_size=720, limit_alphabet=110, show_progress=False, special_tokens=[],
                                  initial_alphabet=[chr(c) for c in range(0x21, 0x7f)])
    tok.train_from_iterator(text, trainer)
    tj = json.loads(tok.to_str())
    vocab = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in tj["model"]["merges"]]
    return [v for v, _ in vocab], merges


def build_vocab(pieces, merges):
    """Gemma 3's layout: specials, unused, turn markers, whitespace runs, the 256 byte
    tokens, the model's pieces, then the image markers (<image_soft_token> is added
    one past the vocabulary)."""
    order = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
    order += [f"<unused{i}>" for i in range(N_UNUSED)]
    order += ["<start_of_turn>", "<end_of_turn>"]
    ws = ["\n", "\n\n", "\n\n\n", META, META * 2, META * 3, META * 4, "\t", "\t\t"]
    order += ws
    order += [f"<0x{b:02X}>" for b in range(256)]
    order += [p for p in pieces if p not in order]
    order += ["<start_of_image>", "<end_of_image>"]
    vocab = {p: i for i, p in enumerate(order)}
    # whitespace runs merge as SentencePiece's pieces do; a merge across ▁ pieces
    extra = [("\n", "\n"), ("\n\n", "\n"), (META, META), (META * 2, META), (META * 2, META * 2), ("\t", "\t")]
    merges = merges + [m for m in extra if m not in merges]
    for a, b in merges:
        assert a in vocab and b in vocab and a + b in vocab, (a, b)
    return vocab, merges


def targeted(seed=5):
    out = ["", " ", "  ", "   ", "\n", "\n\n", "\n\n\n\n", " \n ", "\t", "\t\t\t", "a", " a", "a ", " a ",
           "  two leading", "two trailing  ", "many     spaces     here", "a\nb", "a \n b", "x\r\ny", "\r",
           "tab\tin\tthe\tmiddle", "\u00a0nbsp\u00a0", "\u3000ideographic\u3000space", "\u2028\u2029",
           "zero\u200bwidth", "\ufeffbom", "\x01soh", "\x07bell\x1b", "\x7f", "\u0080\u0081\u009f",
           # byte fallback: characters outside the tiny alphabet, 2-, 3- and 4-byte UTF-8
           "\u00e9", "\u00ff", "\u0100", "\u03a9", "\u0416", "\u05d0", "\u0645", "\u0939\u093f", "\u0e01",
           "\u6771\u4eac", "\u6771", "\u5317\u4eac\u5e02", "\ud55c\uad6d\uc5b4", "\u3042\u3044\u3046",
           "\U0001F431", "\U0001F431\U0001F431", "cat\U0001F431dog", " \U0001F431 ", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
           "\U0001F3F3\ufe0f\u200d\U0001F308", "\U0001F44D\U0001F3FD", "\u2764\ufe0f", "\U0001F1EF\U0001F1F5",
           "\U0001d518\U0001d52b\U0001d526", "\U0010fffd", "\ufffd", "caf\u00e9", "cafe\u0301", "na\u00efve",
           "\u00c5ngstr\u00f6m", "\u212b", "\ufb01ne", "\uff26\uff35\uff2c\uff2c", "\u00bd \u00b2 \u2163",
           # ▁ in the text is the same as a space after the normalizer
           META, META + "hello", "hello" + META + "world", META * 5, " " + META + " ",
           # literal byte-token and special-token strings
           "<0x41>", "<0xE2><0x96>", "<0x0A>", "<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]",
           "<bos>hello", "hello<eos>", " <bos> ", "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
           "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
           "<start_of_image><image_soft_token><image_soft_token><end_of_image>", "a<image_soft_token>b",
           "<unused0>", "<unused7>", "<unused8>", "<unused0><unused1>", "<BOS>", "<bos", "bos>", "<<bos>>",
           "<start_of_turn", "<start_of_turn >", "x <mask> y", "<pad><pad>",
           # prompts like LTX-2's
           "A cinematic shot of a red fox running through a snowy forest at dawn, soft golden light.",
           "The camera slowly pans left. A woman in a blue coat walks along the beach; waves crash.",
           "Close-up: a cat's eyes reflect neon signs \u2014 \u6771\u4eac at night, rain, 4K.",
           ]
    rng = random.Random(seed)
    pieces = [" ", "  ", "\n", "\t", META, "a", "the", " the", "cat", "red", "\u00e9", "\u6771", "\U0001F431", "1", "23",
              ".", ",", "!", "'s", "<bos>", "<eos>", "<start_of_turn>", "<image_soft_token>", "<0x41>", "\u200d", "\x01", "\u5e02", "\U0001F431\u5e02\U0001F431"]
    for _ in range(300):
        out.append("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 20))))
    return out


def fnv(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    pieces, merges = train_merges()
    vocab, merges = build_vocab(pieces, merges)
    d = os.path.join(OUT, "gemma_tiny")
    shutil.rmtree(d, ignore_errors=True)
    tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False,
                         extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                               "image_token": "<image_soft_token>"},
                         model_max_length=1024)
    # every special piece of the vocabulary is an added token, as in Gemma 3's files
    specials = ["[multimodal]"] + [f"<unused{i}>" for i in range(N_UNUSED)] + ["<start_of_turn>", "<end_of_turn>"]
    tok.add_tokens([transformers.AddedToken(s, special=True, normalized=False) for s in specials], special_tokens=True)
    tok.save_pretrained(d)
    # Gemma 3's own tokenizer_config.json (written by transformers 4) also lists every
    # added token in added_tokens_decoder and says add_bos_token / add_eos_token
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
    cfg["add_bos_token"], cfg["add_eos_token"] = True, False
    cfg["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                   "single_word", "special")} for a in tj["added_tokens"]}
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=2)
    # the Fast variant: add_bos_token left to tokenizer.json's post-processor
    d2 = os.path.join(OUT, "gemma_tiny_fast")
    shutil.rmtree(d2, ignore_errors=True)
    shutil.copytree(d, d2)
    cfg = json.load(open(os.path.join(d2, "tokenizer_config.json"), encoding="utf-8"))
    for k in ("add_bos_token", "add_eos_token", "added_tokens_decoder"):
        cfg.pop(k)
    cfg["tokenizer_class"] = "GemmaTokenizerFast"
    json.dump(cfg, open(os.path.join(d2, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=2)

    t = AutoTokenizer.from_pretrained(d)
    t2 = AutoTokenizer.from_pretrained(d2)
    assert type(t).__name__ == "GemmaTokenizer" and type(t2).__name__ == "GemmaTokenizer", (type(t), type(t2))
    assert t.padding_side == "left"
    corpus = [r["text"] for r in json.load(open(os.path.join(OUT, "corpus.json"), encoding="utf-8"))]
    texts, seen = [], set()
    for i, s in enumerate(corpus):
        seen.add(s)
        texts.append(({"corpus": i}, s))
    for s in targeted():
        if s not in seen:
            seen.add(s)
            texts.append(({"text": s}, s))
    # the tokenizers library on tokenizer.json alone (its own pipeline, no class): the same ids
    raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    # and with a byte token missing (<0x9F>): characters with that byte become <unk>,
    # fused, and a pending <unk> goes out after later byte tokens, as tokenizers does
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    tj["model"]["vocab"]["<0x9f>"] = tj["model"]["vocab"].pop("<0x9F>")  # renamed: the ids stay dense
    d3 = os.path.join(OUT, "gemma_tiny_nobytes")
    shutil.rmtree(d3, ignore_errors=True)
    os.makedirs(d3)
    json.dump(tj, open(os.path.join(d3, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=2)
    nobytes = Tokenizer.from_file(os.path.join(d3, "tokenizer.json"))
    rows = []
    n_fallback = 0
    byte_ids = {vocab[f"<0x{b:02X}>"] for b in range(256)}
    for row, s in texts:
        ids = t(s, add_special_tokens=True)["input_ids"]
        assert ids == t2(s, add_special_tokens=True)["input_ids"], s
        assert ids == raw.encode(s).ids, s
        n_fallback += any(i in byte_ids for i in ids)
        row.update(n=len(ids), fnv=fnv(ids))
        nb = nobytes.encode(s).ids
        if nb != ids:
            row["nb"] = [len(nb), fnv(nb)]
        if len(ids) <= 64:
            row["ids"] = ids
        rows.append(row)
    # as LTX2Pipeline calls it: prompt.strip(), left padding to max_length, truncation
    t.padding_side = "left"
    padded = []
    cases = [(s, m) for s in ["a red fox", "", "  spaced out  ", "\U0001F431 cat <start_of_turn>", corpus[950],
                              corpus[990], "\u6771\u4eac " * 40] for m in (1, 2, 3, 8, 16, 64, 128)]
    for s, m in cases:
        ids = t(s.strip(), padding="max_length", max_length=m, truncation=True, add_special_tokens=True)["input_ids"]
        assert len(ids) == m
        padded.append({"text": s.strip(), "max_length": m, "ids": ids})
    path = os.path.join(OUT, "gemma.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "rows": rows,
                   "padded": padded}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("vocab", len(vocab), "merges", len(merges), "len(tok)", len(t), "pad", t.pad_token_id, "bos", t.bos_token_id,
          "added", {i: str(a) for i, a in sorted(t.added_tokens_decoder.items()) if i > 20})
    print(f"wrote {path}: {len(rows)} strings ({n_fallback} with byte fallback), {len(padded)} padded cases, "
          f"{os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
