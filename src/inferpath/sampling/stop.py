"""Stopping rules (Stage 8), torch-free: EOS ids, stop token ids, max tokens, stop strings.

Token rules are checked on each new token (``check_stop``). Stop strings are checked on
the detokenized text, which grows by deltas that need not align with the stop string:
``find_stop_string`` searches only the tail where a new match can be, and
``num_chars_to_hold_back`` says how much of a streamed delta must wait because it could
be the start of a stop string completed by the next delta. ``StopStringStream`` combines
the two for a streaming caller.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from inferpath.sampling.params import SamplingParams

FinishReason = str  # "stop" | "length"


def check_stop(
    token_id: int,
    num_output_tokens: int,
    params: SamplingParams,
    eos_token_ids: Collection[int],
    *,
    num_prompt_tokens: int = 0,
    max_model_len: int | None = None,
) -> tuple[FinishReason, int | None] | None:
    """Whether the sequence ends with ``token_id``, its ``num_output_tokens``-th output.

    Returns (finish_reason, stop_reason) or None to continue:
    - fewer than ``params.min_tokens`` outputs: only the context limit stops it;
    - an EOS id (unless ``params.ignore_eos``): ("stop", None);
    - one of ``params.stop_token_ids``: ("stop", token_id);
    - ``params.max_tokens`` outputs, or prompt + outputs reaching ``max_model_len``:
      ("length", None); the context limit holds even before ``min_tokens``.
    The token that stopped the sequence stays in its token ids (vLLM does the same);
    whether its text is shown is the detokenizer's ``skip_special_tokens`` business.
    """
    if num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token_id in eos_token_ids:
            return ("stop", None)
        if token_id in params.stop_token_ids:
            return ("stop", token_id)
        if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
            return ("length", None)
    if max_model_len is not None and num_prompt_tokens + num_output_tokens >= max_model_len:
        return ("length", None)
    return None


def find_stop_string(
    text: str,
    stop_strings: Sequence[str],
    num_new_chars: int,
    include_stop_str_in_output: bool = False,
) -> tuple[int, str] | None:
    """Where to cut ``text`` because a stop string appeared in its last ``num_new_chars``.

    Only matches that end inside the new characters are looked for (older text was
    checked before), so the search covers the last ``num_new_chars + len(stop) - 1``
    characters. Among several matches the one that completes first wins (earliest end,
    then earliest start): it is the one a token-by-token stream would have hit first.
    Returns (cut_index, stop_str): the output is ``text[:cut_index]``, which excludes
    the stop string unless ``include_stop_str_in_output``. None when nothing matched.
    """
    if num_new_chars <= 0 or not stop_strings:
        return None
    best: tuple[int, int, str] | None = None  # (end, start, stop_str)
    first_new = len(text) - num_new_chars
    for stop_str in stop_strings:
        start = text.find(stop_str, max(0, first_new - len(stop_str) + 1))
        if start < 0:
            continue
        candidate = (start + len(stop_str), start, stop_str)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    if best is None:
        return None
    end, start, stop_str = best
    return (end if include_stop_str_in_output else start, stop_str)


def num_chars_to_hold_back(text: str, stop_strings: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could be the start of a stop string.

    The largest k < len(stop) such that ``text[-k:]`` is a prefix of some stop string;
    a streamer sends ``text[:-k]`` now and the rest once the next delta settles it.
    """
    longest = max((len(s) for s in stop_strings), default=0)
    for k in range(min(len(text), longest - 1), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stop_strings):
            return k
    return 0


class StopStringStream:
    """Streams text deltas with stop strings cut out, even across delta boundaries.

    Invariant: ``emitted`` (everything returned so far) is a prefix of the final
    output, and the characters held back are exactly those that could still turn into
    a stop string. After a stop string is found, ``stopped`` holds it and further
    deltas are ignored.
    """

    def __init__(self, stop_strings: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        self.stop_strings = tuple(stop_strings)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.text = ""  # everything received
        self.emitted = ""  # the part sent on
        self.stopped: str | None = None

    def add(self, delta: str) -> str:
        """Feed a delta; returns the text that can be sent on now (may be "")."""
        if self.stopped is not None or not delta:
            return ""
        self.text += delta
        found = find_stop_string(self.text, self.stop_strings, len(delta), self.include_stop_str_in_output)
        if found is not None:
            cut, self.stopped = found
            return self._emit_up_to(cut)
        hold = num_chars_to_hold_back(self.text, self.stop_strings)
        return self._emit_up_to(len(self.text) - hold)

    def flush(self) -> str:
        """The held-back tail, when the sequence ended for another reason."""
        if self.stopped is not None:
            return ""
        return self._emit_up_to(len(self.text))

    def _emit_up_to(self, end: int) -> str:
        end = max(end, len(self.emitted))
        delta = self.text[len(self.emitted) : end]
        self.emitted = self.text[:end]
        return delta
