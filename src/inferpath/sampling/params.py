"""SamplingParams: how one request turns logits into tokens and when it stops.

Torch-free so the server, the CLI and the scheduler can build and validate it without
importing torch. Field names and meanings follow the OpenAI API and vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inferpath.structured.spec import StructuredOutput

#: Temperatures below this are treated as greedy (argmax): dividing logits by a tiny
#: temperature overflows float32 and would make softmax produce NaN.
MIN_SAMPLING_TEMPERATURE = 1e-5
#: The largest top-N of logprobs a request may ask for (OpenAI's and vLLM's limit).
MAX_LOGPROBS = 20
#: logit_bias values lie in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (OpenAI's range).
MAX_LOGIT_BIAS = 100.0


def _fail(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"{name} must be {allowed}, got {value!r}")


def _check_int(name: str, value: object, allowed: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, value, f"an integer {allowed}")
    return value


def _check_float(name: str, value: object, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise _fail(name, value, f"a number {allowed}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping settings of one request; validated once, then frozen.

    Sampling order (see Sampler): penalties -> temperature -> top-k -> top-p -> min-p
    -> seeded draw (argmax when temperature < MIN_SAMPLING_TEMPERATURE) -> logprobs.

    Invariants after ``__post_init__``: every field lies in its documented range;
    ``stop`` is a tuple of non-empty strings; ``stop_token_ids`` a tuple of ints >= 0;
    ``top_k == -1`` is normalised to 0 (off); ``min_tokens <= max_tokens``.

    - ``max_tokens``: output tokens to generate at most; None = up to the context limit.
    - ``top_k``: keep the k most likely tokens (0 or -1 = off). Ties with the k-th
      logit are kept.
    - ``top_p``: keep the smallest set of most likely tokens whose mass reaches top_p.
    - ``min_p``: keep tokens with probability >= min_p x the top token's probability.
    - ``repetition_penalty``: > 1 discourages any token seen in the prompt or output
      (positive logits divided by it, negative ones multiplied).
    - ``frequency_penalty`` / ``presence_penalty``: subtracted from a token's logit
      per occurrence / once if it occurs in the output so far (OpenAI's definition).
    - ``seed``: the same seed gives the same tokens whatever else is in the batch.
    - ``logprobs``: None = none; N = the chosen token's logprob plus the top N
      (0 = the chosen token's only). Logprobs are of the model's raw distribution,
      before penalties, temperature and truncation (vLLM's default).
    - ``min_tokens``: EOS and ``stop_token_ids`` are banned (logit -inf) and stop
      strings ignored until this many tokens have been generated.
    - ``stop``: strings that end generation; cut from the output unless
      ``include_stop_str_in_output``.
    - ``logit_bias``: ``{token_id: bias}`` added to the logits before everything else
      (OpenAI's; bias in [-100, 100]: -100 bans a token, +100 all but forces it); stored
      as sorted ``(token_id, bias)`` pairs. Ids are checked against the vocabulary by the
      engine.
    - ``prompt_logprobs``: None = none; N = each prompt token's logprob given the tokens
      before it, plus the top N there (vLLM's; the first token has None).
    - ``structured``: the grammar the output must match (``inferpath.structured``); the
      sampler masks every token the grammar does not allow next.
    """

    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | list[int] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    logit_bias: Any = None
    structured: StructuredOutput | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if _check_int("n", self.n, ">= 1") < 1:
            raise _fail("n", self.n, ">= 1")
        if self.max_tokens is not None and _check_int("max_tokens", self.max_tokens, ">= 1") < 1:
            raise _fail("max_tokens", self.max_tokens, ">= 1 or None")
        temperature = _check_float("temperature", self.temperature, ">= 0")
        if not 0.0 <= temperature < math.inf:
            raise _fail("temperature", temperature, "a finite number >= 0 (0 = greedy)")
        if not 0.0 < _check_float("top_p", self.top_p, "in (0, 1]") <= 1.0:
            raise _fail("top_p", self.top_p, "in (0, 1]")
        top_k = _check_int("top_k", self.top_k, ">= 1, or 0 or -1 (off)")
        if top_k < -1:
            raise _fail("top_k", top_k, ">= 1, or 0 or -1 (off)")
        if top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if not 0.0 <= _check_float("min_p", self.min_p, "in [0, 1]") <= 1.0:
            raise _fail("min_p", self.min_p, "in [0, 1]")
        rep = _check_float("repetition_penalty", self.repetition_penalty, "> 0")
        if not 0.0 < rep < math.inf:
            raise _fail("repetition_penalty", rep, "a finite number > 0 (1 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= _check_float(name, value, "in [-2, 2]") <= 2.0:
                raise _fail(name, value, "in [-2, 2]")
        if self.seed is not None and not -(2**63) <= _check_int("seed", self.seed, "(64-bit signed) or None") < 2**63:
            raise _fail("seed", self.seed, "a 64-bit signed integer or None")
        if self.logprobs is not None and not (
            0 <= _check_int("logprobs", self.logprobs, f"in [0, {MAX_LOGPROBS}]") <= MAX_LOGPROBS
        ):
            raise _fail("logprobs", self.logprobs, f"in [0, {MAX_LOGPROBS}] or None")
        if _check_int("min_tokens", self.min_tokens, ">= 0") < 0:
            raise _fail("min_tokens", self.min_tokens, ">= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _fail("min_tokens", self.min_tokens, f"<= max_tokens ({self.max_tokens})")
        object.__setattr__(self, "stop", _normalise_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _normalise_stop_token_ids(self.stop_token_ids))
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, getattr(self, name), "True or False")
        object.__setattr__(self, "logit_bias", _normalise_logit_bias(self.logit_bias))
        if self.prompt_logprobs is not None and not (
            0 <= _check_int("prompt_logprobs", self.prompt_logprobs, f"in [0, {MAX_LOGPROBS}]") <= MAX_LOGPROBS
        ):
            raise _fail("prompt_logprobs", self.prompt_logprobs, f"in [0, {MAX_LOGPROBS}] or None")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise _fail("structured", self.structured, "an inferpath.structured.StructuredOutput or None")

    @property
    def is_greedy(self) -> bool:
        """True when the sampler takes the argmax (temperature effectively 0)."""
        return self.temperature < MIN_SAMPLING_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def max_stop_str_len(self) -> int:
        """Length of the longest stop string (0 without any)."""
        return max((len(s) for s in self.stop), default=0)


def _normalise_stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else stop
    if not isinstance(strings, (list, tuple)) or not all(isinstance(s, str) for s in strings):
        raise _fail("stop", stop, "a string, a list of strings or None")
    if any(s == "" for s in strings):
        raise _fail("stop", stop, "non-empty strings (an empty stop string matches everywhere)")
    return tuple(strings)


def _normalise_stop_token_ids(ids: object) -> tuple[int, ...]:
    if ids is None:
        return ()
    if not isinstance(ids, (list, tuple, set, frozenset)):
        raise _fail("stop_token_ids", ids, "a list of token ids >= 0")
    for token_id in ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise _fail("stop_token_ids", ids, "a list of token ids >= 0")
    return tuple(ids)


def _normalise_logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    if bias is None:
        return ()
    items = bias.items() if isinstance(bias, dict) else bias
    if not isinstance(items, (list, tuple, type({}.items()))):
        raise _fail("logit_bias", bias, "a {token_id: bias} mapping")
    pairs = {}
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise _fail("logit_bias", bias, "a {token_id: bias} mapping")
        token_id, value = item
        if isinstance(token_id, str) and token_id.strip().isdigit():
            token_id = int(token_id)  # JSON object keys are strings
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise ValueError(f"logit_bias key {token_id!r} must be a token id >= 0")
        value = _check_float("logit_bias", value, f"in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias value {value:g} for token {token_id} must be in "
                             f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        pairs[token_id] = value
    return tuple(sorted(pairs.items()))
