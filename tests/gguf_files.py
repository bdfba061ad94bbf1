"""GGUF files the tests make from the packaged models (test helpers, not tests)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

# llama.cpp's general.file_type of a conversion storing its matrices in each float type
FILE_TYPES = {gguf.GGMLQuantizationType.BF16: 32, gguf.GGMLQuantizationType.F16: 1}


def write_float_gguf(source: Path, path: Path, stored=gguf.GGMLQuantizationType.BF16) -> Path:
    """``source`` with every matrix stored as ``stored`` (BF16 or F16: its values
    dequantized by the gguf package, then rounded) and every vector as F32, as llama.cpp's
    conversions lay a file out; metadata copied (file type: ``stored``'s). ~3 s for
    SmolLM2-135M."""
    dtype = {gguf.GGMLQuantizationType.BF16: torch.bfloat16, gguf.GGMLQuantizationType.F16: torch.float16}[stored]
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            writer.add_key_value(key, FILE_TYPES[stored], gguf.GGUFValueType.UINT32)
            continue
        kind = gguf.GGUFValueType(int(field.types[0]))
        sub = gguf.GGUFValueType(int(field.types[-1])) if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        values = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())
        if values.ndim == 2:  # vectors (norms) stay F32, as llama.cpp writes them
            raw = values.to(dtype).view(torch.int16).numpy().view(np.uint8)
            writer.add_tensor(tensor.name, raw, raw_shape=raw.shape, raw_dtype=stored)
        else:
            writer.add_tensor(tensor.name, values.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
