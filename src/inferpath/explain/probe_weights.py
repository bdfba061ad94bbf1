"""The weights a kernel probe times (explain/probe_kernels.py, probe_layers.py): the engine's
own module for a weight format, holding random values.

Block weights are random bytes with their fp16 scale fields set to a small normal value (a
kernel's time does not depend on the values, but NaN or subnormal scales could). A format
named with ``R8`` after it (``"Q4_K_R8"``) is the file's format repacked by 8 rows
(kernels/repacked.py), as the loader repacks it; its bytes are counted at the file format's
size, as the cost model counts them (kernel_cost.py), so bytes over its rate is its time.
"""

from __future__ import annotations

R8 = "_R8"  # after a format: its matrices run repacked by 8 rows ("Q4_K_R8": kernel_cost.rate_format)
# byte offsets of each block's fp16 scale fields
_SCALE_OFFSETS = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2),
                  "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_SMALL_F16 = 0x2000  # 2 ** -7


def file_format(fmt: str) -> tuple[str, bool]:
    """(the file's format, whether it runs repacked by 8 rows) of a rate key's format:
    file_format("Q4_K_R8") == ("Q4_K", True)."""
    return (fmt.removesuffix(R8), True) if fmt.endswith(R8) else (fmt, False)


def file_bytes_per_value(fmt: str) -> float:
    """At the file format's size: a repacked matrix's bytes are counted as the cost model
    counts them (kernel_cost.py), so bytes over its rate is its time."""
    from inferpath.explain.stage_formats import bytes_per_value

    return bytes_per_value(file_format(fmt)[0])


def random_linear(fmt: str, rows: int, cols: int):
    """The engine's module for a (rows, cols) weight of ``fmt``: a ``..._R8`` format
    repacked by 8 rows (kernels/repacked.py), as the loader repacks it."""
    import torch

    if fmt in ("F32", "BF16", "F16"):
        return _float_linear(rows, cols, {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[fmt])
    from inferpath.kernels.quantized import QuantLinear
    from inferpath.kernels.repacked import repack

    base, repacked = file_format(fmt)
    blocks = random_blocks(base, rows, cols)
    return QuantLinear(repack(blocks, drop_source=False) if repacked else blocks)


def random_blocks(fmt: str, rows: int, cols: int):
    """A QuantizedTensor (rows, cols) of ``fmt`` holding random blocks with sane scales."""
    import torch
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from inferpath.weights.quantized import QuantizedTensor

    qtype = GGMLQuantizationType[fmt]
    block, size = GGML_QUANT_SIZES[qtype]
    data = torch.randint(0, 256, (rows * cols // block, size), dtype=torch.uint8)  # (blocks, block bytes)
    scale = torch.tensor([_SMALL_F16], dtype=torch.int16).view(torch.uint8)  # 2 bytes, little-endian
    for offset in _SCALE_OFFSETS[fmt]:
        data[:, offset:offset + 2] = scale
    return QuantizedTensor.from_gguf(data.numpy(), qtype, (rows, cols))


def _float_linear(rows: int, cols: int, dtype):
    import torch

    from inferpath.kernels.modules import CPULinear

    linear = CPULinear(cols, rows, bias=False, device="meta")
    linear.weight = torch.nn.Parameter(torch.randn(rows, cols).to(dtype), requires_grad=False)
    return linear.prepare()


def linear_weight_bytes(linear) -> float:
    """The weight's bytes at its file format's size (``file_bytes_per_value``)."""
    qweight = getattr(linear, "qweight", None)
    if qweight is None:
        return linear.weight.nbytes
    rows, cols = qweight.shape
    return rows * cols * file_bytes_per_value(qweight.type_name)
