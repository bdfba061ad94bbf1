"""ModelFileError: the one error a malformed model file raises.

Weights (GGUF, safetensors), tokenizer files (tokenizer.json, GGUF metadata) and chat
templates that cannot be read raise ``ModelFileError`` (or ``WeightsError``, its
subclass for weights), never a bare ``KeyError``, ``MemoryError`` or ``RecursionError``,
and they raise it before allocating memory in proportion to any count the file states
but has not been checked against its size. The message names the file, the field, the
value found and what is allowed.
"""

from __future__ import annotations


class ModelFileError(ValueError):
    """A model file is malformed: the message names the file, the field and what is allowed."""
