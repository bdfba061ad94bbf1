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
GPT2_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)

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

# NOTE: digits-then-GPT-2 as one regex, for speed (one pass instead of two). It equals the
# two-pass split (tested): digits are alternatives of their own, and a whitespace run now
# ends before a digit exactly as it ended at the end of a digit-free segment.
DIGITS_THEN_GPT2_PATTERN = r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
_FUSED = {(DIGITS_PATTERN, GPT2_PATTERN): DIGITS_THEN_GPT2_PATTERN}
# Patterns that match at every position (they end in \s+ and cover letters, numbers, other
# characters and whitespace), so plain findall keeps every character.
_TOTAL = {GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN, DIGITS_THEN_GPT2_PATTERN}

# Named pre-tokenizers: GGUF ``tokenizer.ggml.pre`` values plus our own short names.
PRETOKENIZER_PATTERNS: dict[str, tuple[str, ...]] = {
    "gpt2": (GPT2_PATTERN,),
    "gpt-2": (GPT2_PATTERN,),
    "llama3": (LLAMA3_PATTERN,),
    "llama-bpe": (LLAMA3_PATTERN,),
    # Smaug-Llama-3: Llama-3's tokenizer, as llama.cpp's converter names it by its hash
    # (llama.cpp runs it with Llama-3's regex, merges not skipped for whole-vocab words)
    "smaug-bpe": (LLAMA3_PATTERN,),
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
        raise ValueError(
            f"unsupported pre-tokenizer {name!r}; supported: {supported}"
        ) from None


def _splitter(pattern: str):
    """A function text -> pieces that splits like Hugging Face's Isolated split: matches and the
    gaps between them, in order, none empty (except where ``pattern`` matches "")."""
    try:
        if pattern in _TOTAL:
            # concurrent: matching releases the GIL, so encode_batch's threads overlap here
            findall = regex.compile(pattern).findall
            return lambda text: findall(text, concurrent=True)
        captured = regex.compile(f"({pattern})")
        if captured.groups == 1:  # split() returns gap, match, gap, ...
            split = captured.split
            return lambda text: list(filter(None, split(text)))
        # NOTE: the pattern has groups of its own; the second alternative consumes a gap
        gaps = regex.compile(f"(?:{pattern})|(?:(?!(?:{pattern}))[\\s\\S])+")
        return lambda text: [m.group() for m in gaps.finditer(text)]
    except regex.error as exc:
        raise ValueError(
            f"pre-tokenizer regex {pattern!r} does not compile: {exc}"
        ) from None


class PreTokenizer:
    """An ordered list of split regexes, compiled once.

    Invariant: ``"".join(self.split(text)) == text`` (after the optional prefix space).
    """

    def __init__(
        self,
        patterns: tuple[str, ...] | list[str],
        add_prefix_space: bool = False,
        fuse: bool = True,
    ):
        self.patterns = tuple(patterns)
        self.add_prefix_space = add_prefix_space
        fused = _FUSED.get(self.patterns) if fuse else None
        self._splitters = [_splitter(p) for p in ((fused,) if fused else self.patterns)]

    def split(self, text: str) -> list[str]:
        if self.add_prefix_space and text and not text.startswith(" "):
            text = " " + text
        if not self._splitters:
            return [text] if text else []
        first, *rest = self._splitters
        pieces = first(text)
        for splitter in rest:
            pieces = [sub for piece in pieces for sub in splitter(piece)]
        return pieces
