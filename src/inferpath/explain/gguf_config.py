"""A ModelConfig from a GGUF file's header, without dequantizing any tensor.

The cost model needs shapes only: the weights package's index of the file (its header,
read and checked once, then cached); no tensor data is read.
"""

from __future__ import annotations

from pathlib import Path

from inferpath.config import ModelConfig


def gguf_model_config(path: Path | str) -> ModelConfig:
    from inferpath.weights.gguf import config_from_gguf
    from inferpath.weights.gguf_index import read_gguf_index

    path = Path(path)  # callers pass a str too (Precision.of_gguf's)
    return config_from_gguf(read_gguf_index(path), path)
