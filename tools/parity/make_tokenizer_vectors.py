"""Tokenizer test vectors: tokenizers trained on a caption corpus, CLIP's real
49,408-token vocabulary, and the ids the reference libraries give for a corpus of
varied strings. The C tests (tests/test_text.c) must reproduce every id.

Run from the repository root with the tools virtualenv (make tools-venv):
    tools/venv/bin/python tools/parity/make_tokenizer_vectors.py
Writes tests/data/tok/:
  clip_tiny/       CLIP-style byte-level BPE trained here (vocab.json, merges.txt,
                   tokenizer.json, configs) -- transformers.CLIPTokenizer is the oracle
  clip_real/       CLIP's real vocabulary (from open_clip's bpe_simple_vocab_16e6.txt.gz)
  t5_tiny/         T5-style SentencePiece Unigram trained here (spiece.model,
                   tokenizer.json) -- transformers.T5Tokenizer is the oracle
  t5_tiny_legacy/  the same model with the older tokenizer.json pipeline that
                   published T5 checkpoints ship (Precompiled + Replace, Metaspace only)
  corpus.json      [{"text": ..., "<tokenizer>": [ids...]}, ...], truncated at 512, no padding
"""
import gzip
import json
import os
import random
import shutil
import sys

import sentencepiece as spm
from transformers import AutoTokenizer
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import CLIPTokenizer, T5Tokenizer
from transformers.convert_slow_tokenizer import SentencePieceExtractor

sys.path.insert(0, os.path.dirname(__file__))
from corpus import caption_corpus, test_corpus, word_corpus  # noqa: E402

OUT = os.path.join("tests", "data", "tok")
MAXLEN = 512  # every tokenizer is compared truncated at 512 (CLIP too: more than its 77)
CLIP_PATTERN = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def train_clip_tiny(captions):
    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>", end_of_word_suffix="</w>", continuing_subword_prefix=""))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CLIP_PATTERN), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<|startoftext|>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), end_of_word_suffix="</w>",
                                  show_progress=False)
    tok.train_from_iterator(captions, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return vocab, merges


def save_clip(path, vocab, merges):
    fresh(path)
    with open(os.path.join(path, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(path, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = CLIPTokenizer(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], model_max_length=77)
    tok.save_pretrained(path)
    return CLIPTokenizer.from_pretrained(path)


def real_clip_vocab():
    import open_clip
    gz = os.path.join(os.path.dirname(open_clip.__file__), "bpe_simple_vocab_16e6.txt.gz")
    lines = gzip.open(gz).read().decode("utf-8").split("\n")
    merges = lines[1:49152 - 256 - 2 + 1]
    base = bytes_to_unicode()
    vocab_list = base + [v + "</w>" for v in base] + ["".join(m.split()) for m in merges]
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(vocab_list)}, merges


def train_t5_tiny(captions, path):
    fresh(path)
    with open(os.path.join(path, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(captions))
    spm.SentencePieceTrainer.train(
        input=os.path.join(path, "corpus.txt"), model_prefix=os.path.join(path, "spiece"), vocab_size=700,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0,
        hard_vocab_limit=False, num_threads=1, minloglevel=2)
    os.remove(os.path.join(path, "corpus.txt"))
    os.remove(os.path.join(path, "spiece.vocab"))
    # as transformers converts a SentencePiece model: pieces, scores, charsmap
    kwargs = SentencePieceExtractor(os.path.join(path, "spiece.model")).extract(None)
    kwargs.pop("additional_special_tokens", None)
    tok = T5Tokenizer(**kwargs, extra_ids=0, model_max_length=512)
    tok.save_pretrained(path)
    return T5Tokenizer.from_pretrained(path)


def legacy_t5(src, path):
    """The pipeline of published T5 tokenizer.json files (e.g. FLUX's tokenizer_2)."""
    fresh(path)
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), path)
    tj = json.load(open(os.path.join(path, "tokenizer.json"), encoding="utf-8"))
    charsmap = tj["normalizer"]["precompiled_charsmap"]
    tj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Precompiled", "precompiled_charsmap": charsmap},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
    tj["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    json.dump(tj, open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    return Tokenizer.from_file(os.path.join(path, "tokenizer.json"))


def main():
    captions = caption_corpus(3000, seed=1) + word_corpus(2000, seed=3)
    corpus = test_corpus(seed=2)
    os.makedirs(OUT, exist_ok=True)

    vocab, merges = train_clip_tiny(captions)
    clip_tiny = save_clip(os.path.join(OUT, "clip_tiny"), vocab, merges)
    rvocab, rmerges = real_clip_vocab()
    clip_real = save_clip(os.path.join(OUT, "clip_real"), rvocab, rmerges)
    for p in ("clip_real",):  # the real vocabulary: keep only vocab.json + merges.txt (size)
        for name in os.listdir(os.path.join(OUT, p)):
            if name not in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
                os.remove(os.path.join(OUT, p, name))
    t5_tiny = train_t5_tiny(captions, os.path.join(OUT, "t5_tiny"))
    legacy_t5(os.path.join(OUT, "t5_tiny"), os.path.join(OUT, "t5_tiny_legacy"))
    t5_legacy_tf = AutoTokenizer.from_pretrained(os.path.join(OUT, "t5_tiny_legacy"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(OUT, "t5_tiny", "spiece.model"))

    rows, sp_diff = [], 0
    for text in corpus:
        t5_ids = t5_tiny(text, add_special_tokens=True, max_length=MAXLEN, truncation=True)["input_ids"]
        if (sp.encode(text) + [1])[:MAXLEN] != t5_ids[:MAXLEN] and len(t5_ids) < MAXLEN:
            sp_diff += 1
        rows.append({
            "text": text,
            "clip_tiny": clip_tiny(text, max_length=MAXLEN, truncation=True)["input_ids"],
            "clip_real": clip_real(text, max_length=MAXLEN, truncation=True)["input_ids"],
            "t5_tiny": t5_ids,
            # the older file as transformers 5 reads it: it rebuilds T5's pipeline from the
            # model (charsmap, WhitespaceSplit + Metaspace) instead of the file's own
            "t5_tiny_legacy": t5_legacy_tf(text, add_special_tokens=True, max_length=MAXLEN, truncation=True)["input_ids"],
        })
    with open(os.path.join(OUT, "corpus.json"), "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows) + "\n]\n")
    print(f"{len(rows)} strings; sentencepiece itself differs from the transformers T5 tokenizer on {sp_diff}")


if __name__ == "__main__":
    main()
