"""Checkpoint: everything the engine needs from a model file, whatever its format.

``load_checkpoint`` reads a ``.gguf`` file or a Hugging Face directory and returns the
tensors under Hugging Face names, the ModelConfig, the EOS ids and where the tokenizer
lives. Both formats go through the same check against ``expected_shapes``, so the model
never sees a missing tensor or a wrong shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from inferpath.config import ModelConfig
from inferpath.weights.errors import WeightsError
from inferpath.weights.gguf import read_gguf
from inferpath.weights.names import expected_shapes, gguf_name, is_ignorable
from inferpath.weights.quantized import QuantizedTensor
from inferpath.weights.safetensors import read_hf_dir

GGUF_MAGIC = b"GGUF"


@dataclass
class Checkpoint:
    """A loaded model: config, tensors (Hugging Face names, compute dtype, or
    ``QuantizedTensor`` where kept quantized), EOS ids.

    Invariant: ``tensors`` holds exactly ``expected_shapes(config)``, with those shapes.
    ``tokenizer_path`` is what ``load_tokenizer`` takes: the GGUF file itself (its
    metadata holds the vocabulary), or the model directory.
    """

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    eos_token_ids: list[int]
    path: Path
    tokenizer_path: Path

    @property
    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    @property
    def quantized_tensors(self) -> dict[str, QuantizedTensor]:
        """The tensors kept in a GGUF block format (``load_checkpoint(keep_quantized=True)``)."""
        return {name: t for name, t in self.tensors.items() if isinstance(t, QuantizedTensor)}


def load_checkpoint(path: str | Path, dtype: torch.dtype | str = torch.float32,
                    progress: bool = False, keep_quantized: bool = False, keep_bf16: bool = False) -> Checkpoint:
    """Load a ``.gguf`` file or a Hugging Face model directory (see module docstring).

    ``progress`` shows a tqdm bar (on stderr) while tensors are read. ``keep_quantized``
    leaves a GGUF's block-quantized weights as ``QuantizedTensor`` (weights/quantized.py)
    instead of dequantizing them to ``dtype``. ``keep_bf16`` leaves matrices stored in
    bfloat16 as they are (a BF16 GGUF's: views of the mapped file), every other tensor in
    ``dtype``.
    Raises WeightsError (a ValueError) naming the file, and the tensor and expected shape
    where one is missing or wrong; FileNotFoundError if ``path`` does not exist.
    """
    path = Path(path).expanduser()
    dtype = _torch_dtype(dtype)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model file or directory")
    if path.is_file() and (path.suffix == ".safetensors" or path.name == "config.json"):
        path = path.parent  # a file inside a Hugging Face directory: load the directory
    if path.is_dir():
        config, tensors, eos = read_hf_dir(path, dtype, progress, keep_bf16)
        tokenizer_path = path
    elif _is_gguf(path):
        config, tensors, eos = read_gguf(path, dtype, progress, keep_quantized, keep_bf16)
        tokenizer_path = path
    else:
        raise WeightsError(
            f"{path}: neither a GGUF file (no 'GGUF' magic) nor a Hugging Face model directory"
        )
    check_shapes(tensors, config, path, is_gguf=not path.is_dir())
    return Checkpoint(config=config, tensors=tensors, eos_token_ids=eos,
                      path=path, tokenizer_path=tokenizer_path)


def check_shapes(tensors: dict[str, torch.Tensor], config: ModelConfig, path: Path,
                 is_gguf: bool = False) -> None:
    """Raise WeightsError for the first missing, wrongly shaped or unused tensor.

    A tensor the model would not consume (a bias the config does not enable, say) is an
    error: skipping it would run a different model than the file holds. The only extras
    dropped are those the model recomputes or shares (``is_ignorable``).
    """
    from inferpath.weights.gguf_stacked import expert_blocks

    shapes = expected_shapes(config)
    blocks, covered = expert_blocks(tensors, shapes, path)  # gpt-oss's experts kept as blocks, checked there
    shapes = {name: shape for name, shape in shapes.items() if name not in covered}
    unused = sorted(name for name in tensors
                    if name not in shapes and name not in blocks and not is_ignorable(name, config))
    if unused:
        where = f" (GGUF tensor {gguf_name(unused[0])!r})" if is_gguf else ""
        raise WeightsError(f"{path}: tensor {unused[0]!r}{where} is not used by a {config.architecture} "
                           f"model with this config, and {len(unused) - 1} more; refusing rather than "
                           "running a different model than the file holds")
    for name, shape in shapes.items():
        where = f" (GGUF tensor {gguf_name(name)!r})" if is_gguf else ""
        if name not in tensors:
            raise WeightsError(f"{path}: missing tensor {name!r}{where}, expected shape {shape}")
        if tuple(tensors[name].shape) != shape:
            raise WeightsError(f"{path}: tensor {name!r}{where} has shape "
                               f"{tuple(tensors[name].shape)}, expected {shape}")
    for name in set(tensors) - set(shapes) - blocks:  # a tied lm_head stored anyway, RoPE buffers
        del tensors[name]


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        magic = f.read(4)
    if path.suffix == ".gguf" and magic != GGUF_MAGIC:
        raise WeightsError(f"{path}: starts with {magic!r}, not the GGUF magic {GGUF_MAGIC!r}; "
                           "the file is corrupt or not a GGUF file")
    return magic == GGUF_MAGIC


def _torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype or its name, got {dtype!r}")
    return resolved
