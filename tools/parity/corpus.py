"""Deterministic text corpora for the tokenizer tools.

caption_corpus: captions in the style of difflet-tiny's scenes (training text for
the tiny tokenizers). test_corpus: >= 1,000 varied strings that exercise every path
of the tokenizers: punctuation, digits, contractions, emoji and ZWJ sequences,
accented and combining characters, full-width forms, CJK, odd whitespace, control
characters, literal special tokens, and prompts longer than 77 and 512 tokens.
"""
import random

COLOURS = ["red", "green", "blue", "yellow", "white", "black", "orange", "purple", "pink", "cyan", "gray", "brown"]
SHAPES = ["circle", "square", "triangle", "star", "ring", "cross"]
POSITIONS = ["in the centre", "in the top left", "in the top right", "in the bottom left", "in the bottom right",
             "at the center", "top-left", "bottom-right"]
SIZES = ["small", "large", "big", "tiny"]
TEMPLATES = [
    "a {c} {s} on a {b} background",
    "{z} {c} {s} {p}, {b} background",
    "A {z} {c} {s} {p} on {b}.",
    "{c} {s}, {z}, {p}; background: {b}",
    "there is a {c} {s} {p} of a {b} image",
    "{b} background with a {z} {c} {s} {p}",
    "photo of a {c} {s}",
    "a drawing of one {z} {s}, coloured {c}, placed {p}",
]


def caption(rng):
    return rng.choice(TEMPLATES).format(c=rng.choice(COLOURS), s=rng.choice(SHAPES), b=rng.choice(COLOURS),
                                        p=rng.choice(POSITIONS), z=rng.choice(SIZES))


def caption_corpus(n, seed):
    rng = random.Random(seed)
    return [caption(rng) for _ in range(n)]


WORDS = ("the quick brown fox jumps over lazy dog photograph cinematic lighting ultra detailed 8k render "
         "portrait of an astronaut riding horse mars sunset watercolor painting by famous artist trending "
         "artstation highly intricate bokeh depth field octane unreal engine masterpiece best quality").split()
PUNCT = list("!?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`") + ["...", "--", "!!", "?!", "''", "'s", "'t", "'re", "'ll", "'d", "'ve", "'m"]
SPECIAL = [
    "café", "naïve", "Zoë", "façade", "résumé", "Ångström", "São Paulo", "Düsseldorf", "Ærø", "œuvre", "ĳssel",
    "e\u0301", "a\u0308\u0301", "n\u0303o", "\u0130stanbul", "İ", "ΣΊΣΥΦΟΣ", "Σίσυφος", "ß", "ẞ", "ﬁne", "ﬀ",
    "ＦＵＬＬ　ｗｉｄｔｈ", "１２３", "ｱｲｳ", "東京の夜景", "北京", "한국어", "Привет мир", "مرحبا", "שלום", "हिन्दी",
    "🐱", "🎨🖌️", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "👍🏽", "❤️", "☃", "★☆", "½", "²", "Ⅻ", "①", "٣", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "\u2581", "▁hello", "<|endoftext|>", "<|startoftext|>", "</s>", "<unk>", "<pad>", "\x07bell", "tab\there",
    "new\nline", "cr\r\nlf", "\u00a0nbsp", "zero\u200bwidth", "\u3000ideographic", "\ufeffbom", "soft\u00adhyphen",
    "don't", "DON'T", "I'll", "they've", "we're", "she'd", "I'm", "it's", "Its'", "rock'n'roll",
    "3.14159", "1,000,000", "2024-11-30", "12:30pm", "v2.1.0", "$99.99", "50%", "#hashtag", "@user", "a+b=c",
    "https://example.com/a?b=c", "user@mail.org", "C++", "x86_64", "snake_case", "camelCase", "ALLCAPS",
]


def word_corpus(n, seed):
    """Generic prompt-like sentences, so the tiny tokenizers learn more than captions."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 15))) + rng.choice(["", ".", ",", "!"])
            for _ in range(n)]


def test_corpus(seed):
    rng = random.Random(seed)
    out = ["", " ", "   ", "\t\n", "a", "A", "hello world", "Hello, World!", "  leading", "trailing  ", "double  space",
           "a photo of a cat", "A red circle on a blue background"]
    out += SPECIAL
    while len(out) < 900:
        kind = rng.randrange(6)
        n = rng.randrange(1, 25)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.5:
                w = rng.choice(WORDS)
                parts.append(w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.2 else w)
            elif r < 0.65:
                parts.append(rng.choice(PUNCT))
            elif r < 0.8:
                parts.append(str(rng.randrange(0, 10 ** rng.randrange(1, 7))))
            elif r < 0.9:
                parts.append(rng.choice(SPECIAL))
            else:
                parts.append(caption(rng))
        seps = [" ", " ", " ", "", "  ", "\t", "\n", "\u3000"] if kind == 0 else [" ", " ", ""]
        s = ""
        for p in parts:
            s += p + rng.choice(seps)
        if kind == 1:
            s = s.strip()
        out.append(s)
    # long prompts: past 77 CLIP tokens and past 512 T5 tokens
    for i in range(100):
        n = 60 + 10 * i
        out.append(" ".join(caption(rng) if rng.random() < 0.3 else rng.choice(WORDS) for _ in range(n)))
    return out
