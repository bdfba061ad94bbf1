"""Engine: request state, scheduler, runner, and the offline and async engines.

``from inferpath.engine import LLMEngine, AsyncEngine, RequestOutput, CompletionOutput,
RequestError, QueueFullError``. The torch-free parts (errors, outputs, request, scheduler)
import eagerly; the engines (which import torch) on first use.
"""

from inferpath.engine.errors import QueueFullError, RequestError
from inferpath.engine.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput

__all__ = ["AsyncEngine", "CompletionOutput", "EngineStats", "LLMEngine", "QueueFullError",
           "RequestError", "RequestMetrics", "RequestOutput", "RequestStream"]


def __getattr__(name: str):
    if name == "LLMEngine":
        from inferpath.engine.llm_engine import LLMEngine

        return LLMEngine
    if name in ("AsyncEngine", "RequestStream"):
        from inferpath.engine import async_engine

        return getattr(async_engine, name)
    raise AttributeError(f"module 'inferpath.engine' has no attribute {name!r}")
