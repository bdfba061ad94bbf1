"""A ModelConfig from a GGUF file's header, without dequantizing any tensor.

The cost model needs shapes only. The weights package's reader memory-maps the file and
parses the header; no tensor data is touched until a tensor is read, which we never do.
"""

from __future__ import annotations

from pathlib import Path

from inferpath.config import ModelConfig


def gguf_model_config(path: Path) -> ModelConfig:
    from inferpath.weights.gguf import config_from_gguf, open_gguf

    return config_from_gguf(open_gguf(path), path)
