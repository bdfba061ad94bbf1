"""Assemble corpus.txt, the multilingual text the tokenizer tests compare ids on.

Run once by hand (``python tests/data/tokenizer/make_corpus.py``); the result is committed,
so the tests do not depend on what this machine has installed. Sources:

- English prose: the Python documentation's topic help (``pydoc_data.topics``, PSF licence);
- Python code: modules of the Python standard library (PSF licence);
- CJK, Arabic, Hebrew, Cyrillic, Greek, Georgian, Vietnamese...: translated MIME type names
  from shared-mime-info's ``freedesktop.org.xml`` (/usr/share/mime/packages);
- Japanese and Chinese paragraphs: GnuPG's help texts (/usr/share/gnupg/help.*.txt);
- emoji (with ZWJ sequences, skin tones, flags), whitespace runs, long digit strings and
  mixed-case contractions: generated below with a fixed seed.
"""

import heapq
import inspect
import json.decoder
import pydoc_data.topics
import random
import re
import textwrap
from pathlib import Path

OUT = Path(__file__).with_name("corpus.txt")
rng = random.Random(20261129)
parts: list[str] = []

# English prose (~90 KB)
prose = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
parts.append("".join(prose)[:90_000])

# Python code (~45 KB)
for module in (heapq, textwrap, json.decoder):
    parts.append(inspect.getsource(module)[:16_000])

# Translated MIME names: every 3rd entry per language (~70 KB)
xml = Path("/usr/share/mime/packages/freedesktop.org.xml").read_text(encoding="utf-8")
by_lang: dict[str, list[str]] = {}
for lang, text in re.findall(r'<comment xml:lang="([^"]+)">([^<]+)</comment>', xml):
    by_lang.setdefault(lang, []).append(text)
langs = ["zh_CN", "zh_TW", "ja", "ko", "ar", "he", "ru", "uk", "el", "ka", "vi", "tr", "kk", "de", "fr"]
for lang in langs:
    parts.append("\n".join(by_lang[lang][::3]) + "\n")

# GnuPG help paragraphs in Japanese and Chinese (~25 KB)
for lang in ("ja", "zh_CN", "zh_TW", "ru", "el"):
    parts.append(Path(f"/usr/share/gnupg/help.{lang}.txt").read_text(encoding="utf-8")[:6_000])

# Emoji: single, skin tones, ZWJ families, flags, keycaps
emoji = [chr(c) for c in list(range(0x1F600, 0x1F650)) + list(range(0x1F300, 0x1F5FF, 3)) + list(range(0x1F900, 0x1F9FF, 2))]
tones = [chr(c) for c in range(0x1F3FB, 0x1F400)]
zwj = ["👨\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "👩🏽\u200d💻", "🧑\u200d🚀", "❤\ufe0f\u200d🔥"]
flags = ["🇺🇸", "🇯🇵", "🇫🇷", "🇧🇷", "🇪🇬", "🇨🇳"]
lines = []
for _ in range(400):
    words = [rng.choice(emoji) + (rng.choice(tones) if rng.random() < 0.2 else "") for _ in range(rng.randint(1, 6))]
    words += rng.sample(zwj + flags + ["1\ufe0f\u20e3", "#\ufe0f\u20e3"], 2)
    rng.shuffle(words)
    lines.append(rng.choice(["Great job ", "Ok", "", "wow!! ", "見て "]) + " ".join(words))
parts.append("\n".join(lines) + "\n")

# Runs of spaces, tabs, newlines, CRLF
ws = []
for _ in range(600):
    ws.append(rng.choice(["x", "def f():", "  return 1", "word", "", "}", "数"]))
    ws.append("".join(rng.choice([" ", "\t", "\n", "\r\n", "  ", "\u3000", "\xa0"]) for _ in range(rng.randint(1, 12))))
parts.append("".join(ws) + "\n")

# Long digit strings and numbers
nums = []
for _ in range(300):
    n = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    nums.append(rng.choice([n, f"${n[:6]}.{n[6:8]}", f"+1 ({n[:3]}) {n[3:6]}-{n[6:10]}", f"{n}th", f"v{n[:2]}.{n[2:4]}", f"x={n}e-{len(n)}", f"٣٤٥{n[:3]}", f"１２３{n[:2]}"]))
parts.append(" ".join(nums) + "\n")

# Contractions in mixed case
subjects = ["I", "you", "We", "THEY", "She", "it", "John", "DON", "Y"]
contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "’s", "'Ll"]
sent = []
for _ in range(500):
    s = rng.choice(subjects) + rng.choice(contractions)
    sent.append(rng.choice([s, s.upper(), s.lower(), "DON'T", "can't", "Won'T", "y'all", "'tis", "rock 'n' roll"]))
parts.append(" ".join(sent) + ".\n")

OUT.write_text("\n".join(parts), encoding="utf-8")
print(OUT, OUT.stat().st_size, "bytes")
