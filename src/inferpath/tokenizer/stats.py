"""Fertility: how many tokens a text costs, per word, per character and per byte.

Non-English text often costs two or three times more tokens for the same content; these
ratios are how that shows up.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferpath.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class Fertility:
    num_tokens: int
    num_words: int  # whitespace-separated
    num_chars: int
    num_bytes: int  # UTF-8

    @property
    def tokens_per_word(self) -> float:
        return self.num_tokens / max(self.num_words, 1)

    @property
    def tokens_per_char(self) -> float:
        return self.num_tokens / max(self.num_chars, 1)

    @property
    def tokens_per_byte(self) -> float:
        return self.num_tokens / max(self.num_bytes, 1)


def fertility(tokenizer: Tokenizer, text: str) -> Fertility:
    """Token counts of ``text`` (plain text: no BOS, special-token strings stay text)."""
    return Fertility(
        num_tokens=len(tokenizer.encode(text, add_bos=False)),
        num_words=len(text.split()),
        num_chars=len(text),
        num_bytes=len(text.encode("utf-8")),
    )
