"""EngineConfig: how the engine runs a model, validated once, frozen. Imports no torch.

ModelConfig (config.py) says what a model is; EngineConfig says how to run it: the dtype,
the KV cache's geometry and budget, the batching limits, the kernels and threads,
determinism and speculative decoding. The ``inferpath`` command makes one flag per field
(cli/engine_flags.py), so a field added here gets its flag with no CLI change.
``inferpath.config`` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferpath.errors import ConfigError
from inferpath.speculative_config import SpeculativeConfig, SpeculativeConfigError


KV_CACHE_DTYPES = ("auto", "bfloat16")  # EngineConfig.kv_cache_dtype's values


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: dtype, cache geometry, batching limits.

    The number of KV blocks is *measured* (from a memory budget) and lives in the runner,
    not here; ``num_kv_blocks`` set here is an explicit override (tests use it to force
    preemption).
    """

    # "auto": a quantized GGUF runs quantized (float32 activations), float weights in bf16
    # where the CPU has native bf16, else float32 (engine/weight_plan.py); a dtype: every weight in it
    dtype: str = "auto"
    # the KV cache's dtype: "auto", the activations'; "bfloat16" beside float32 activations
    # halves the cache's bytes (K and V rounded to bf16 once, as they are written)
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int = 512 * 1024**2  # CPU-sized: ~11k tokens of SmolLM2 in fp32
    enable_prefix_caching: bool = True
    max_waiting_requests: int = 1024
    seed: int = 0
    tensor_parallel_size: int = 1  # local ranks the model is sharded over (parallel/)
    cpu_kernels: bool = True  # CPULinear dispatch (kernels/): native bf16 GEMV, packed oneDNN
    threads: int | None = None  # compute threads (kernels and PyTorch); None: physical cores (threads.py)
    quantization: str | None = None  # q8_0 | q4_0 | q4_k: quantize float weights on load (weights/quantize.py)
    # a request's tokens and logprobs bitwise the same whatever shares its steps
    # (model/batch_invariant.py); costs speed on prompts and large bf16 batches
    batch_invariant: bool = False
    # the same, for the requests that set a seed only: their rows run as a batch-invariant
    # sub-batch of each step, the others' keep the fast kernels (engine/row_passes.py)
    deterministic_seeded: bool = False
    # speculative decoding (speculative_config.py): a SpeculativeConfig, or its dict / JSON
    # spelling ({"method": "ngram", "num_speculative_tokens": 4}); None: off
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if self.speculative_config is not None:
            try:
                spec = SpeculativeConfig.from_value(self.speculative_config)
            except SpeculativeConfigError as exc:
                raise ConfigError(str(exc)) from None
            object.__setattr__(self, "speculative_config", spec)
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be {' or '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r} "
                              "(auto: the activations' dtype; fp8 and float16 caches are not implemented)")
        if self.kv_cache_dtype != "auto" and self.tensor_parallel_size > 1:
            raise ConfigError(f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported with "
                              f"tensor_parallel_size={self.tensor_parallel_size}; use auto")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_waiting_requests",
                     "tensor_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads <= 0):
            raise ConfigError(f"threads must be a positive integer or None (the physical cores), got {self.threads!r}")
        if self.quantization is not None and self.quantization.lower() not in ("q8_0", "q4_0", "q4_k"):
            raise ConfigError(f"quantization must be q8_0, q4_0 or q4_k (or None), got {self.quantization!r}")
        if self.quantization is not None and self.dtype not in ("auto", "float32"):
            raise ConfigError(f"quantization={self.quantization!r} runs float32 activations; "
                              f"dtype={self.dtype!r} cannot go with it (use auto)")
        if self.batch_invariant and self.tensor_parallel_size > 1:
            raise ConfigError("batch_invariant is not supported with tensor_parallel_size > 1")
        if self.deterministic_seeded and self.tensor_parallel_size > 1:
            raise ConfigError("deterministic_seeded (--deterministic-seeded) is not supported with "
                              f"tensor_parallel_size={self.tensor_parallel_size}; use 1")
        if self.deterministic_seeded and self.speculative_config is not None:
            # verification samples a batch of drafts' distributions, and a draft model's own
            # steps are batched: neither is made row-invariant (engine/row_passes.py)
            raise ConfigError("deterministic_seeded (--deterministic-seeded) is not supported with "
                              "speculative decoding (speculative_config); turn one of them off")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ConfigError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
