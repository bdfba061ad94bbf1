"""Pre-tokenization: cut text into pieces that BPE then encodes one at a time.

A byte-level BPE never merges across a pre-token boundary, so the split patterns are as much
part of a tokenizer as its merge list. A pre-tokenizer here is an ordered list of regexes,
applied the way Hugging Face ``Split(behavior="Isolated")`` and llama.cpp's
``regex_exprs`` apply them: each pattern re-splits every piece the previous one produced, and
text between two matches is kept as a piece of its own. Nothing is ever dropped, so
``"".join(pre_tokenizer.split(text)) == text`` always holds.
"""

from __future__ import annotations

import regex

# GPT-2's pattern; also what Hugging Face ``ByteLevel(use_regex=True)`` applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Llama-3 (tiktoken's cl100k shape): case-insensitive contractions, numbers in runs of <= 3.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2: Llama-3's pattern with digits one by one.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Each digit alone (Hugging Face ``Digits(individual_digits=True)``).
DIGITS_PATTERN = r"\p{N}"

# Named pre-tokenizers: GGUF ``tokenizer.ggml.pre`` values plus our own short names.
PRETOKENIZER_PATTERNS: dict[str, tuple[str, ...]] = {
    "gpt2": (GPT2_PATTERN,),
    "gpt-2": (GPT2_PATTERN,),
    "llama3": (LLAMA3_PATTERN,),
    "llama-bpe": (LLAMA3_PATTERN,),
    "qwen2": (QWEN2_PATTERN,),
    # SmolLM2 (and StarCoder, Refact): digits one by one, then GPT-2's pattern.
    "smollm": (DIGITS_PATTERN, GPT2_PATTERN),
    "starcoder": (DIGITS_PATTERN, GPT2_PATTERN),
    "refact": (DIGITS_PATTERN, GPT2_PATTERN),
}


def patterns_for(name: str) -> tuple[str, ...]:
    """The regexes of a named pre-tokenizer; ValueError naming the supported names otherwise."""
    try:
        return PRETOKENIZER_PATTERNS[name]
    except KeyError:
        supported = ", ".join(sorted(PRETOKENIZER_PATTERNS))
        raise ValueError(f"unsupported pre-tokenizer {name!r}; supported: {supported}") from None


def _compile_isolated(pattern: str) -> regex.Pattern:
    """Compile ``pattern`` so that ``findall`` also returns the text between matches.

    The second alternative consumes a run of characters at which ``pattern`` cannot match,
    which is exactly the gap Hugging Face's Isolated split keeps. For the usual patterns
    (they end in ``\\s+`` and cover every character class) it never fires.
    """
    try:
        return regex.compile(f"(?:{pattern})|(?:(?!(?:{pattern}))[\\s\\S])+")
    except regex.error as exc:
        raise ValueError(f"pre-tokenizer regex {pattern!r} does not compile: {exc}") from None


class PreTokenizer:
    """An ordered list of split regexes, compiled once.

    Invariant: ``"".join(self.split(text)) == text`` (after the optional prefix space), and
    no piece is empty.
    """

    def __init__(self, patterns: tuple[str, ...] | list[str], add_prefix_space: bool = False):
        self.patterns = tuple(patterns)
        self.add_prefix_space = add_prefix_space
        self._compiled = [_compile_isolated(p) for p in self.patterns]

    def split(self, text: str) -> list[str]:
        if self.add_prefix_space and text and not text.startswith(" "):
            text = " " + text
        if not self._compiled:
            return [text] if text else []
        first, *rest = self._compiled
        pieces = first.findall(text)
        for compiled in rest:
            findall = compiled.findall
            pieces = [sub for piece in pieces for sub in findall(piece)]
        return pieces
