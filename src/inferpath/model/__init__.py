"""model: the decoder-only transformer, its layers, and paged attention.

Public API: ``Transformer``, ``build_model``, ``WeightLoadError``, ``AttentionMetadata``.
"""

from inferpath.model.metadata import AttentionMetadata
from inferpath.model.transformer import Transformer, WeightLoadError, build_model

__all__ = ["AttentionMetadata", "Transformer", "WeightLoadError", "build_model"]
