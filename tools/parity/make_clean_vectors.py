"""Prompt-cleaning vectors: Python's html.unescape and diffusers' WanPipeline
prompt_clean (html.unescape twice, str.strip, `regex` \\s+ runs to one space,
str.strip; its code path without ftfy) on strings that exercise every rule.

Run from the repository root with the tools virtualenv (make tools-venv):
    tools/venv/bin/python tools/parity/make_clean_vectors.py
Writes tests/data/tok/clean.json: [{"in", "unescape", "wan"}, ...].
"""
import html
import json
import os
import random

import diffusers.pipelines.wan.pipeline_wan as pipeline_wan

OUT = os.path.join("tests", "data", "tok", "clean.json")
pipeline_wan.is_ftfy_available = lambda: False  # the path without ftfy (README: ftfy is not reproduced)
wan_clean = pipeline_wan.prompt_clean


FIXED = [
    "", " ", "plain prompt", "  lead and trail  ", "a\tb\nc\rd\x0be\x0cf", "x\x1cy\x1dz\x1e\x1fw",
    "nbsp\u00a0here", "ideo\u3000space", "en\u2002em\u2003thin\u2009", "line\u2028para\u2029", "nel\x85x",
    "zw\u200bnot space", "mongol\u180esep",
    "&amp;", "&amp", "&AMP;", "&amp;amp;", "&amp;amp;amp;", "&lt;b&gt;", "&quot;q&quot;", "&apos;", "&nbsp;x",
    "&notit;", "&notin;", "&noti", "&copy2026", "&ampx", "&am", "&a", "&", "&&", "& amp;", "&;", "&#;",
    "&#39;", "&#x27;", "&#X27", "&#0;", "&#x0;", "&#128;", "&#x80;", "&#x9F;", "&#13;", "&#1;", "&#11;",
    "&#x7F;", "&#xD800;", "&#xDFFF;", "&#x10FFFF;", "&#x110000;", "&#99999999999999999999;", "&#xFFFE;",
    "&#x1FFFF;", "&#xFDD0;", "&#x;", "&#x", "&#", "&#65&#66;", "&#x41g", "&#0065;",
    "&CounterClockwiseContourIntegral;", "&CounterClockwiseContourIntegral", "&ThisIsAVeryLongNameThatExceedsThirtyTwoCharacters;",
    "&eacute;t&eacute;", "caf&eacute", "&ncedil;", "&NotNestedGreaterGreater;", "&fjlig;", "&bne;",
    "&amp;lt;b&amp;gt;", "&amp;#39;", "&#38;amp;", "a&amp;&amp;b", "&lt&gt", "&ltx", "&LT", "&Lt;",
    "&é;", "&ampé", "&amp\u00e9;", "5 &lt; 6 &amp;&amp; 7 &gt; 3",
    "A cat &amp; a dog  baking\ta cake &mdash; cosy kitchen&hellip;",
    "\u201ccurly\u201d \u2018quotes\u2019", "emoji 🐱‍👤 & more", "mixed 日本語 &amp; العربية",
]


def main():
    rnd = random.Random(7)
    pieces = ["&amp;", "&lt;", "&", "#", "&#", "&#x", "39", "x27", ";", " ", "  ", "\t", "\n", "\u00a0", "\u3000",
              "a", "é", "amp", "lt", "nbsp", "copy", "&nbsp", "&copy", "&#128", "Z", "日"]
    cases = list(FIXED)
    for _ in range(300):
        cases.append("".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 12))))
    out = [{"in": s, "unescape": html.unescape(s), "wan": wan_clean(s)} for s in cases]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{len(out)} cases")


if __name__ == "__main__":
    main()
