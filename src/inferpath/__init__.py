"""inferpath: a glass-box LLM inference engine.

Public API: ``LLM`` (offline engine) and ``SamplingParams``.
"""

from __future__ import annotations

from inferpath.threads import set_default_wait_policy

set_default_wait_policy()  # before torch loads libgomp: threads sleep, not spin, when idle (threads.py)

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # Lazy: `import inferpath` stays cheap (no torch) for the tokenizer and the cost model.
    if name == "LLM":
        from inferpath.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from inferpath.sampling.params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'inferpath' has no attribute {name!r}")
