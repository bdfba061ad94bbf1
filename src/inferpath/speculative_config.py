"""SpeculativeConfig: how drafts are proposed, validated once and frozen. Imports no torch.

Spelled as vLLM spells ``--speculative-config``: a JSON object (or a dict from Python)

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    {"method": "draft_model", "model": "qwen2.5-coder-0.5b-instruct", "num_speculative_tokens": 4}
    {"method": "draft_model", "model": "...", "num_speculative_tokens": 4, "draft_vocab_size": 32768}
    {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24}

Every key is read or refused by name: a key this engine does not implement (vLLM's
``draft_tensor_parallel_size``, an ``eagle`` method, ...) is an error, never dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model", "suffix")
_KEYS = {
    "ngram": ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"),
    "draft_model": ("method", "num_speculative_tokens", "model", "draft_vocab_size"),
    "suffix": ("method", "num_speculative_tokens", "suffix_decoding_max_tree_depth",
               "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
               "suffix_decoding_min_token_prob"),
}
MAX_SPECULATIVE_TOKENS = 16


class SpeculativeConfigError(ValueError):
    """A ``speculative_config`` value is malformed, unknown or out of range."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """``method``: ``ngram`` (prompt lookup over the prompt and the output so far),
    ``draft_model`` (a smaller model with the same vocabulary, named like any model) or
    ``suffix`` (suffix decoding: the request's own tokens and earlier requests' outputs,
    continuations chosen by how often they followed; engine/spec/suffix.py).

    ``num_speculative_tokens`` (k) drafts are verified in one step of k + 1 tokens.
    ngram: the longest suffix of ``prompt_lookup_min..prompt_lookup_max`` tokens that
    occurred earlier proposes the k tokens that followed it.
    suffix (vLLM's keys and defaults): a match of m tokens (at most
    ``suffix_decoding_max_tree_depth`` - 1, a depth of 3 or more) proposes at most
    ``floor(suffix_decoding_max_spec_factor * m)`` tokens, and no token whose estimated
    probability (the product of the frequencies along the drafted path) is below
    ``suffix_decoding_min_token_prob``; the outputs of the last
    ``suffix_decoding_max_cached_requests`` finished requests are kept (0: the request's own
    tokens only). Its k defaults to the tree depth, capped at this engine's 16.
    draft_model's ``draft_vocab_size`` (default: the whole vocabulary): the draft's LM head
    computes the logits of the token ids below it only (a byte-level BPE vocabulary numbers
    its tokens in merge order, the frequent ones first) and of the end-of-sequence ids, so a
    draft step reads that many rows of the head, not all of them (engine/spec/draft_model.py).
    The target verifies every draft as ever: greedy output is unchanged token for token, and
    the rejection rule stays exact for sampled rows (the draft's distribution is zero past
    the prefix); acceptance falls where an answer needs the rarer tokens. Rows under a
    grammar draft over the whole vocabulary.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculativeConfigError(
                f"speculative_config method {self.method!r} is not implemented; use one of "
                + ", ".join(METHODS))
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise SpeculativeConfigError(
                f"speculative_config num_speculative_tokens must be an integer in "
                f"1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        self._require_int("prompt_lookup_min", 1)
        self._require_int("prompt_lookup_max", 1)
        if lo > hi:
            raise SpeculativeConfigError(
                f"speculative_config prompt_lookup_min ({lo}) is above prompt_lookup_max ({hi})")
        if self.method == "suffix":
            self._check_suffix()
        if self.draft_vocab_size is not None:
            self._require_int("draft_vocab_size", 1)
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise SpeculativeConfigError(
                "speculative_config method 'draft_model' needs \"model\": the draft model's "
                "alias, .gguf file or Hugging Face directory")

    def _require_int(self, name: str, low: int) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpeculativeConfigError(f"speculative_config {name} must be an integer >= {low}, got {value!r}")

    def _check_suffix(self) -> None:
        self._require_int("suffix_decoding_max_tree_depth", 3)  # a match of 2 tokens and 1 draft (suffix.py)
        self._require_int("suffix_decoding_max_cached_requests", 0)
        factor, prob = self.suffix_decoding_max_spec_factor, self.suffix_decoding_min_token_prob
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            raise SpeculativeConfigError(
                f"speculative_config suffix_decoding_max_spec_factor must be a number > 0, got {factor!r}")
        if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 <= prob <= 1:
            raise SpeculativeConfigError(
                f"speculative_config suffix_decoding_min_token_prob must be a number in [0, 1], got {prob!r}")

    @classmethod
    def from_value(cls, value: Any) -> SpeculativeConfig:
        """From a SpeculativeConfig, a dict or a JSON object string (the CLI flag)."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise SpeculativeConfigError(
                    f"speculative_config is not valid JSON ({exc}): {value!r}") from None
        if not isinstance(value, dict):
            raise SpeculativeConfigError(
                f"speculative_config must be a JSON object or dict, got {type(value).__name__}")
        method = value.get("method")
        if method not in METHODS:
            raise SpeculativeConfigError(
                f"speculative_config method {method!r} is not implemented; use one of "
                + ", ".join(METHODS))
        unknown = sorted(set(value) - set(_KEYS[method]))
        if unknown:
            raise SpeculativeConfigError(
                f"speculative_config key(s) {', '.join(map(repr, unknown))} are not implemented "
                f"for method {method!r}; known keys: {', '.join(_KEYS[method])}")
        if method == "suffix" and "num_speculative_tokens" not in value:  # the depth, capped
            depth = value.get("suffix_decoding_max_tree_depth", cls.suffix_decoding_max_tree_depth)
            valid = isinstance(depth, int) and not isinstance(depth, bool)  # else __post_init__ names it
            value = {**value, "num_speculative_tokens": min(depth, MAX_SPECULATIVE_TOKENS) if valid
                     else MAX_SPECULATIVE_TOKENS}
        if "num_speculative_tokens" not in value:
            raise SpeculativeConfigError("speculative_config needs \"num_speculative_tokens\"")
        return cls(**value)
