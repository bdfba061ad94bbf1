"""ModelFileError: the one error a malformed model file raises; ConfigError: a bad config value.

Weights (GGUF, safetensors), tokenizer files (tokenizer.json, GGUF metadata) and chat
templates that cannot be read raise ``ModelFileError`` (or ``WeightsError``, its
subclass for weights), never a bare ``KeyError``, ``MemoryError`` or ``RecursionError``,
and they raise it before allocating memory in proportion to any count the file states
but has not been checked against its size. The message names the file, the field, the
value found and what is allowed.

``ConfigError`` names a ModelConfig (config.py) or EngineConfig (engine_config.py) value
that is missing or out of range, and what is allowed; it lives here so that both config
modules raise the one class (``inferpath.config`` re-exports it).
"""

from __future__ import annotations


class ModelFileError(ValueError):
    """A model file is malformed: the message names the file, the field and what is allowed."""


class ConfigError(ValueError):
    """A model or engine configuration value is missing or out of range."""
