"""SpeculativeConfig: how drafts are proposed, validated once and frozen. Imports no torch.

Spelled as vLLM spells ``--speculative-config``: a JSON object (or a dict from Python)

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    {"method": "draft_model", "model": "qwen2.5-coder-0.5b-instruct", "num_speculative_tokens": 4}

Every key is read or refused by name: a key this engine does not implement (vLLM's
``draft_tensor_parallel_size``, an ``eagle`` method, ...) is an error, never dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model")
_KEYS = {
    "ngram": ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"),
    "draft_model": ("method", "num_speculative_tokens", "model"),
}
MAX_SPECULATIVE_TOKENS = 16


class SpeculativeConfigError(ValueError):
    """A ``speculative_config`` value is malformed, unknown or out of range."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """``method``: ``ngram`` (prompt lookup over the prompt and the output so far) or
    ``draft_model`` (a smaller model with the same vocabulary, named like any model).

    ``num_speculative_tokens`` (k) drafts are verified in one step of k + 1 tokens.
    ngram: the longest suffix of ``prompt_lookup_min..prompt_lookup_max`` tokens that
    occurred earlier proposes the k tokens that followed it.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    model: str | None = None

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
        for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpeculativeConfigError(
                    f"speculative_config {name} must be a positive integer, got {value!r}")
        if lo > hi:
            raise SpeculativeConfigError(
                f"speculative_config prompt_lookup_min ({lo}) is above prompt_lookup_max ({hi})")
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise SpeculativeConfigError(
                "speculative_config method 'draft_model' needs \"model\": the draft model's "
                "alias, .gguf file or Hugging Face directory")

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
        if "num_speculative_tokens" not in value:
            raise SpeculativeConfigError("speculative_config needs \"num_speculative_tokens\"")
        return cls(**value)
