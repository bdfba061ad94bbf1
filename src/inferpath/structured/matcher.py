"""GrammarMatcher (one sequence's parse state) and the batched bitmask -> logits step.

A bitmask row is ``ceil(vocab / 32)`` int32 words; bit ``i % 32`` of word ``i // 32`` is 1
when token ``i`` is allowed next. ``apply_bitmasks`` expands the constrained rows' words to
booleans and sets the disallowed logits to -inf, leaving free rows untouched.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from inferpath.structured.json_bounds import (
    LOOP_TAIL,
    MAX_SIGNIFICANT_DIGITS,
    JsonLexer,
    is_loop,
    numbers_in,
)


#: the longest closing path ``steer`` looks for (a deeply nested answer's closing path)
MAX_STEERING_PATH = 4096


class ClosingHints:
    """What the greedy closing search prefers, per tokenizer: the ids of the tokens that end
    JSON strings, values and containers soonest (ranked), and every token's length.

    NOTE: the search is a heuristic, not a shortest path: at each state it takes the
    best-ranked allowed token, else the longest allowed one (a forced key or literal is
    spelled out fastest that way). Inside free text (a string: plain letters are allowed)
    only tokens that start with a quote close anything; elsewhere brackets come first.
    """

    IN_TEXT = (b'"}', b'"]}', b'"}]', b'"]', b'","', b'":"', b'",', b'":', b'"')
    STRUCTURAL = (b"]}", b"}]", b"}}", b"]]", b"}", b"]", b'","', b'":"', b'":[', b'":', b'",', b',"',
                  b'""', b'"', b"0", b"[]", b"{}", b",", b":", b"[", b"{", b"null")
    #: tokens that only free text allows (no JSON key or literal starts with both)
    TEXT_PROBES = (b"Q", b"x")

    def __init__(self, tokens: Sequence[bytes], special_ids: Sequence[int]) -> None:
        by_bytes: dict[bytes, int] = {}
        for i, token in enumerate(tokens):
            by_bytes.setdefault(token, i)
        self.in_text = [by_bytes[c] for c in self.IN_TEXT if c in by_bytes]
        self.structural = [by_bytes[c] for c in self.STRUCTURAL if c in by_bytes]
        self.text_probes = [by_bytes[c] for c in self.TEXT_PROBES if c in by_bytes]
        self.tokens = tokens  # every token's bytes (the JSON bounds follow the output)
        self.dot = by_bytes.get(b".")
        self.lengths = np.array([len(t) for t in tokens], dtype=np.int64)  # (vocab,)
        self.lengths[list(special_ids)] = 0  # never chosen by the fallback; EOS is apart


class GrammarMatcher:
    """Where one sequence stands in its grammar.

    Invariant: the tokens passed to ``accept`` are exactly the sequence's output tokens, in
    order (the request calls it from ``append_output``; a preempted request keeps its
    matcher, since it keeps its output tokens). With ``json_bounds`` (a JSON grammar) the
    output is followed by a ``JsonLexer`` too, and ``steer`` keeps it bounded
    (json_bounds.py).
    """

    def __init__(self, ll_matcher: Any, vocab_size: int, hints: ClosingHints | None = None,
                 json_bounds: bool = False) -> None:
        self._matcher = ll_matcher
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.hints = hints
        self._lexer = JsonLexer() if json_bounds and hints is not None else None
        self._tail: deque[int] = deque(maxlen=LOOP_TAIL)  # the newest output tokens

    def steer(self, token_id: int, eos_token_ids: Sequence[int]) -> int:
        """``token_id``, or the first token of the closing path where taking it would make a
        number longer than its type holds or continue a loop inside a value (the rules:
        json_bounds.py). Only JSON grammars are steered."""
        if self._lexer is None:
            return token_id
        data = self.hints.tokens[token_id] if token_id < len(self.hints.tokens) else b""
        too_long = any(number.too_long(self._is_integer_field(number, token_id))
                       for number in numbers_in(self._lexer, data))
        # NOTE: digits repeating inside a number are the number bounds' to judge
        looping = (self._lexer.depth > 0 and self._lexer.number is None
                   and is_loop([*self._tail, token_id]) or self._lexer.repeats_an_item(data))
        if not (too_long or looping):
            return token_id
        # only the first token is taken: the path may be long (the budget is max_tokens')
        return self._first_closing_token(token_id, MAX_STEERING_PATH, eos_token_ids)

    def _is_integer_field(self, number: Any, token_id: int) -> bool:
        """True when the grammar allows no fraction where ``number`` stands (asked only of
        a number past MAX_SIGNIFICANT_DIGITS digits without fraction or exponent)."""
        if number.has_fraction or number.has_exponent or number.num_digits <= MAX_SIGNIFICANT_DIGITS:
            return False
        if self.hints.dot is None:
            return True
        after = self._matcher.deep_copy()
        if not after.consume_token(token_id):
            return False
        return after.validate_tokens([self.hints.dot]) != 1

    def within_budget(self, token_id: int, remaining: int, eos_token_ids: Sequence[int]) -> int:
        """``token_id``, or the token to take instead so that the output can still be
        completed within ``remaining`` tokens (this one included): the first token of the
        greedy closing path, or an EOS id where the grammar is complete. ``token_id`` is
        kept when no closing path is found (nothing better is known)."""
        if self.hints is None:
            return token_id
        after = self._matcher.deep_copy()
        if after.consume_token(token_id):
            if after.is_stopped():
                return token_id
            needed = self._closing_length(after, remaining - 1)
            if needed is not None:
                return token_id
        return self._first_closing_token(token_id, remaining, eos_token_ids)

    def _first_closing_token(self, token_id: int, remaining: int,
                             eos_token_ids: Sequence[int]) -> int:
        """The first token of the greedy closing path (at most ``remaining`` tokens), an EOS
        id where the grammar is complete, or ``token_id`` when no path is found."""
        path = self._closing_path(self._matcher.deep_copy(), remaining)
        if path is None:
            return token_id
        if path:
            return path[0]
        mask = self._mask(self._matcher)
        allowed_eos = [t for t in eos_token_ids if t < self.vocab_size and mask[t]]
        return allowed_eos[0] if allowed_eos else token_id

    def _closing_length(self, matcher: Any, limit: int) -> int | None:
        path = self._closing_path(matcher, limit)
        return None if path is None else len(path)

    def _closing_path(self, matcher: Any, limit: int) -> list[int] | None:
        """Greedy tokens taking ``matcher`` (consumed) to a complete output, at most
        ``limit`` of them; None if none is found within it.

        NOTE: cheap on purpose (it runs for each constrained row at each of its last
        CLOSING_HORIZON steps): forced tokens come from llguidance's fast-forward, ranked
        candidates are checked one by one (``validate_tokens``), and a full mask is only
        computed where neither applies.
        """
        hints = self.hints
        path: list[int] = []
        while not matcher.is_accepting():
            if len(path) >= limit:
                return None
            forced = matcher.compute_ff_tokens()
            if forced:
                forced = forced[:limit - len(path)]
                if not matcher.consume_tokens(forced):
                    return None
                path.extend(forced)
                continue
            in_text = all(matcher.validate_tokens([t]) == 1 for t in hints.text_probes)
            ranked = hints.in_text if in_text else hints.structural
            choice = next((t for t in ranked if matcher.validate_tokens([t]) == 1), None)
            if choice is None:
                mask = self._mask(matcher)
                lengths = np.where(mask[:len(hints.lengths)], hints.lengths, 0)
                choice = int(lengths.argmax())
                if lengths[choice] == 0:
                    return None
            if not matcher.consume_token(choice):
                return None
            path.append(choice)
        return path

    def _mask(self, matcher: Any) -> np.ndarray:
        """(vocab_size,) bool: the tokens ``matcher`` allows next."""
        words = torch.empty(self.num_words, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), self.num_words * 4)
        return unpack_bitmasks(words.view(1, -1), self.vocab_size)[0]

    def fill_bitmask(self, bitmask_row: torch.Tensor) -> None:
        """Write the allowed-next-token bits into ``bitmask_row``: (num_words,) int32, CPU,
        contiguous."""
        self._matcher.unsafe_compute_mask_ptr(bitmask_row.data_ptr(), self.num_words * 4)

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False if the grammar did not allow it."""
        accepted = self._matcher.consume_token(token_id)
        if accepted and self._lexer is not None:
            self._lexer.feed(self.hints.tokens[token_id] if token_id < len(self.hints.tokens) else b"")
            self._tail.append(token_id)
        return accepted

    # ------------------------------------------------------------------ drafted positions
    def fork(self) -> GrammarMatcher:
        """An independent matcher at the same place (llguidance's ``deep_copy``, ~2 us, with
        the JSON lexer's state and the loop tail); this one is left as it is."""
        twin = copy.copy(self)
        twin._matcher = self._matcher.deep_copy()
        twin._lexer = copy.deepcopy(self._lexer)
        twin._tail = deque(self._tail, maxlen=LOOP_TAIL)
        return twin

    def valid_prefix(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids``, from the first, the grammar allows in turn: up to the
        first it refuses, or through the one that completes it (after which only EOS is
        allowed: nothing is drafted past it). This matcher is not advanced."""
        probe = self._matcher.deep_copy()
        for n, token_id in enumerate(token_ids):
            if probe.is_stopped() or not probe.consume_token(token_id):
                return n
        return len(token_ids)

    def along(self, token_ids: Sequence[int]) -> list[GrammarMatcher]:
        """[self, after token_ids[:1], ..., after all of them]: the matcher of each row of a
        speculative chunk (row j sees drafts[:j] as output). ``token_ids`` must be a
        ``valid_prefix``; ValueError naming the token otherwise. Only forks advance: this
        matcher moves through the tokens the verifier accepts, as ``accept`` is given them."""
        matchers = [self]
        for token_id in token_ids:
            twin = matchers[-1].fork()
            if not twin.accept(token_id):
                raise ValueError(f"drafted token {token_id} is not allowed by the grammar here; "
                                 "drafts must be cut to GrammarMatcher.valid_prefix first")
            matchers.append(twin)
        return matchers

    @property
    def is_terminated(self) -> bool:
        """True once the grammar is complete and has consumed the EOS token."""
        return self._matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None


def fill_bitmasks(matchers: Sequence[GrammarMatcher]) -> torch.Tensor:
    """(len(matchers), num_words) int32 bitmasks, one row per matcher."""
    bitmask = torch.empty(len(matchers), matchers[0].num_words, dtype=torch.int32)
    for i, matcher in enumerate(matchers):
        matcher.fill_bitmask(bitmask[i])
    return bitmask


def unpack_bitmasks(bitmask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """(k, num_words) int32 bitmasks -> (k, vocab_size) numpy bool, True where allowed.

    NOTE: numpy's unpackbits over the words' little-endian bytes (bit order little) yields
    token 32 w + 8 b + i for bit i of byte b of word w: the bitmask's own layout. It is one
    pass over the bits; torch's shift-and-mask formulation costs ~40x more on CPU.
    """
    raw = bitmask.numpy().view(np.uint8)  # (k, 4 num_words), little-endian words
    bits = np.unpackbits(raw, axis=1, count=vocab_size, bitorder="little")  # (k, vocab) 0/1
    return bits.view(np.bool_)


def apply_bitmasks(logits: torch.Tensor, row_ids: Sequence[int], bitmask: torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` (num_rows, vocab) whose rows ``row_ids`` keep only the tokens
    their ``bitmask`` rows (len(row_ids), num_words) allow; other logits become -inf.

    NOTE: on CPU this is numpy, single-threaded: a few hundred kB of work, where torch's
    intra-op threads cost more in synchronisation than the work itself on a busy machine.
    """
    allowed = unpack_bitmasks(bitmask, logits.shape[1])  # (k, vocab)
    rows = list(row_ids)
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        values = logits.numpy()
        neg_inf = np.float32(-np.inf)
        if rows == list(range(logits.shape[0])):  # every row constrained
            return torch.from_numpy(np.where(allowed, values, neg_inf))
        masked = values.copy()
        masked[rows] = np.where(allowed, values[rows], neg_inf)
        return torch.from_numpy(masked)
    allowed_t = torch.from_numpy(allowed).to(logits.device)
    neg_inf_t = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    index = torch.tensor(rows, device=logits.device)
    masked_rows = torch.where(allowed_t, logits.index_select(0, index), neg_inf_t)  # (k, vocab)
    return logits.index_copy(0, index, masked_rows)
