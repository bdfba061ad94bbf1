"""Hugging Face model directories: config.json + safetensors (one file or sharded).

Tensors are read through ``safetensors.safe_open`` (memory-mapped; a header of shapes and
offsets, then raw bytes), so nothing is unpickled: a directory holding only
``pytorch_model.bin`` is refused rather than loaded with ``torch.load``. Shapes are
checked from the headers before any tensor data is read.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from inferpath.config import ConfigError, ModelConfig, require_engine_support
from inferpath.weights.errors import WeightsError
from inferpath.weights.names import checkpoint_shapes, is_ignorable, rotate_half_rows, split_fused

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def read_hf_dir(path: Path, dtype: torch.dtype, progress: bool = False, keep_bf16: bool = False
                ) -> tuple[ModelConfig, dict[str, torch.Tensor], list[int]]:
    """Config, tensors in ``dtype`` (exactly those the model needs), and EOS ids of a dir;
    with ``keep_bf16``, matrices stored in bfloat16 stay bfloat16.

    Tensors the model recomputes or shares (a tied ``lm_head.weight`` saved anyway, RoPE
    ``inv_freq`` buffers) are not read; any other tensor it does not use is an error.
    """
    config_path = path / "config.json"
    if not config_path.is_file():
        raise WeightsError(f"{path}: no config.json; a Hugging Face model directory needs one")
    hf_config = _read_json(config_path)
    try:
        config = ModelConfig.from_hf_config(hf_config, name=path.name)
        require_engine_support(config)  # explain may price architectures the engine cannot run
    except ConfigError as exc:
        raise WeightsError(f"{config_path}: {exc}") from None

    weight_map = _weight_map(path)  # tensor name -> shard file
    shapes = checkpoint_shapes(config)  # as stored: Phi-3's projections fused
    unused = sorted(n for n in weight_map if n not in shapes and not is_ignorable(n, config))
    if unused:
        raise WeightsError(
            f"{path}: tensor {unused[0]!r} (in {weight_map[unused[0]].name}) is not used by a "
            f"{config.architecture} model with this config.json, and {len(unused) - 1} more; "
            "refusing rather than running a different model than the file holds"
        )
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name, shape in shapes.items():
        if name not in weight_map:
            files = sorted({f.name for f in weight_map.values()})
            raise WeightsError(
                f"{path}: missing tensor {name!r} (expected shape {shape}) in {', '.join(files)}"
            )
        by_file[weight_map[name]].append(name)

    tensors: dict[str, torch.Tensor] = {}
    bar = tqdm(total=len(shapes), desc=f"loading {path.name}", unit="tensor", disable=not progress)
    for file, names in by_file.items():
        if not file.is_file():
            raise WeightsError(f"{path}: {INDEX_FILE} names shard {file.name} for tensor "
                               f"{names[0]!r}, but the file is not there")
        try:
            with safe_open(file, framework="pt") as shard:
                for name in names:
                    found = tuple(shard.get_slice(name).get_shape())
                    if found != shapes[name]:
                        raise WeightsError(f"{file}: tensor {name!r} has shape {found}, "
                                           f"expected {shapes[name]} from config.json")
                    tensor = shard.get_tensor(name)
                    keep = keep_bf16 and tensor.dtype == torch.bfloat16 and tensor.dim() == 2
                    tensors[name] = tensor if keep else tensor.to(dtype)
                    bar.update()
        except (SafetensorError, OSError) as exc:
            raise WeightsError(f"{file}: not a readable safetensors file ({exc}); "
                               "it may be truncated or corrupt") from None
    bar.close()
    return config, rotate_half_rows(split_fused(tensors, config), config), _eos_token_ids(path, hf_config)


def _weight_map(path: Path) -> dict[str, Path]:
    index = path / INDEX_FILE
    if index.is_file():
        data = _read_json(index)
        if not isinstance(data.get("weight_map"), dict):
            raise WeightsError(f"{index}: no 'weight_map' object")
        return {name: path / file for name, file in data["weight_map"].items()}
    single = path / SINGLE_FILE
    if single.is_file():
        try:
            with safe_open(single, framework="pt") as f:
                return {name: single for name in f.keys()}
        except (SafetensorError, OSError) as exc:
            raise WeightsError(f"{single}: not a readable safetensors file ({exc}); "
                               "it may be truncated or corrupt") from None
    pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
    if pickled:
        raise WeightsError(
            f"{path}: only pickled weights ({', '.join(pickled)}); inferpath never unpickles "
            "(it can run code). Convert them to safetensors first"
        )
    raise WeightsError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE}")


def _eos_token_ids(path: Path, hf_config: dict[str, Any]) -> list[int]:
    """EOS ids from generation_config.json (int or list), then config.json, deduplicated."""
    sources = [hf_config]
    generation = path / "generation_config.json"
    if generation.is_file():
        sources.insert(0, _read_json(generation))
    ids: list[int] = []
    for source in sources:
        value = source.get("eos_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is not None and int(token_id) not in ids:
                ids.append(int(token_id))
    return ids


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    return data
