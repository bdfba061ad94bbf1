"""A pass's precision: the weights' format and bytes, and the activation/KV dtype and compute
peak that follow from them (the cost model's dtype accounting, explain/cost.py).

Weights are read at ``Precision.weight_bytes`` per parameter (a dtype's size, or a GGUF
file's mean over its block formats); weight-only int8/int4 dequantize to bf16 in the matmul
(bf16 peak). Activations and the KV cache are bf16, fp32 when the weights are fp32 (the
cache bf16 beside them where the plan says: ``kv_value_bytes``).
``Precision.formats`` (explain/stage_formats.py) lists each matmul stage's matrices as they
run, for kernel_cost.py to price at their own kernels' rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}
_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "q8": "int8", "q4": "int4"}

# Float weight formats that run widened to float32 activations (bf16 weights on a CPU
# without bf16 arithmetic, kernels/bf16_weights.py): they compute at the activations' peak.
WIDENED_FORMATS = ("bfloat16",)


@dataclass(frozen=True)
class Precision:
    """Weight dtype, and the activation/KV dtype and compute peak that follow from it.

    ``bytes_per_weight`` overrides the dtype's size for weights kept in a file's block
    formats (``of_gguf``): e.g. a Q4_1 + Q8_0 GGUF runs with float32 activations
    (``weights="fp32"``) but reads 0.72 bytes per weight.
    """

    weights: str
    bytes_per_weight: float | None = None
    label: str = ""
    # each matmul stage's matrices as they run (explain/stage_formats.py): priced at the rate
    # of their own kernel (explain/kernel_cost.py); () prices every stage at the mean bytes
    formats: tuple = field(default=(), compare=False)
    # the block formats whose layer matrices run repacked by 8 rows (WeightPlan.repacked): their
    # rates are the repacked kernel's (kernel_cost.rate_format)
    repacked: tuple = field(default=(), compare=False)
    # bytes of a cached K or V value where the cache's dtype is not the activations' (a
    # bfloat16 KV cache beside float32 activations, EngineConfig.kv_cache_dtype); None: theirs
    kv_value_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.weights not in DTYPE_BYTES:
            raise ValueError(f"weight dtype {self.weights!r} is not one of {', '.join(DTYPE_BYTES)}")

    @classmethod
    def of_plan(cls, plan) -> "Precision":
        """The precision of a weight plan (engine/weight_plan.py): its activation dtype, and
        for matrices kept in GGUF blocks or bf16 beside float32 activations (or quantized at
        load) their bytes per weight as run, labelled with their formats."""
        base = cls.parse(str(plan.activation_dtype).removeprefix("torch."))
        kv = plan.kv_dtype.itemsize if plan.kv_dtype != plan.activation_dtype else None
        if not plan.quantized and plan.bytes_per_weight == base.weight_bytes:
            return replace(base, kv_value_bytes=kv)
        return cls(base.weights, plan.bytes_per_weight, " + ".join(plan.runs), repacked=tuple(plan.repacked),
                   kv_value_bytes=kv)

    @classmethod
    def of_gguf(cls, path) -> "Precision":
        """What inferpath runs for a GGUF file by default on this CPU: the precision of its
        weight plan (``of_plan``) under a default ``EngineConfig``. NOTE: a mix of block
        formats is averaged over the file's matrices, spread evenly over the stages."""
        from inferpath.config import EngineConfig
        from inferpath.engine.weight_plan import plan_weights

        from inferpath.explain.gguf_config import gguf_model_config
        from inferpath.explain.stage_formats import formats_of_plan

        plan = plan_weights(path, EngineConfig())
        return cls.of_plan(plan).with_formats(formats_of_plan(path, plan, gguf_model_config(path)))

    def with_formats(self, formats) -> "Precision":
        """This precision with each stage's matrices as they run (stage_formats.py)."""
        return replace(self, formats=tuple(formats))

    @property
    def activation_format(self) -> str:
        """The activations' dtype as the probe's rate keys name it ("float32")."""
        return "float32" if self.weights == "fp32" else "bfloat16"

    @classmethod
    def parse(cls, name: str) -> "Precision":
        key = name.lower()
        return cls(_DTYPE_ALIASES.get(key, key))

    @property
    def weight_bytes(self) -> float:
        return self.bytes_per_weight or DTYPE_BYTES[self.weights]

    @property
    def description(self) -> str:
        """e.g. "bf16", or "Q4_1 + Q8_0 (0.718 B/weight, fp32 activations)"."""
        if self.bytes_per_weight is None:
            return self.weights
        return f"{self.label} ({self.bytes_per_weight:.3f} B/weight, {self.weights} activations)"

    @property
    def activation_bytes(self) -> int:
        return 4 if self.weights == "fp32" else 2

    @property
    def kv_bytes(self) -> int:
        return self.kv_value_bytes or self.activation_bytes

    @property
    def compute_dtype(self) -> str:
        """The peak-FLOP/s key: "quantized" for block formats (the probe measures their
        kernels; a preset falls back to its bf16 peak), else the weights' dtype."""
        if self.bytes_per_weight is not None and self.label not in WIDENED_FORMATS:
            return "quantized"
        return "fp32" if self.weights == "fp32" else "bf16"
