"""Each matmul stage's weights as they run: format, shape, and the call that reads them.

The cost model prices a stage at the rate of the kernel that runs it (probe_kernels.py),
so it must know, per stage, which format each layer's matrix runs in (a Q4_K_M file mixes
Q4_K and Q6_K within one stage: ``v_proj`` and ``down_proj`` are Q6_K in some layers) and
how large the call that reads it is (Q, K and V are one fused call on the CPU kernels:
kernels/fused.py). Two sources give the same answer (tests compare them):

- ``formats_of_model``: the modules of a loaded model (what the engine runs);
- ``formats_of_plan``: a GGUF file's tensor index under its weight plan
  (engine/weight_plan.py: blocks kept as laid out, floats in the activations' dtype),
  without loading anything: what ``explain`` uses for a file.

A ``MatrixRun`` is ``count`` layers' matrices of one (format, rows, cols, call rows);
formats are GGUF type names ("Q4_K", "Q8_0", "F32", "BF16").

Invariant: a stage's runs hold every value of its matrices once (values = rows x cols x
count, summed), whatever their call grouping.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import torch

# fused groups (kernels/fused.py): one call reads these matrices of a layer
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_DTYPE_FORMATS = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_GGUF_STAGES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
                "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
_MODULE_STAGES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class MatrixRun:
    """``count`` matrices (rows, cols) in ``format``, each read by a call of ``call_rows``
    output rows (rows itself, or the fused group's sum)."""

    format: str
    rows: int
    cols: int
    call_rows: int
    count: int

    @property
    def values(self) -> int:
        return self.rows * self.cols * self.count


StageFormats = tuple[tuple[str, tuple[MatrixRun, ...]], ...]  # ((stage, runs), ...), hashable


def bytes_per_value(fmt: str) -> float:
    """Bytes a value of ``fmt`` takes: 4 for F32, 2 for BF16/F16, the block size for GGUF
    block formats (Q4_K: 144 / 256)."""
    if fmt == "F32":
        return 4.0
    if fmt in ("BF16", "F16"):
        return 2.0
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    except KeyError:
        raise ValueError(f"weight format {fmt!r} is not a GGUF type name (F32, BF16, Q4_K, ...)") from None
    return size / block


def _collect(entries: list[tuple[str, str, int, int]]) -> StageFormats:
    """[(stage, format, rows, cols)] per matrix -> StageFormats; call rows of the GROUPS summed
    per layer occurrence (same position in each member's list)."""
    by_stage: dict[str, list[tuple[str, int, int]]] = {}
    for stage, fmt, rows, cols in entries:
        by_stage.setdefault(stage, []).append((fmt, rows, cols))
    calls: dict[str, list[int]] = {s: [r for _, r, _ in m] for s, m in by_stage.items()}
    for group in GROUPS:
        members = [by_stage.get(s) for s in group]
        if all(members) and len({len(m) for m in members}) == 1:
            sums = [sum(m[i][1] for m in members) for i in range(len(members[0]))]
            for s in group:
                calls[s] = sums
    out = []
    for stage, matrices in by_stage.items():
        counted = Counter((fmt, rows, cols, call) for (fmt, rows, cols), call in zip(matrices, calls[stage]))
        out.append((stage, tuple(MatrixRun(f, r, c, call, n) for (f, r, c, call), n in sorted(counted.items()))))
    return tuple(sorted(out))


def _module_format(module) -> tuple[str, int, int] | None:
    qweight = getattr(module, "qweight", None)
    if qweight is not None:
        return qweight.type_name, *qweight.shape
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return _DTYPE_FORMATS.get(weight.dtype, str(weight.dtype)), *weight.shape
    return None


def formats_of_model(model, config) -> StageFormats:
    """The formats of a loaded Transformer's layer matrices and LM head, as its modules hold
    them (QuantLinear blocks, float weights by dtype); experts held as 3-D tensors are left
    out (priced at the plan's mean bytes)."""
    prefix = "dense_" if config.is_moe else ""
    entries = []
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in _MODULE_STAGES and ".experts." not in name and "shared_expert" not in name:
            found = _module_format(module)
            if found:
                stage = prefix + last if last in ("gate_proj", "up_proj", "down_proj") else last
                entries.append((stage, *found))
    head = _module_format(model.lm_head) if getattr(model, "lm_head", None) is not None else None
    if head:
        entries.append(("lm_head", *head))
    return _collect(entries)


def formats_of_plan(path, plan, config) -> StageFormats:
    """The same from a GGUF file's index and its plan: blocks that run as laid out keep their
    type, every other matrix runs in the activations' dtype; an absent ``output.weight``
    means the head is the embedding table (tied)."""
    from inferpath.weights.gguf_index import read_gguf_index
    from inferpath.weights.quantized import QUANTIZED_TYPES

    act = _DTYPE_FORMATS[plan.activation_dtype]
    prefix = "dense_" if config.is_moe else ""
    entries, embedding = [], None
    for t in read_gguf_index(path).tensors:
        if len(t.shape) != 2:
            continue
        fmt = t.qtype.name if plan.keep_quantized and t.qtype in QUANTIZED_TYPES else act
        rows, cols = t.shape  # as PyTorch shows it (gguf_index.TensorInfo)
        match = re.fullmatch(r"blk\.\d+\.(\w+)\.weight", t.name)
        if match and match.group(1) in _GGUF_STAGES:
            stage = _GGUF_STAGES[match.group(1)]
            entries.append((prefix + stage if stage in ("gate_proj", "up_proj", "down_proj") else stage, fmt, rows, cols))
        elif t.name == "output.weight":
            entries.append(("lm_head", fmt, rows, cols))
        elif t.name == "token_embd.weight":
            embedding = (fmt, rows, cols)
    if embedding and not any(stage == "lm_head" for stage, *_ in entries):
        entries.append(("lm_head", *embedding))
    return _collect(entries)
