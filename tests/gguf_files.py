"""GGUF files the tests make from the packaged models (test helpers, not tests)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

MOSTLY_BF16 = 32  # llama.cpp's general.file_type of a BF16 conversion


def write_bf16_gguf(source: Path, path: Path) -> Path:
    """``source`` with every matrix stored as BF16 (its values dequantized by the gguf
    package, rounded to bfloat16) and every vector as F32, as llama.cpp's BF16 conversion
    lays a file out; metadata copied (file type: BF16). ~3 s for SmolLM2-135M."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            writer.add_key_value(key, MOSTLY_BF16, gguf.GGUFValueType.UINT32)
            continue
        kind = gguf.GGUFValueType(int(field.types[0]))
        sub = gguf.GGUFValueType(int(field.types[-1])) if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        values = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())
        if values.ndim == 2:
            raw = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint8)
            writer.add_tensor(tensor.name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(tensor.name, values.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
