"""The builder's choice of how a model's weights run, and the load that follows it.

``EngineConfig.dtype="auto"`` (the default) means: a GGUF file's block-quantized weights
stay quantized and run through the fused kernels (float32 activations); float weights
run in bfloat16 where the CPU multiplies bf16 natively (AVX512-BF16 or AMX), else in
float32 — except matrices stored in bfloat16, which stay bfloat16 (read where they lie)
and are widened inside the float32 kernels (kernels/bf16_weights.py): a decode step reads
2 bytes a weight, not the 4 of a float32 copy. An explicit dtype loads every weight in it
(quantized ones dequantized): the reference path. ``WeightFormat`` says
what was chosen, for the summary line, ``explain`` and the benchmarks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


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
        return f"{self.formats} weights, {activations} activations, kernels {self.kernel_level}"


def auto_float_dtype() -> torch.dtype:
    """bfloat16 where the CPU has native bf16 arithmetic and its kernels run, else float32."""
    from inferpath.kernels import build

    native = any(flag in build._cpu_flags() for flag in NATIVE_BF16_FLAGS)
    return torch.bfloat16 if native and build.kernel_level(torch.bfloat16) == "avx512" else torch.float32


def load_weights(path: Path, engine_config, progress: bool = False):
    """(checkpoint, compute dtype) for ``path`` under ``engine_config.dtype`` ("auto" or a
    dtype name); with "auto" a GGUF's quantized tensors stay ``QuantizedTensor``; with
    ``engine_config.quantization`` float weights are quantized to it (a quantized file is
    refused)."""
    from inferpath.kernels.quantized import quantized_kernels_available
    from inferpath.weights import load_checkpoint
    from inferpath.weights.quantized import QuantizedTensor

    if engine_config.quantization:
        from inferpath.weights.quantize import quantize_checkpoint

        if engine_config.tensor_parallel_size > 1:
            raise ValueError("quantization with tensor_parallel_size > 1 is not supported")
        checkpoint = load_checkpoint(path, dtype=torch.float32, progress=progress, keep_quantized=True)
        return quantize_checkpoint(checkpoint, engine_config.quantization), torch.float32
    if engine_config.dtype != "auto":
        dtype = getattr(torch, engine_config.dtype)
        return load_checkpoint(path, dtype=dtype, progress=progress), dtype
    keep_quantized = (engine_config.cpu_kernels and engine_config.tensor_parallel_size == 1
                      and quantized_kernels_available())
    float_dtype = auto_float_dtype() if engine_config.cpu_kernels else torch.float32
    if Path(path).is_dir() or not _holds_blocks(path):  # float weights: read in the dtype that runs
        keep_bf16 = float_dtype == torch.float32 and _widening_kernels_run(engine_config)
        return load_checkpoint(path, dtype=float_dtype, progress=progress, keep_bf16=keep_bf16), float_dtype
    # a quantized file: float32 activations, its blocks kept or not
    checkpoint = load_checkpoint(path, dtype=torch.float32, progress=progress, keep_quantized=True)
    if not keep_quantized:  # no kernels here, or sharded: dequantize (the reference path)
        checkpoint.tensors = {name: t.dequantize() if isinstance(t, QuantizedTensor) else t
                              for name, t in checkpoint.tensors.items()}
    return checkpoint, torch.float32


def _widening_kernels_run(engine_config) -> bool:
    """Whether bf16 matrices may stay bf16 beside float32 activations: the float32 kernels
    (with the GEMV that widens bf16 weights) run, on one process."""
    from inferpath.kernels import build

    return (engine_config.cpu_kernels and engine_config.tensor_parallel_size == 1
            and build.native_gemv_bf16_weights() is not None)


def _holds_blocks(path: Path) -> bool:
    """Whether ``path`` is a GGUF file with a matrix in a block format the quantized
    kernels read (its index says so: no tensor is read)."""
    from inferpath.weights.gguf_index import read_gguf_index
    from inferpath.weights.quantized import QUANTIZED_TYPES

    with open(path, "rb") as file:
        if file.read(4) != b"GGUF":
            return False
    return any(t.qtype in QUANTIZED_TYPES and len(t.shape) == 2 for t in read_gguf_index(path).tensors)


def build_for_engine(checkpoint, dtype: torch.dtype, engine_config) -> nn.Module:
    """The model the engine runs: sharded, quantized or plain, with the CPU kernels applied
    unless ``engine_config.cpu_kernels`` is off."""
    from inferpath.kernels import accelerate
    from inferpath.kernels.bf16_weights import build_bf16_weight_model, holds_bf16_matrices
    from inferpath.kernels.quantized import build_quantized_model
    from inferpath.model import build_model

    if engine_config.tensor_parallel_size > 1:
        from inferpath.parallel.tp_model import TensorParallelModel

        return TensorParallelModel(checkpoint, dtype, engine_config.tensor_parallel_size,
                                   cpu_kernels=engine_config.cpu_kernels)
    if checkpoint.quantized_tensors:
        model = build_quantized_model(checkpoint, dtype)
    elif dtype == torch.float32 and holds_bf16_matrices(checkpoint):  # loaded with keep_bf16
        model = build_bf16_weight_model(checkpoint)
    else:
        model = build_model(checkpoint, dtype)
    if engine_config.cpu_kernels:
        accelerate(model)
    return model


def weight_format(model: nn.Module) -> WeightFormat:
    """Describe what ``model`` runs (see WeightFormat). A decode step reads every linear
    weight whole (a tied LM head: the embedding table) and one row of an embedding."""
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
    level = (build.kernel_level("quantized" if quantized else dtype) if uses_kernels else None) or "PyTorch"
    return WeightFormat(" + ".join(name for name, _ in formats.most_common()), dtype, level, decode_bytes,
                        weight_bytes=sum(entry[1] for entry in weights.values()),
                        num_weights=sum(entry[4] for entry in weights.values()), quantized=quantized)
