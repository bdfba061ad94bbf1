"""The Tokenizer: pre-tokenizer + byte-level BPE + added tokens + chat template.

Built by the loaders in ``load.py`` (GGUF, tokenizer.json, tiktoken ranks) or by
``train.py``; inferpath code only ever sees this class.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import regex

from inferpath.tokenizer.bpe import BytePairEncoder, piece_to_bytes
from inferpath.tokenizer.pretokenize import PreTokenizer
from inferpath.tokenizer.spm import SentencePieceEncoder


@dataclass(frozen=True)
class AddedToken:
    """A token matched in the raw text before pre-tokenization.

    ``special`` tokens (control tokens: ``<|im_end|>``) are recognised only when the caller
    allows it; the others (GGUF "user defined" tokens, Hugging Face added tokens with
    ``special: false``) are always recognised, as both references do.
    """

    content: str
    id: int
    special: bool


def _alternation(tokens: list[AddedToken]) -> regex.Pattern | None:
    """One regex matching any of ``tokens``, longest first so a token beats its prefixes."""
    if not tokens:
        return None
    contents = sorted({t.content for t in tokens}, key=lambda c: (-len(c), c))
    return regex.compile("|".join(regex.escape(c) for c in contents))


class Tokenizer:
    """Text <-> token ids for one model.

    Invariants: ids are in ``range(vocab_size)``; ``token_bytes(i)`` is the exact bytes id ``i``
    stands for (added tokens: their UTF-8 content), so ``decode`` is a byte concatenation
    followed by one UTF-8 decode; ``decode(encode(x)) == x`` for every string ``x`` when the
    vocabulary holds all 256 bytes and the file has no normalizer (byte-level BPE loses nothing).
    """

    def __init__(
        self,
        *,
        pieces: list[str],
        encoder: BytePairEncoder | SentencePieceEncoder,
        pre_tokenizer: PreTokenizer,
        added_tokens: list[AddedToken],
        bos_token_id: int | None,
        eos_token_id: int | None,
        eos_token_ids: frozenset[int],
        add_bos_token: bool,
        chat_template: str | None = None,
        pad_token_id: int | None = None,
        add_eos_token: bool = False,
        normalizer: str | None = None,
        name: str = "",
        token_bytes: list[bytes] | None = None,
    ):
        self.vocab_size = len(pieces)
        self._pieces = pieces
        self.encoder = encoder
        self.pre_tokenizer = pre_tokenizer
        self.added_tokens = list(added_tokens)
        self.bos_token_id = bos_token_id
        self.eos_token_id = (
            eos_token_id  # the primary EOS (what templates call eos_token)
        )
        self.eos_token_ids = frozenset(eos_token_ids)
        self.add_bos_token = add_bos_token
        # NOTE: recorded from the file, never applied: a prompt to continue must not end in EOS
        self.add_eos_token = add_eos_token
        self.pad_token_id = pad_token_id
        self.chat_template = chat_template
        self.normalizer = normalizer
        self.name = name
        for token in self.added_tokens:
            if not 0 <= token.id < self.vocab_size:
                raise ValueError(
                    f"added token {token.content!r} has id {token.id}, outside the vocabulary "
                    f"of {self.vocab_size} ids"
                )
        self.special_token_ids = frozenset(t.id for t in self.added_tokens if t.special)
        self.added_token_ids = frozenset(t.id for t in self.added_tokens)
        self._added_by_content = {t.content: t.id for t in self.added_tokens}
        # byte-level pieces unless the loader says what each id decodes to (SentencePiece)
        self._bytes = token_bytes if token_bytes is not None else [
            p.encode("utf-8") if i in self.added_token_ids else piece_to_bytes(p)
            for i, p in enumerate(pieces)
        ]
        if len(self._bytes) != len(pieces):
            raise ValueError(f"token_bytes has {len(self._bytes)} entries for {len(pieces)} pieces")
        self._always_re = _alternation([t for t in self.added_tokens if not t.special])
        self._all_added_re = _alternation(self.added_tokens)
        self._chat = None  # built on first use (jinja2 import is not free)

    # ---- ids <-> pieces ------------------------------------------------------------------
    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary string of ``token_id`` (byte-level form, e.g. ``"Ġis"``)."""
        self._check_id(token_id)
        return self._pieces[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes ``token_id`` decodes to."""
        self._check_id(token_id)
        return self._bytes[token_id]

    def piece_to_id(self, piece: str) -> int | None:
        """The id of a vocabulary string or added token content, or None."""
        token_id = self._added_by_content.get(piece)
        return token_id if token_id is not None else self.encoder.vocab.get(piece)

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})"
            )

    # ---- encode / decode -----------------------------------------------------------------
    def encode(
        self, text: str, *, allow_special: bool = False, add_bos: bool | None = None
    ) -> list[int]:
        """Token ids of ``text``.

        ``allow_special``: recognise control tokens written in the text (``"<|im_end|>"``);
        otherwise they are encoded as the plain text they are. ``add_bos``: None = the
        tokenizer's own setting.
        """
        ids = self._bos_prefix(add_bos)
        ids += self._encode_segments(
            text, self._all_added_re if allow_special else self._always_re
        )
        return ids

    def encode_batch(self, texts: list[str], *, allow_special: bool = False,
                     add_bos: bool | None = None, num_threads: int = 1) -> list[list[int]]:
        """``[encode(text) for text in texts]``, on up to ``num_threads`` threads.

        The texts are cut into ``num_threads`` contiguous slices, one per thread, sharing
        the piece cache. Threads overlap where the work leaves the GIL: the pre-tokenizer's
        regex matching and the native merge loop (native.py); the rest is Python.
        """
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")

        def encode_all(part: list[str]) -> list[list[int]]:
            return [self.encode(text, allow_special=allow_special, add_bos=add_bos) for text in part]

        num_threads = min(num_threads, len(texts))
        if num_threads <= 1:
            return encode_all(list(texts))
        from concurrent.futures import ThreadPoolExecutor

        size = -(-len(texts) // num_threads)
        parts = [texts[i:i + size] for i in range(0, len(texts), size)]
        with ThreadPoolExecutor(num_threads, thread_name_prefix="inferpath-tokenize") as pool:
            return [ids for part in pool.map(encode_all, parts) for ids in part]

    def encode_protected(
        self, text: str, protected: list[tuple[int, int]]
    ) -> list[int]:
        """Encode with special tokens recognised, except where they overlap a protected span.

        ``protected`` is a sorted list of ``(start, end)`` character spans of ``text`` (message
        content on the chat path): added tokens written there stay plain text, and the text
        around them is still encoded as one piece, as if no special tokens existed there.
        """
        return self._encode_segments(text, self._all_added_re, protected)

    def encode_ordinary(self, text: str) -> list[int]:
        """BPE only: no added tokens are recognised, no BOS."""
        if self.normalizer is not None:
            text = unicodedata.normalize(self.normalizer, text)
        return self.encoder.encode_pieces(self.pre_tokenizer.split(text))

    def _bos_prefix(self, add_bos: bool | None) -> list[int]:
        if add_bos is None:
            add_bos = self.add_bos_token
        if not add_bos:
            return []
        if self.bos_token_id is None:
            raise ValueError("add_bos=True, but this tokenizer has no BOS token")
        return [self.bos_token_id]

    def _encode_segments(
        self,
        text: str,
        added_re: regex.Pattern | None,
        protected: list[tuple[int, int]] = (),
    ) -> list[int]:
        if added_re is None:
            return self.encode_ordinary(text)
        ids: list[int] = []
        start = 0
        for match in added_re.finditer(text):
            if any(s < match.end() and match.start() < e for s, e in protected):
                continue
            ids += self.encode_ordinary(text[start : match.start()])
            ids.append(self._added_by_content[match.group()])
            start = match.end()
        ids += self.encode_ordinary(text[start:])
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a character cut off) becomes U+FFFD."""
        skip = self.special_token_ids if skip_special_tokens else ()
        try:
            if ids and min(ids) < 0:  # NOTE: a negative index would silently wrap around
                raise IndexError
            data = b"".join(self._bytes[i] for i in ids if i not in skip)
        except (IndexError, TypeError):
            bad = next(
                i for i in ids if not isinstance(i, int) or not 0 <= i < self.vocab_size
            )
            raise ValueError(
                f"token id {bad!r} is outside the vocabulary (0..{self.vocab_size - 1})"
            ) from None
        return data.decode("utf-8", errors="replace")

    def detokenizer(self, skip_special_tokens: bool = True):
        """A fresh incremental detokenizer (for streaming) over this tokenizer."""
        from inferpath.tokenizer.stream import IncrementalDetokenizer

        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # ---- chat ------------------------------------------------------------------------------
    def _chat_renderer(self):
        if self._chat is None:
            from inferpath.tokenizer.chat import ChatRenderer

            if self.chat_template is None:
                raise ValueError(
                    f"tokenizer {self.name or '(unnamed)'} has no chat template; load one with a "
                    "GGUF tokenizer.chat_template, tokenizer_config.json or chat_template.jinja"
                )
            self._chat = ChatRenderer(self.chat_template, self._template_tokens())
        return self._chat

    def _template_tokens(self) -> dict[str, str]:
        tokens = {}
        if self.bos_token_id is not None:
            tokens["bos_token"] = self.decode([self.bos_token_id])
        if self.eos_token_id is not None:
            tokens["eos_token"] = self.decode([self.eos_token_id])
        return tokens

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True,
        tools: list[dict] | None = None, *, template_kwargs: dict | None = None,
    ) -> str:
        """The prompt text the model's chat template renders for ``messages`` (and the
        OpenAI-shaped ``tools``, given to the template as its ``tools`` variable);
        ``template_kwargs`` are more variables it reads (Qwen3's ``enable_thinking``)."""
        return self._chat_renderer().render(messages, add_generation_prompt, tools,
                                            template_kwargs=template_kwargs)

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True,
        tools: list[dict] | None = None, *, template_kwargs: dict | None = None,
    ) -> list[int]:
        """Ids of the rendered chat: the template's control tokens become special ids; text that
        came from the messages never does (a user writing ``<|im_end|>`` gets plain text)."""
        renderer = self._chat_renderer()
        text, protected = renderer.render_with_spans(
            messages, add_generation_prompt, self._all_added_re, tools, template_kwargs=template_kwargs
        )
        return self.encode_protected(text, protected)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"
