"""The load that follows a model's weight plan (engine/weight_plan.py), the model built
from it, and ``WeightFormat``: what the built model runs, measured from its modules, for
the summary line, ``trace`` and the benchmarks.

Nothing here decides how weights run: ``plan_weights`` did, from the checkpoint's index,
the ``EngineConfig`` and the CPU; ``load_by_plan`` and ``build_for_engine`` follow it (and
the tensor-parallel workers call them with the plan rank 0 made).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from inferpath.engine.weight_plan import (  # noqa: F401 (auto_float_dtype: re-exported)
    DEQUANTIZED,
    QUANTIZED,
    WeightPlan,
    auto_float_dtype,
    k_quant_passes_note,
    plan_weights,
)


@dataclass(frozen=True)
class WeightFormat:
    """What a loaded model runs: weight formats (e.g. "Q4_1 + Q8_0" or "bfloat16"), the
    activation dtype, the kernel level ("avx512", "avx2", "generic" or "PyTorch"), and
    the bytes of weights one decode step reads."""

    formats: str
    dtype: torch.dtype
    kernel_level: str
    decode_bytes: int
    weight_bytes: int = 0  # all matrices (linear and embedding), each once
    num_weights: int = 0  # their values
    quantized: bool = False

    def describe(self) -> str:
        activations = str(self.dtype).removeprefix("torch.")
        passes = k_quant_passes_note(self.formats.split(" + "), self.kernel_level) if self.quantized else ""
        return f"{self.formats} weights, {activations} activations, kernels {self.kernel_level}{passes}"


def load_weights(path: Path, engine_config, progress: bool = False) -> tuple:
    """(checkpoint, plan): the plan for ``path`` under ``engine_config``
    (``plan_weights``), and the checkpoint loaded by it."""
    plan = plan_weights(path, engine_config)
    return load_by_plan(path, plan, progress), plan


def load_by_plan(path: Path, plan: WeightPlan, progress: bool = False):
    """The checkpoint at ``path`` loaded as ``plan`` says: GGUF blocks kept
    (``plan.keep_quantized``) or dequantized, bf16 matrices kept beside float32
    activations (``plan.keep_bf16``), float matrices quantized (``plan.quantization``),
    everything else in ``plan.activation_dtype``."""
    from inferpath.weights import load_checkpoint
    from inferpath.weights.quantized import QuantizedTensor

    if plan.matrices == QUANTIZED:
        from inferpath.weights.quantize import quantize_checkpoint

        checkpoint = load_checkpoint(path, dtype=torch.float32, progress=progress, keep_quantized=True)
        return quantize_checkpoint(checkpoint, plan.quantization)
    if plan.keep_quantized or (plan.matrices == DEQUANTIZED and plan.activation_dtype == torch.float32):
        # the blocks kept, then (no kernels here, or sharded) dequantized: the reference path
        checkpoint = load_checkpoint(path, dtype=torch.float32, progress=progress, keep_quantized=True)
        if not plan.keep_quantized:
            checkpoint.tensors = {name: t.dequantize() if isinstance(t, QuantizedTensor) else t
                                  for name, t in checkpoint.tensors.items()}
        return checkpoint
    return load_checkpoint(path, dtype=plan.activation_dtype, progress=progress, keep_bf16=plan.keep_bf16)


def build_for_engine(checkpoint, plan: WeightPlan, engine_config) -> nn.Module:
    """The model the engine runs, as ``plan`` says: sharded, quantized, bf16 matrices in
    the float32 kernels, or plain; the CPU kernels applied unless
    ``engine_config.cpu_kernels`` is off. Raises ValueError where ``checkpoint`` was not
    loaded by ``plan`` (``load_by_plan``)."""
    from inferpath.kernels import accelerate
    from inferpath.kernels.bf16_weights import build_bf16_weight_model, holds_bf16_matrices
    from inferpath.kernels.quantized import build_quantized_model
    from inferpath.model import build_model

    if plan.tensor_parallel_size > 1:
        from inferpath.parallel.tp_model import TensorParallelModel

        return TensorParallelModel(checkpoint, plan, cpu_kernels=engine_config.cpu_kernels)
    if bool(checkpoint.quantized_tensors) != plan.quantized or (plan.keep_bf16 and not holds_bf16_matrices(checkpoint)):
        raise ValueError(f"the checkpoint of {checkpoint.path} was not loaded by its weight plan "
                         f"({plan.describe()}): load it with engine.load.load_by_plan")
    if plan.quantized:
        model = build_quantized_model(checkpoint, plan.activation_dtype, plan.repacked)
    elif plan.keep_bf16:
        model = build_bf16_weight_model(checkpoint)
    else:
        model = build_model(checkpoint, plan.activation_dtype)
    if engine_config.cpu_kernels:
        accelerate(model)
    return model


def weight_format(model: nn.Module, plan: WeightPlan | None = None) -> WeightFormat:
    """Describe what ``model`` runs (see WeightFormat), measured from its modules; the
    kernel level is ``plan``'s where given. A decode step reads every linear weight whole
    (a tied LM head: the embedding table) and one row of an embedding."""
    from inferpath.kernels import build
    from inferpath.kernels.modules import CPULinear
    from inferpath.kernels.quantized import QuantEmbedding, QuantLinear

    weights: dict[int, list] = {}  # id -> [format name, bytes, rows, read whole by a linear]
    for module in model.modules():
        if isinstance(module, (QuantLinear, QuantEmbedding)):
            weight, name = module.qweight, module.qweight.type_name
            nbytes = weight.nbytes
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            weight, name = module.weight, str(module.weight.dtype).removeprefix("torch.")
            nbytes = weight.numel() * weight.element_size()
        else:
            continue
        entry = weights.setdefault(id(weight), [name, nbytes, weight.shape[0], False, weight.shape[0] * weight.shape[1]])
        entry[3] |= isinstance(module, (nn.Linear, QuantLinear))
    formats: Counter = Counter()
    decode_bytes = 0
    for name, nbytes, rows, whole, _ in weights.values():
        formats[name] += nbytes
        decode_bytes += nbytes if whole else nbytes // rows
    linear_ids = {id(p) for p in model.parameters()} & set(weights)
    decode_bytes += sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in linear_ids)
    quantized = any(isinstance(m, QuantLinear) for m in model.modules())
    dtype = getattr(model, "dtype", torch.float32)
    uses_kernels = any(isinstance(m, (CPULinear, QuantLinear)) for m in model.modules())
    if plan is not None:
        level = plan.kernel_level
    else:
        level = (build.kernel_level("quantized" if quantized else dtype) if uses_kernels else None) or "PyTorch"
    return WeightFormat(" + ".join(name for name, _ in formats.most_common()), dtype, level, decode_bytes,
                        weight_bytes=sum(entry[1] for entry in weights.values()),
                        num_weights=sum(entry[4] for entry in weights.values()), quantized=quantized)
