"""ModelConfig and EngineConfig: validated once, frozen.

ModelConfig is the one description of a model's shapes that every part of inferpath
reads: the model builds its layers from it, the KV cache sizes its tensors from it, and
the cost model (explain/) turns it into bytes and FLOPs. It comes from a Hugging Face
``config.json``, from GGUF metadata (weights/gguf.py builds the dict), or from a named
preset of a well-known model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "mixtral")


class ConfigError(ValueError):
    """A model or engine configuration value is missing or out of range."""


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a decoder-only transformer (Llama family).

    Invariants: num_heads % num_kv_heads == 0; head_dim * num_heads need not equal
    hidden_size (some models decouple them). ``num_experts == 0`` means a dense SwiGLU
    FFN; otherwise a mixture of experts routed top-``num_experts_per_tok``.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # rope_scaling as a tuple of (key, value) pairs so the config stays hashable/frozen;
    # read it with ``rope_scaling_dict``.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on the Q, K and V projections
    num_experts: int = 0
    num_experts_per_tok: int = 0
    sliding_window: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"architecture {self.architecture!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for field_name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                           "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{field_name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"1..num_experts ({self.num_experts})"
            )

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """The seed's formula: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rope_scaling"] = self.rope_scaling_dict
        return d

    def with_name(self, name: str) -> "ModelConfig":
        return replace(self, name=name)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str = "") -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict."""
        model_type = cfg.get("model_type")
        if model_type is None:
            raise ConfigError("config.json has no 'model_type'; expected one of "
                              + ", ".join(SUPPORTED_ARCHITECTURES))
        try:
            num_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            head_dim = cfg.get("head_dim") or hidden // num_heads
            rope_scaling = cfg.get("rope_scaling")
            rope_theta = cfg.get("rope_theta")
            if rope_theta is None and isinstance(cfg.get("rope_parameters"), dict):
                # transformers >= 5 nests RoPE settings under rope_parameters
                params = dict(cfg["rope_parameters"])
                rope_theta = params.pop("rope_theta", None)
                if params.get("rope_type", "default") != "default":
                    rope_scaling = params
            if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
                rope_scaling = None
            num_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
            return cls(
                architecture=model_type,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
                rope_scaling=_freeze(rope_scaling),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                num_experts=num_experts,
                num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if num_experts else 0,
                sliding_window=(cfg.get("sliding_window") if cfg.get("use_sliding_window", model_type == "mistral") else None),
                name=name,
            )
        except KeyError as exc:
            raise ConfigError(f"config.json is missing required field {exc.args[0]!r}") from None

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_hf_config(data, name=path.parent.name)


def _freeze(value: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    if not value:
        return None
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in value.items()))


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: dtype, cache geometry, batching limits.

    The number of KV blocks is *measured* (from a memory budget) and lives in the runner,
    not here; ``num_kv_blocks`` set here is an explicit override (tests use it to force
    preemption).
    """

    # "auto": a quantized GGUF runs quantized (float32 activations), float weights in bf16
    # where the CPU has native bf16, else float32 (engine/load.py); a dtype: every weight in it
    dtype: str = "auto"
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

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
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
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ConfigError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
