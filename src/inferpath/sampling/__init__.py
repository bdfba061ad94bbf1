"""Stage 6 (sampling) and the stopping rules of Stage 8.

``SamplingParams`` and ``inferpath.sampling.stop`` import no torch; the sampler
(``Sampler``, ``SamplingRow``, ``SamplerOutput``, ``TokenLogprobs``) is imported lazily
so that ``from inferpath.sampling import SamplingParams`` stays cheap.
"""

from __future__ import annotations

from inferpath.sampling.params import SamplingParams

__all__ = ["Sampler", "SamplerOutput", "SamplingParams", "SamplingRow", "TokenLogprob", "TokenLogprobs"]

_SAMPLER_NAMES = {"Sampler", "SamplingRow", "SamplerOutput"}


def __getattr__(name: str):
    if name in _SAMPLER_NAMES:
        from inferpath.sampling import sampler

        return getattr(sampler, name)
    if name in ("TokenLogprobs", "TokenLogprob"):  # TokenLogprob: the contract's other spelling
        from inferpath.sampling.logprobs import TokenLogprobs

        return TokenLogprobs
    raise AttributeError(f"module 'inferpath.sampling' has no attribute {name!r}")
