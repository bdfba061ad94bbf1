"""Weights: GGUF and safetensors readers → tensors named as in Hugging Face.

``load_checkpoint(path, dtype, progress)`` returns a ``Checkpoint`` (config, tensors,
EOS ids, tokenizer path); every failure is a ``WeightsError`` naming the file.
"""

from inferpath.weights.checkpoint import Checkpoint, check_shapes, load_checkpoint
from inferpath.weights.errors import WeightsError
from inferpath.weights.names import expected_shapes

__all__ = ["Checkpoint", "WeightsError", "check_shapes", "expected_shapes", "load_checkpoint"]
