"""Prompt-cleaning vectors: Python's html.unescape and diffusers' WanPipeline
prompt_clean (ftfy.fix_text when ftfy is installed, html.unescape twice,
str.strip, `regex` \\s+ runs to one space, str.strip) on strings that exercise
every rule, with and without ftfy.

Run from the repository root with the tools virtualenv (make tools-venv; it has
ftfy 6.3.1):
    tools/venv/bin/python tools/parity/make_clean_vectors.py
Writes tests/data/tok/clean.json: [{"in", "unescape", "wan", "ftfy", "wan_ftfy"[,
"mojibake"]}, ...]: "wan" without ftfy, "ftfy" ftfy.fix_text alone, "wan_ftfy"
the pipeline with it; "mojibake": true where ftfy's mojibake repair (fix_encoding,
which difflet does not reproduce) changes either, found by running them again with
it switched off.
"""
import html
import json
import os
import random
import types

import diffusers.pipelines.wan.pipeline_wan as pipeline_wan
import ftfy

OUT = os.path.join("tests", "data", "tok", "clean.json")
assert ftfy.__version__ == "6.3.1" and pipeline_wan.is_ftfy_available()


def run_pipeline(text, ftfy_module, available=True):
    """diffusers' own prompt_clean with a chosen ftfy (or none)"""
    saved = pipeline_wan.is_ftfy_available, getattr(pipeline_wan, "ftfy", None)
    pipeline_wan.is_ftfy_available = lambda: available
    pipeline_wan.ftfy = ftfy_module
    try:
        return pipeline_wan.prompt_clean(text)
    finally:
        pipeline_wan.is_ftfy_available, pipeline_wan.ftfy = saved


NO_MOJIBAKE_FTFY = types.SimpleNamespace(fix_text=lambda t: ftfy.fix_text(t, fix_encoding=False))
WAN_NEGATIVE = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，"
                "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，"
                "手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")


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
    # ftfy: quotes of every kind it uncurls, and the ones it leaves
    "\u2018a\u2019 \u201ab\u201b \u201cc\u201d \u201ed\u201f \u02bce \u2039f\u203a \u00abg\u00bb \u300ch\u300d \u2032\u2033",
    "It\u2019s a \u201cbig\u201d day", "\u201e\u201c German \u201c\u201d",
    # ligatures and digraphs
    "\ufb00 \ufb01 \ufb02 \ufb03 \ufb04 \ufb05 \ufb06", "\u0132\u0133 \u0149 \u01c4\u01c5\u01c6 \u01c7\u01c8\u01c9 \u01ca\u01cb\u01cc \u01f1\u01f2\u01f3",
    "\ufb02u\ufb03e\ufb06 \ufb01sh", "\u00e6 \u0153 \ufb13\ufb14 \ufb4f",
    # full width and half width
    "\uff2c\uff2f\uff35\uff24\u3000\uff2e\uff2f\uff29\uff33\uff25\uff33", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19",
    "\uff01\uff02\uff03\uff04\uff05\uff06\uff07\uff08\uff09\uff0a\uff0b\uff0c\uff0d\uff0e\uff0f\uff1a\uff1b\uff1c\uff1d\uff1e\uff1f\uff20",
    "\uff3b\uff3c\uff3d\uff3e\uff3f\uff40\uff5b\uff5c\uff5d\uff5e\uff5f\uff60\uff61\uff62\uff63\uff64\uff65",
    "\uffe0\uffe1\uffe2\uffe3\uffe4\uffe5\uffe6\uffe8\uffe9\uffea\uffeb\uffec\uffed\uffee",
    "\uffa0\uffa1\uffa4\uffb1\uffc2\uffd2\uffdc", "\uff41\uff42\uff43 \uff3a",
    WAN_NEGATIVE, "一只猫在厨房里烤蛋糕。镜头：特写；光线：温暖！", "你好，世界。（测试）【标签】「引用」",
    "ｶﾀｶﾅ ﾃｽﾄ ｶﾞｷﾞｸﾞ ﾊﾟﾋﾟﾌﾟ ｳﾞ", "Ｕﾀｰﾝ", "日本語の文章、半角ｶﾅ。ﾞﾟ", "ｧｨｩｪｫｬｭｮｯ ｰ ･ ｡｢｣､",
    # control characters, C1 controls, terminal escapes
    "a\x01b\x02c\x07d\x08e\x0bf\x0eg\x1bh\x7fi", "bom\ufeffin", "\ufeffstart", "arabic\u206a\u206fctl",
    "ann\ufff9o\ufffat\ufffbe\ufffc", "zero\u200bwidth\u200c\u200d\u200e\u200f\u202a\u202e",
    "c1 \x80 \x81 \x82 \x83 \x84 \x85 \x86 \x8d \x8f \x90 \x91 \x92 \x93 \x94 \x9d \x9f",
    "price \x80 5", "\x93quoted\x94", "dots\x85", "\x1b[31mred\x1b[0m", "\x1b[1;32;40mbold\x1b[m plain",
    "\x1b[31", "\x1b[31;m", "\x1b[xy", "\x1b[\u0663\u0664m arabic digits", "\x1b[\uff13m fullwidth",
    "\x1b\x1b[2Jclear", "esc\x1b alone", "\x1b[;;;H",
    # line breaks
    "a\r\nb", "a\rb", "a\r\r\nb", "a\n\rb", "line\u2028sep\u2029para", "x\r", "\r\n\r\n",
    "two\nlines &amp; <b>\nthird &amp;", "first &amp;amp;\n<tag> &amp;amp;\nlast &amp;amp;amp;",
    # normalization
    "cafe\u0301 nai\u0308ve", "\u1100\u1161\u11a8", "A\u030a \u212b \u2126", "e\u0327\u0301",
    "\u0958 \u2adc \uf900", "\u0301 leading mark", "q\u0307\u0323",
    # ftfy's own entity rules, and '<' switching them off
    "&EACUTE; &NTILDE; &nTILDE; &SZLIG; &Eacute;", "P&EACUTE;REZ", "&checkmark; &Jscr;", "&amp;lt;b&amp;gt;",
    "a < b &amp; c", "&lt;tag&gt; &amp;amp;", "&amp;amp;amp;amp;amp;", "&#x2019;s &#8220;q&#8221;", "&#59;",
    "&#65x;", "&#xZZ;", "&#1;", "&#x110000;", "&#0;", "&#x85;", "&#x1b;[31m", "&#27;[31mx",
    "&amp;#x2019;", "&fflig; &filig;", "&#xFF0C;", "&ThisIsAVeryLongNameThatExceeds;", "&abcdefghijklmnopqrstuvwx;",
    "&#000000000000000000000065;", "&#0000000000000000000000065;", "&#x00000000000000000000041;", "&#x000000000000000000000041;",
    "Broken text&hellip; it&#x2019;s \ufb02ubberi\ufb01c!", "&macr;\\_(\u30c4)_/&macr;", "less &lt; more",
    # mojibake ftfy repairs (skipped by the C test, which checks they are flagged)
    "s\u00c3\u00b3", "\u00e2\u0153\u201d No problems", "caf\u00c3\u00a9 cr\u00c3\u00a8me", "\u00c3\u00a0 la mode",
    "\u00e2\u20ac\u0153quoted\u00e2\u20ac\u009d", "&macr;\\_(\u00e3\x83\x84)_/&macr;",
    # accented text ftfy leaves alone
    "café crème brûlée", "naïve façade", "Ærøskøbing", "Ελληνικά", "Русский текст", "½ × ¾ ° ±",
]


def main():
    rnd = random.Random(7)
    pieces = ["&amp;", "&lt;", "&", "#", "&#", "&#x", "39", "x27", ";", " ", "  ", "\t", "\n", "\u00a0", "\u3000",
              "a", "é", "amp", "lt", "nbsp", "copy", "&nbsp", "&copy", "&#128", "Z", "日"]
    ftfy_pieces = pieces + [
        "<", "&EACUTE;", "&#x2019;", "&hellip;", "\u2018", "\u2019", "\u201c", "\u201d", "\u201a", "\u201e", "\u02bc",
        "\ufb01", "\ufb03", "\u0133", "\u01c6", "\uff21", "\uff4d", "\uff10", "\uff0c", "\uff0e", "\uff1a", "\uff01",
        "\uff08", "\uff09", "\uff5e", "\uffe5", "\uff76", "\uff9e", "\uff9f", "\uff8a", "\uff67", "，", "。", "：",
        "\x01", "\x1b", "\x1b[", "31", "m", "\x1b[0m", "\x7f", "\ufeff", "\x85", "\x80", "\x93", "\x81",
        "\r", "\r\n", "\u2028", "\u2029", "\u0301", "\u0308", "e", "\u1100", "\u1161", "\u0663",
        "猫", "カ", "ｶ", "é", "ß", "Ω", "🐱",
    ]
    cases = list(FIXED)
    for _ in range(300):
        cases.append("".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 12))))
    for _ in range(300):
        cases.append("".join(rnd.choice(ftfy_pieces) for _ in range(rnd.randint(1, 16))))
    out = []
    for s in cases:
        row = {"in": s, "unescape": html.unescape(s), "wan": run_pipeline(s, None, available=False),
               "ftfy": ftfy.fix_text(s), "wan_ftfy": run_pipeline(s, ftfy)}
        if run_pipeline(s, NO_MOJIBAKE_FTFY) != row["wan_ftfy"] or NO_MOJIBAKE_FTFY.fix_text(s) != row["ftfy"]:
            row["mojibake"] = True
        out.append(row)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{len(out)} cases, {sum(1 for r in out if r.get('mojibake'))} changed by ftfy's mojibake repair, "
          f"{sum(1 for r in out if r['wan'] != r['wan_ftfy'])} where ftfy changes the result")


if __name__ == "__main__":
    main()
