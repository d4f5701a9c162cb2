#!/usr/bin/env python3
"""Writes the tokenizer test corpus: a deterministic (seeded) list of nasty strings.

Regenerate (the output is committed, so CI never needs llama.cpp):
    .venv/bin/python python/make_tokenizer_corpus.py > tests/data/tokenizer/corpus.json

The corpus is a JSON array of strings. Every string is valid Unicode without surrogates, so it has one exact UTF-8
encoding; invalid UTF-8 is tested separately in the C++ tests. Categories: English prose, code in several languages,
whitespace runs, tabs and newlines, numbers of many lengths, punctuation runs, accented Latin (composed and
decomposed), Cyrillic, Greek, CJK, Arabic, Hebrew, Indic and Thai, emoji with ZWJ sequences, skin-tone modifiers,
flags and keycaps, zero-width and non-breaking spaces (and every other Unicode space), special-token strings,
contractions, control characters, long repeats, and random mixtures of all of these.
"""
import json
import random
import sys

SEED = 20240607

WORDS = (
    "the of and to in is was for that on as with by it at from his an were are which this be or had not but first "
    "one their its new after who they have has her she two been other when there all during into school time may "
    "years more most only over city some world would where later up such used many can state about national out "
    "known university united then made system between however also these through before being under game while "
    "because government people music team series life region both film early season end well several team water "
    "quickly jumped lazy fox brown dog tokenizer merge vocabulary inference matrix multiplication kernel throughput "
    "latency memory bandwidth quantization transformer attention embedding Hello World OpenAI LLaMA SmolLM GPT "
    "don't can't it's we're they've I'm you'll she'd O'Brien rock'n'roll"
).split()

CODE = [
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
    '    for _ in range(n):\n        a, b = b, a + b\n    return a\n',
    "#include <stdio.h>\n\nint main(int argc, char** argv) {\n\tprintf(\"%d args\\n\", argc);\n\treturn 0;\n}\n",
    "template <typename T>\nstd::vector<T> take(const std::vector<T>& v, size_t n) {\n  return {v.begin(), "
    "v.begin() + std::min(n, v.size())};\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(2, 3)}`);\nlet xs = [1, 2, 3].map(x => x ** 2);\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).filter(|x| x % 2 == 0).collect();\n    println!(\"{:?}\", v);\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tch := make(chan int, 3)\n\tch <- 42\n\tfmt.Println(<-ch)\n}\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id\nWHERE o.total >= 100.50 "
    "GROUP BY u.id HAVING n > 3 ORDER BY n DESC;\n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n  <body class='main'>\n    <p>Hello &amp; welcome&nbsp;!</p>\n  </body>\n</html>\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> out.log 2>&1\ndone\n",
    '{"name": "tessera", "version": "0.1.0", "deps": [1, 2.5, -3e-7, true, null], "nested": {"k": "v\\u00e9"}}',
    "public class Main {\n    public static void main(String[] args) {\n        System.out.println(\"Hi\");\n    }\n}\n",
    "x <- c(1, 2, 3)\nmean(x) # R code\ndf[df$col >= 2 & !is.na(df$col), ]\n",
    "(defun square (x)\n  (* x x))\n;; lisp comment\n",
    "\\begin{equation}\n  E = mc^2 \\quad \\forall x \\in \\mathbb{R}\n\\end{equation}\n",
    "  if (x != nullptr && *x == '\\0') { x++; } // trailing   \n\t\t}\r\n",
    "diff --git a/f.py b/f.py\n@@ -1,3 +1,4 @@\n-old = 1\n+new = 2\n+    indented\n",
    "matrix[i][j] += a[i][k] * b[k][j];  /* O(n^3) */",
    "assert x==1,'msg';y=[i for i in range(10)if i%2]#c",
    "| col1 | col2 |\n|------|------|\n| 1    | 2    |\n",
    "    \n    \n\n        return;\n    }\n",
]

ACCENTED = "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœšžßÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝŒŠŽĳŁłŃńŐőŰűĆćČčĐđ"
LATIN_WORDS = ["café", "naïve", "façade", "Ångström", "Straße", "niño", "crème brûlée", "jalapeño", "Øresund",
               "Dvořák", "Kraków", "Łódź", "smörgåsbord", "résumé", "coöperate", "Ærøskøbing", "İstanbul", "ﬁnance"]
CYRILLIC = ["Привет, мир!", "Съешь же ещё этих мягких французских булок, да выпей чаю.", "Ёжик в тумане",
            "Україна — це Європа", "Здравствуйте 123 товарищи"]
GREEK = ["Γειά σου Κόσμε", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία", "ἐν ἀρχῇ ἦν ὁ λόγος", "αβγδεζηθικλμνξοπρστυφχψω ΣΊΣΥΦΟΣ"]
CJK = ["你好，世界！", "我能吞下玻璃而不伤身体。", "日本語のテキスト、カタカナとひらがな。", "東京都渋谷区１２３",
       "한국어 문장입니다. 안녕하세요!", "漢字かなカナ混じり文", "中文，标点：“引号”（括号）《书名》",
       "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３", "𠀀𠀁𪚥 𝕏 rare ideographs"]
ARABIC = ["مرحبا بالعالم", "السلام عليكم ورحمة الله", "العربية ١٢٣٤٥٦٧٨٩٠", "كِتَابٌ مُشَكَّلٌ"]
HEBREW = ["שלום עולם", "עִבְרִית עם ניקוד", "English mixed with עברית inside"]
INDIC = ["नमस्ते दुनिया", "हिन्दी १२३ अंक", "தமிழ் மொழி", "বাংলা ভাষা", "ภาษาไทยไม่มีช่องว่าง", "ქართული ენა",
         "Հայերեն լեզու", "ኢትዮጵያ"]
EMOJI = ["😀", "😂", "🙂", "👍", "👍🏻", "👍🏿", "👋🏽", "❤️", "❤", "✨", "🔥", "🎉", "🚀", "👨‍👩‍👧‍👦", "👩🏽‍💻",
         "🏳️‍🌈", "🏴‍☠️", "🧑🏾‍🤝‍🧑🏻", "🇫🇷", "🇯🇵", "🇺🇸🇬🇧", "1️⃣", "#️⃣", "☺︎", "🫠", "🫶🏼", "🧔‍♀️", "🤷‍♂️",
         "👁️‍🗨️", "🐈‍⬛", "😶‍🌫️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
SPACES = ["\u00a0", "\u202f", "\u2007", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006",
          "\u2008", "\u2009", "\u200a", "\u3000", "\u1680", "\u180e", "\u0085", "\u2028", "\u2029", "\u205f",
          "\u000b", "\u000c", "\r", "\t", "\n", " "]
ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u2060", "\u00ad", "\u034f", "\u061c", "\u200e", "\u200f"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "–", "“", "”", "‘", "’", "«", "»", "¿", "¡",
                                                    "§", "¶", "•", "·", "€", "£", "¥", "©", "®", "™", "°", "±",
                                                    "×", "÷", "→", "⇒", "∀", "∑", "√", "∞", "≠", "≤", "™"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>", "<filename>",
            "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>",
            "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>",
            # other families' specials: plain text for this vocabulary
            "<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<|begin_of_text|>", "<|eot_id|>", "<start_of_turn>",
            "<end_of_turn>", "<|user|>", "<|assistant|>", "<|end|>"]
OTHER = ["\x00", "\x01", "\x07", "\x1b[31mred\x1b[0m", "\x7f", "\u0301", "\u0300\u0301\u0302", "e\u0301",
         "\ue000\uf8ff", "\U000f0000", "\U0010fffd", "\u0378", "\U000e0001", "\U0001d400\U0001d401\U0001d7d8",
         "\U0001f3fb", "\ufe0f", "\u2122", "Ⅻ ⅻ ½ ¾ ² ³ ⁴ ₅ ①②③", "\uFFFD", "\uFFFC", "ÿ", "\u0100\u0101",
         "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ꙭ", "ʼn", "ǅ", "ᾈ"]
CONTRACTIONS = ["it's", "IT'S", "It'S", "we're", "WE'RE", "you've", "I'm", "I'M", "they'll", "THEY'LL", "he'd",
                "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "''s", "x's's", "it’s", "don’t", "' s", "'S", "'D",
                "rock'n'roll", "'''", "'1", "'é"]


def sentence(rng):
    n = rng.randint(3, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    words[0] = words[0][:1].upper() + words[0][1:]
    s = " ".join(words)
    return s + rng.choice([".", "!", "?", ",", ";", ":", "...", ""])


def number(rng):
    kind = rng.randrange(9)
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    if kind == 0:
        return digits
    if kind == 1:
        return "-" + digits + "." + str(rng.randint(0, 99999))
    if kind == 2:
        return f"{rng.randint(0, 10**9):,}"
    if kind == 3:
        return f"{rng.random() * 10 ** rng.randint(-20, 20):e}"
    if kind == 4:
        return "0x" + "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randint(1, 16)))
    if kind == 5:
        return f"{rng.randint(1, 12)}/{rng.randint(1, 28)}/{rng.randint(1900, 2100)}"
    if kind == 6:
        return " ".join(str(rng.randint(0, 10 ** rng.randint(1, 8))) for _ in range(rng.randint(2, 6)))
    if kind == 7:
        return f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(1, 9)}"
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 5))) + rng.choice(
        ["px", "ms", "%", "kg", "th", "st", "nd", "GB/s", "e10", "°C"])


def whitespace_run(rng):
    pool = [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\n\n", "    ", "\u00a0", "\u3000", "\u2009", "\u000b",
            "\u000c", "\u0085", "\u2028"]
    return "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))


def atom(rng):
    """One small random piece from any category."""
    k = rng.randrange(16)
    if k == 0:
        return rng.choice(WORDS)
    if k == 1:
        return number(rng)
    if k == 2:
        return whitespace_run(rng)
    if k == 3:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 6)))
    if k == 4:
        return rng.choice(LATIN_WORDS)
    if k == 5:
        return "".join(rng.choice(ACCENTED) for _ in range(rng.randint(1, 6)))
    if k == 6:
        return rng.choice(CYRILLIC + GREEK)
    if k == 7:
        return rng.choice(CJK)
    if k == 8:
        return rng.choice(ARABIC + HEBREW + INDIC)
    if k == 9:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if k == 10:
        return rng.choice(SPACES)
    if k == 11:
        return rng.choice(ZERO_WIDTH)
    if k == 12:
        return rng.choice(SPECIALS)
    if k == 13:
        return rng.choice(OTHER)
    if k == 14:
        return rng.choice(CONTRACTIONS)
    return " "


def corpus():
    rng = random.Random(SEED)
    out = []

    # Fixed edge cases first.
    out += ["", " ", "  ", "\n", "\t", "\r\n", "a", "A", "1", "!", "'", "'s", " '", "\n\n\n", " \n ", "\t\t\n  x"]
    out += CODE
    out += LATIN_WORDS + CYRILLIC + GREEK + CJK + ARABIC + HEBREW + INDIC
    out += EMOJI + [" " + e for e in EMOJI] + ["a" + e + "b" for e in EMOJI[:12]]
    out += ["x" + s + "y" for s in SPACES] + [" " + s + " " for s in SPACES] + [s * 3 + "z" for s in SPACES]
    out += ["a" + z + "b" for z in ZERO_WIDTH] + [z + " word" for z in ZERO_WIDTH] + ["".join(ZERO_WIDTH)]
    out += OTHER + CONTRACTIONS + [" " + c for c in CONTRACTIONS]
    out += SPECIALS
    out += [f"{s}hello{s}" for s in SPECIALS[:17]]
    out += [" " + s + " " for s in SPECIALS[:17]]
    out += ["<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
            "<|im_start|><|im_end|><|im_start|>", "<|im_start", "im_start|>", "<|im_end|", "<<|im_end|>>",
            "<|<|im_start|>|>", "<|endoftext|><|endoftext|>", "text<|endoftext|>", "<|endoftext|>\n\n",
            "<reponame><repo_name>", "<|IM_START|>", "< |im_start| >", "<|im_start|>" * 5]
    out += [str(10 ** k) for k in range(0, 41, 3)] + ["9" * k for k in range(1, 25)]
    out += ["".join(str(i % 10) for i in range(n)) for n in (7, 13, 64, 100)]
    out += ["3.14159", "-0.0", "1e-10", "1,234,567.89", "٣٤٥", "१२३", "١٢٣abc", "Ⅻ", "²³", "⑩", "𝟘𝟙𝟚", "a1b2c3",
            "12ab34", " 12", "  12", "x 1 2 3", "1\n2\n3"]
    out += ["!" * n for n in (1, 2, 3, 7, 16)] + ["...", "?!?!", "----------", "==========", "**bold**", "__init__",
                                                   "<<<>>>", "#!#!", "~/.bashrc", "C:\\Users\\x", "a@b.com",
                                                   "https://example.com/path?q=1&r=%20#frag", "«»„“", "¿Qué?", "¡Sí!"]

    # Long repeats.
    out += ["a" * 1000, "ab" * 500, " " * 300, "\n" * 100, "\t" * 64, "1" * 200, "🙂" * 100, "é" * 200,
            "the " * 250, "ha" * 300 + "!", "。" * 50, "_" * 120, "=-" * 100, "中" * 150, "\u200b" * 40,
            "\u00a0" * 50, "word " * 100 + "\n" * 10, "x" * 255 + " " + "y" * 256, "<|im_end|>" * 20]

    # Prose.
    for _ in range(200):
        out.append(" ".join(sentence(rng) for _ in range(rng.randint(1, 5))))
    # Prose with newlines, indentation and tabs.
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(2, 6)):
            parts.append(sentence(rng))
            parts.append(whitespace_run(rng))
        out.append("".join(parts))
    # Numbers of many lengths.
    for _ in range(80):
        out.append(number(rng))
    for _ in range(40):
        out.append(sentence(rng) + " " + number(rng) + " " + sentence(rng))
    # Whitespace runs in the middle and at the ends.
    for _ in range(60):
        out.append(whitespace_run(rng) + rng.choice(WORDS) + whitespace_run(rng) + rng.choice(WORDS) +
                   rng.choice(["", whitespace_run(rng)]))
    # Punctuation runs.
    for _ in range(40):
        out.append("".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 20))))
    # Code snippets mutated.
    for _ in range(30):
        c = rng.choice(CODE)
        i = rng.randrange(len(c))
        out.append(c[i:] + c[:i])
    # Scripts mixed with prose.
    for _ in range(60):
        out.append(sentence(rng) + " " + atom(rng) + " " + rng.choice(CJK + CYRILLIC + ARABIC + HEBREW + INDIC))
    # Emoji sequences.
    for _ in range(40):
        out.append("".join(rng.choice(EMOJI) + rng.choice(["", " ", "", "!", "a"]) for _ in range(rng.randint(1, 8))))
    # Random mixtures of everything, short and long.
    for _ in range(260):
        out.append("".join(atom(rng) for _ in range(rng.randint(1, 12))))
    for _ in range(30):
        out.append("".join(atom(rng) for _ in range(rng.randint(30, 80))))
    # Random code points from assigned-looking ranges (one at a time and in runs).
    ranges = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
              (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x23ff), (0x3000, 0x30ff), (0x4e00, 0x9fff),
              (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1f300, 0x1f6ff), (0x1f900, 0x1f9ff)]
    for _ in range(60):
        lo, hi = rng.choice(ranges)
        out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 16))))
    return out


def main():
    items = corpus()
    for s in items:
        assert not any(0xD800 <= ord(c) <= 0xDFFF for c in s)
    json.dump(items, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")
    print(f"make_tokenizer_corpus: {len(items)} strings", file=sys.stderr)


if __name__ == "__main__":
    main()
