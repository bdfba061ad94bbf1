"""How a model's weights run, decided once: the weight plan.

``plan_weights`` reads a checkpoint's index (a GGUF file's tensor table, safetensors
headers: no tensor data), the ``EngineConfig`` and the CPU's kernel levels, and returns a
frozen ``WeightPlan``. Everything downstream reads it and decides nothing again: the
loader (engine/load.py: which tensors stay in their blocks, stay bf16, or are converted),
the model builder (which model class), the KV cache (its dtype), the tensor-parallel
workers (they receive the plan and load by it), explain's precision
(``Precision.of_plan``), the trace and the ``generate`` summary line.

``EngineConfig.dtype="auto"`` (the default) means: a GGUF file's block-quantized matrices
stay in their blocks, read as laid out by the fused kernels (float32 activations);
float weights run in bfloat16 where the CPU multiplies bf16 natively (AVX512-BF16 or
AMX), else in float32 — except matrices stored in bfloat16, which stay bfloat16 (read
where they lie) and are widened inside the float32 kernels (kernels/bf16_weights.py).
Q4_K and Q6_K matrices are repacked at load into groups of eight rows (``repacked``;
kernels/repacked.py) where the kernels run at avx2 or avx512: by default at the levels of
``REPACK_DEFAULT_LEVELS`` (both: prefill at least as fast as the file's layout, 1-thread
decode 1.4x, batch 8 5.3x its batch 1 against 1.9x; docs/kquant_kernels.md), with
``INFERPATH_REPACK=1`` at any of ``REPACK_LEVELS``, and at every such level when the engine speculates
(``speculative_config``: its verification steps are 2-8 rows of one sequence, where the
file's layout at avx512 costs 2.2-5x a one-row step and the repacked groups 1.1-1.7x);
``INFERPATH_REPACK=0`` keeps the file's layout.
Without the kernels, or
sharded, blocks are dequantized (the reference path). An explicit
dtype converts every weight to it (blocks dequantized); ``quantization`` quantizes float
matrices at load. The KV cache holds the activations' dtype, or bfloat16 beside float32
activations where ``EngineConfig.kv_cache_dtype`` asks (``kv_cache_dtype``).
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# How the matrices run, against how they are stored
AS_LAID_OUT = "as laid out"  # read where they lie: GGUF blocks, or floats of the running dtype
WIDENED = "widened"  # bf16 matrices beside float32 activations, widened inside the kernels
DEQUANTIZED = "dequantized"  # GGUF blocks to floats at load
CONVERTED = "converted"  # floats to another float dtype at load
QUANTIZED = "quantized"  # float matrices quantized at load (EngineConfig.quantization)
_FLOAT_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}  # GGUF, safetensors


@dataclass(frozen=True)
class WeightPlan:
    """What a model runs, decided before any tensor is read.

    ``stored``: the matrices' formats in the checkpoint, most bytes first (GGUF type
    names such as "Q4_1", "BF16", "F32"; a safetensors dtype as "bfloat16").
    ``matrices``: how they run (AS_LAID_OUT, WIDENED, DEQUANTIZED, CONVERTED, QUANTIZED);
    ``runs``: the formats they run in. ``kernel_level``: the level of the kernel family
    the matrices run through ("avx512", "avx2", "generic"), or "PyTorch".
    ``bytes_per_weight``: bytes a decode step reads per matrix value, as run.

    Invariants: ``kv_dtype == activation_dtype``, or bfloat16 beside float32
    activations (``EngineConfig.kv_cache_dtype``); ``keep_quantized`` only for a GGUF whose
    blocks run as laid out; ``keep_bf16`` only where bf16 matrices meet float32
    activations; a sharded plan (tensor_parallel_size > 1) keeps neither."""

    checkpoint: str  # "gguf" or "safetensors"
    stored: tuple[str, ...]
    matrices: str
    runs: tuple[str, ...]
    activation_dtype: torch.dtype
    kv_dtype: torch.dtype
    kernel_level: str
    kernel_family: str  # "quantized", "float32" or "bfloat16"
    bytes_per_weight: float
    tensor_parallel_size: int = 1
    quantization: str | None = None
    repacked: tuple[str, ...] = ()  # formats whose linear weights are repacked by 8 rows at load

    @property
    def keep_quantized(self) -> bool:
        """The loader keeps the GGUF blocks (``load_checkpoint(keep_quantized=True)``)."""
        return self.checkpoint == "gguf" and self.matrices == AS_LAID_OUT and self.kernel_family == "quantized"

    @property
    def keep_bf16(self) -> bool:
        """The loader leaves bf16 matrices bf16 beside float32 activations."""
        return self.matrices == WIDENED

    @property
    def quantized(self) -> bool:
        """The matrices run through the quantized kernels (blocks, kept or made at load)."""
        return self.kernel_family == "quantized"

    def describe(self) -> str:
        """One line, e.g. "Q4_1 + Q8_0 as laid out, float32 activations and KV, kernels avx512"."""
        runs = " + ".join(self.runs)
        how = f"{self.matrices} to {runs}" if self.matrices in (DEQUANTIZED, CONVERTED, QUANTIZED) else \
            f"{runs} {self.matrices}"
        act, kv = (str(d).removeprefix("torch.") for d in (self.activation_dtype, self.kv_dtype))
        dtypes = f"{act} activations and KV" if act == kv else f"{act} activations, {kv} KV"
        tp = f", {self.tensor_parallel_size} TP ranks" if self.tensor_parallel_size > 1 else ""
        if self.repacked and self.matrices == AS_LAID_OUT:  # "Q5_0 + Q8_0 as laid out, Q4_K + Q6_K repacked by 8 rows"
            kept = [r for r in self.runs if r not in self.repacked]
            how = (f"{' + '.join(kept)} {self.matrices}, " if kept else "") + \
                f"{' + '.join(self.repacked)} repacked by 8 rows"
        elif self.repacked:
            how += f" ({' + '.join(self.repacked)} repacked by 8 rows)"
        passes = k_quant_passes_note(self.runs, self.kernel_level) if self.quantized else ""
        return f"{how}, {dtypes}, kernels {self.kernel_level}{passes}{tp}"


def k_quant_passes_note(formats, kernel_level: str) -> str:
    """" (the K-quants' x in 2 int8 passes)" where ``formats`` (names) hold a K-quant and the
    level runs native kernels: how many passes is the level's (csrc/quant/activations.h)."""
    from inferpath.kernels import build

    if kernel_level not in build.LEVEL_NAMES or not any(k in f for f in formats for k in ("Q4_K", "Q5_K", "Q6_K")):
        return ""
    passes = build.k_quant_x_passes(kernel_level)
    if not passes:
        return ""
    prompt = build.k_quant_x_passes(kernel_level, rows=build.k_quant_prompt_min_rows(kernel_level))
    prompts = f", prompts in {prompt}" if prompt != passes else ""
    return f" (the K-quants' x in {passes} int8 pass{'es' if passes > 1 else ''}{prompts})"


def auto_float_dtype() -> torch.dtype:
    """bfloat16 where the CPU has native bf16 arithmetic and its kernels run, else float32."""
    from inferpath.kernels import build

    native = any(flag in build.cpu_flags() for flag in NATIVE_BF16_FLAGS)
    return torch.bfloat16 if native and build.kernel_level(torch.bfloat16) == "avx512" else torch.float32


def plan_weights(path: str | Path, engine_config) -> WeightPlan:
    """The plan for the checkpoint at ``path`` (a GGUF file or a Hugging Face directory)
    under ``engine_config`` on this CPU (``INFERPATH_ISA`` included).

    Raises ValueError for ``quantization`` of a quantized file or with tensor parallelism."""
    from inferpath.kernels import build
    from inferpath.kernels.quantized import quantized_kernels_available

    path = Path(path)
    checkpoint, matrices = _stored_matrices(path)  # [(format, bytes, values, GGUF blocks)]
    stored_bytes: Counter = Counter()
    for fmt, nbytes, _, _ in matrices:
        stored_bytes[fmt] += nbytes
    stored = tuple(fmt for fmt, _ in stored_bytes.most_common())
    has_blocks = any(block for *_, block in matrices)
    sharded = engine_config.tensor_parallel_size > 1
    kernels = engine_config.cpu_kernels
    quantization = engine_config.quantization
    if quantization:
        if has_blocks:
            raise ValueError(f"quantization={quantization!r} quantizes float weights, and {path.name} holds "
                             f"{' + '.join(stored)} already: load it with quantization unset")
        if sharded:
            raise ValueError("quantization with tensor_parallel_size > 1 is not supported")
        from gguf import GGML_QUANT_SIZES

        from inferpath.weights.quantize import QUANTIZATION_TYPES

        qtype = QUANTIZATION_TYPES[quantization]
        block, size = GGML_QUANT_SIZES[qtype]
        act, how, runs, family, per_weight = torch.float32, QUANTIZED, (qtype.name,), "quantized", size / block
    elif engine_config.dtype != "auto":
        act = getattr(torch, engine_config.dtype)
        how = DEQUANTIZED if has_blocks else (AS_LAID_OUT if set(stored) <= {_name(act)} else CONVERTED)
        runs, family, per_weight = (_name(act),), _family(act), act.itemsize
    elif has_blocks:
        act = torch.float32
        if kernels and not sharded and quantized_kernels_available():  # blocks read in place
            how, family = AS_LAID_OUT, "quantized"
            block_formats = {fmt for fmt, *_, block in matrices if block}
            runs = tuple(dict.fromkeys(fmt if fmt in block_formats else "float32" for fmt in stored))
            per_weight = sum(b if block else 4 * v for _, b, v, block in matrices) / sum(v for _, _, v, _ in matrices)
        else:  # no kernels here, or sharded: the reference path
            how, family, runs, per_weight = DEQUANTIZED, "float32", ("float32",), 4.0
    else:
        act = auto_float_dtype() if kernels else torch.float32
        family = _family(act)
        if (act == torch.float32 and "bfloat16" in stored and kernels and not sharded
                and build.native_gemv_bf16_weights() is not None):
            how = WIDENED
            runs = tuple(dict.fromkeys(fmt if fmt == "bfloat16" else "float32" for fmt in stored))
            per_weight = sum(v * (2 if fmt == "bfloat16" else 4) for fmt, _, v, _ in matrices) / \
                max(1, sum(v for _, _, v, _ in matrices))
        else:
            how = AS_LAID_OUT if set(stored) <= {_name(act)} else CONVERTED
            runs, per_weight = (_name(act),), act.itemsize
    level = (build.kernel_level(family) if kernels and act in _KERNEL_DTYPES else None) or "PyTorch"
    kv = kv_cache_dtype(engine_config.kv_cache_dtype, act)
    return WeightPlan(checkpoint, stored, how, runs, act, kv, level, family, float(per_weight),
                      engine_config.tensor_parallel_size, quantization,
                      _repacked(how, family, level, runs, engine_config.speculative_config is not None))


def kv_cache_dtype(name: str, activation_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's dtype for ``EngineConfig.kv_cache_dtype``: "auto" the activations',
    "bfloat16" bf16 (the activations' own where they are bf16; beside float32 activations
    the attention reads it widened). Raises ValueError for a pair no path implements."""
    if name == "auto" or getattr(torch, name) == activation_dtype:
        return activation_dtype
    if (activation_dtype, name) != (torch.float32, "bfloat16"):
        raise ValueError(f"kv_cache_dtype={name!r} beside {str(activation_dtype).removeprefix('torch.')} "
                         "activations is not implemented (a bfloat16 cache goes with float32 or bfloat16 "
                         "activations)")
    return torch.bfloat16


def _repacked(how: str, family: str, level: str, runs: tuple[str, ...], speculative: bool = False) -> tuple[str, ...]:
    """The formats repacked by 8 rows at load (kernels/repacked.py): those of the allow-list
    the matrices run in, where they run through the quantized kernels at a level whose r8
    kernel is SIMD, with INFERPATH_REPACK=1 or by default at REPACK_DEFAULT_LEVELS or when
    the engine speculates (``speculative``: verification steps of k + 1 rows, where r8's
    kernels win most; module docstring); never with INFERPATH_REPACK=0 (the file's layout:
    before/after figures)."""
    from inferpath.kernels.repacked import REPACK_DEFAULT_LEVELS, REPACK_FORMATS, REPACK_LEVELS

    default = "1" if speculative or level in REPACK_DEFAULT_LEVELS else "0"
    flag = os.environ.get("INFERPATH_REPACK", default).strip()
    if flag not in ("0", "1"):
        raise ValueError(f"INFERPATH_REPACK={flag!r}: use 1 (repack "
                         f"{'/'.join(REPACK_FORMATS)} by 8 rows; the default at "
                         f"{', '.join(REPACK_DEFAULT_LEVELS)}) or 0 (off)")
    if flag == "0" or how not in (AS_LAID_OUT, QUANTIZED) or family != "quantized" or level not in REPACK_LEVELS:
        return ()
    return tuple(fmt for fmt in runs if fmt in REPACK_FORMATS)


_KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # activations the native kernels take


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _family(dtype: torch.dtype) -> str:
    return _name(dtype) if dtype in _KERNEL_DTYPES else "float32"


def _stored_matrices(path: Path) -> tuple[str, list[tuple[str, int, int, bool]]]:
    """("gguf" or "safetensors", [(format, bytes, values, in a GGUF block format the
    quantized kernels read)] of each matrix (2-D tensor)), from the index alone. Float
    formats are named as torch dtypes ("bfloat16"), GGUF blocks by type name ("Q4_1")."""
    if path.is_dir():
        matrices = []
        for file in sorted(path.glob("*.safetensors")):
            with open(file, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
            for name, entry in header.items():
                if name == "__metadata__" or len(entry["shape"]) != 2:
                    continue
                start, end = entry["data_offsets"]
                fmt = _FLOAT_NAMES.get(entry["dtype"], entry["dtype"])
                matrices.append((fmt, end - start, entry["shape"][0] * entry["shape"][1], False))
        return "safetensors", matrices
    from inferpath.weights.gguf_arch import GGUF_ARCHITECTURES
    from inferpath.weights.gguf_index import read_gguf_index
    from inferpath.weights.quantized import QUANTIZED_TYPES

    index = read_gguf_index(path)
    entry = GGUF_ARCHITECTURES.get(index.field("general.architecture"))
    # stacked experts in blocks count too where the reader keeps them per expert (gpt-oss's MXFP4)
    stacked = entry is not None and entry.regroup is not None
    return "gguf", [(_FLOAT_NAMES.get(t.qtype.name, t.qtype.name), t.nbytes, t.num_elements, t.qtype in QUANTIZED_TYPES)
                    for t in index.tensors
                    if len(t.shape) == 2 or (stacked and len(t.shape) == 3 and t.qtype in QUANTIZED_TYPES)]
