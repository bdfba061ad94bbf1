"""Incremental detokenization for streaming.

A token is a run of bytes, not of characters: an emoji or a CJK character is often split
over two or three tokens, and decoding each token alone would print U+FFFD. The
detokenizer feeds token bytes to an incremental UTF-8 decoder, which emits every complete
character at once and holds back only the bytes of one incomplete character.
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferpath.tokenizer.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Token ids in, text deltas out.

    Invariants: the concatenation of every ``add`` result and the final ``flush`` equals
    ``tokenizer.decode(all_ids, skip_special_tokens=...)``; at most 3 bytes (one incomplete
    UTF-8 character) are held back between calls; a character split across tokens is never
    emitted as U+FFFD (only bytes that can never become valid UTF-8 are).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.num_tokens = 0

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes (may be empty)."""
        self.num_tokens += 1
        if self.skip_special_tokens and token_id in self.tokenizer.special_token_ids:
            return ""
        return self._decoder.decode(self.tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: emit what is held back (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)

    @property
    def num_pending_bytes(self) -> int:
        """Bytes of an incomplete character held back."""
        return len(self._decoder.getstate()[0])
