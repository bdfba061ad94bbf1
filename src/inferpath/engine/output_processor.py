"""Output processor: from sampled tokens to what callers read, outside the core loop.

The scheduler decides which tokens exist and when a request ends; this stage turns
each new token into text (incremental, UTF-8 safe), finds stop strings in that text,
keeps the logprobs, and hands out deltas (vLLM v1's boundary between EngineCore and its
OutputProcessor). A stop string found here is reported back to the scheduler, which
ends the request (it owns every end).

Invariants of a ``SampleText``:
- ``text`` never contains a stop string (unless ``include_stop_str_in_output``);
  text that could be the start of one is held back from streaming until settled;
- ``token_ids`` and ``logprobs`` only grow (outputs hand out prefixes of them);
- ``take_delta`` hands out each character, token and logprob exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inferpath.engine.request import Request
from inferpath.engine.scheduler import SampleUpdate
from inferpath.sampling.stop import find_stop_string, num_chars_to_hold_back


class SampleText:
    """One sample's text, stop-string state, token ids and logprobs as seen by callers.

    ``detokenizer`` has ``add(token_id) -> str`` and ``flush() -> str`` (or is None:
    token ids only, no text and no stop strings).
    """

    def __init__(self, request: Request, detokenizer: Any = None):
        self.request = request
        self.params = request.params
        self.detokenizer = detokenizer
        self.text = ""
        self.token_ids: list[int] = []  # append-only (outputs hand out prefixes)
        self.logprobs: list | None = [] if request.params.logprobs is not None else None
        self._num_sent_chars = 0
        self._num_sent_tokens = 0
        self._flushed = False

    def add(self, token_id: int | None, logprobs: Any, is_last: bool = True) -> str | None:
        """Take the step's token (None: the request ended without one). Returns the stop
        string found in the new text, or None. ``is_last`` is False for all but the last
        of several tokens one step gave (a speculative run): a finished request's
        detokenizer is flushed after its last token only."""
        delta = ""
        if token_id is not None:
            self.token_ids.append(token_id)
            if self.logprobs is not None:
                self.logprobs.append(logprobs)
            if self.detokenizer is not None:
                delta = self.detokenizer.add(token_id)
        if (is_last and self.request.status.is_finished and self.detokenizer is not None
                and not self._flushed):
            delta += self.detokenizer.flush()
            self._flushed = True
        return self._add_text(delta)

    def _add_text(self, delta: str) -> str | None:
        self.text += delta
        params = self.params
        if not params.stop or len(self.token_ids) < params.min_tokens:
            return None
        found = find_stop_string(self.text, params.stop, len(delta),
                                 params.include_stop_str_in_output)
        if found is None:
            return None
        cut, stop_str = found
        self.text = self.text[:cut]
        return stop_str

    @property
    def streamed_text(self) -> str:
        """The text handed out by ``take_delta`` so far (held-back characters excluded)."""
        return self.text[:self._num_sent_chars]

    def take_delta(self) -> tuple[str, list[int], list | None]:
        """Text, token ids and logprobs produced since the last call.

        While running, text that could be the start of a stop string is held back.
        """
        end = len(self.text)
        if not self.request.status.is_finished and self.params.stop:
            end -= num_chars_to_hold_back(self.text, self.params.stop)
        end = max(end, self._num_sent_chars)
        text = self.text[self._num_sent_chars:end]
        token_ids = self.token_ids[self._num_sent_tokens:]
        logprobs = self.logprobs[self._num_sent_tokens:] if self.logprobs is not None else None
        self._num_sent_chars = end
        self._num_sent_tokens = len(self.token_ids)
        return text, token_ids, logprobs


class OutputProcessor:
    """Keeps a ``SampleText`` per sample in flight (by seq_id) and feeds it updates."""

    def __init__(self) -> None:
        self._samples: dict[tuple, SampleText] = {}

    def add(self, sample: SampleText) -> None:
        self._samples[sample.request.seq_id] = sample

    def remove(self, samples: Iterable[SampleText]) -> None:
        for sample in samples:
            self._samples.pop(sample.request.seq_id, None)

    def process(self, updates: Iterable[SampleUpdate]) -> list[tuple[Request, str]]:
        """Detokenize the step's tokens; returns the (request, stop string) pairs to end."""
        stopped = []
        ended: set = set()  # a stop string ends a request: its later tokens this step are dropped
        for update in updates:
            seq_id = update.request.seq_id
            sample = self._samples.get(seq_id)
            if sample is None or seq_id in ended:
                continue
            stop_str = sample.add(update.token_id, update.logprobs, update.is_last)
            if stop_str is not None:
                stopped.append((update.request, stop_str))
                ended.add(seq_id)
        return stopped
