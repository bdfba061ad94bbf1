"""Which GGUF metadata keys inferpath reads or knows to be harmless; any other is refused.

A GGUF file describes its model in metadata (``{arch}.attention.head_count``, ...). A key
the loader does not read may change the math (``{arch}.attn_logit_softcapping``,
``{arch}.rope.dimension_count`` smaller than the head, ...), and loading the file anyway
would answer wrong in silence. So every key must be listed here: read by the config
(weights/gguf.py) or the tokenizer (tokenizer/load.py), or known not to change the
logits (``general.*`` bookkeeping), and some must also have a value we implement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferpath.weights.errors import WeightsError
from inferpath.weights.gguf_arch import GGUF_ARCHITECTURES

# "{arch}." keys the config reads (gguf.config_from_gguf)
ARCH_KEYS = frozenset({
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.layer_norm_rms_epsilon", "attention.sliding_window",
    "rope.freq_base", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "vocab_size", "expert_count", "expert_used_count",
    "expert_feed_forward_length",
})
# keys the tokenizer loader reads (tokenizer/load.py), or that name tokens it need not know
TOKENIZER_KEYS = frozenset({
    "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.separator_token_id",
    "tokenizer.ggml.mask_token_id", "tokenizer.ggml.cls_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
    "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
    "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.fim_pad_token_id",
    "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
    "tokenizer.ggml.scores", "tokenizer.ggml.add_sep_token",
})
# Bookkeeping prefixes: file layout, provenance, licence, quantization bookkeeping
HARMLESS_PREFIXES = ("GGUF.", "general.", "tokenizer.chat_template.", "quantize.")


def check_metadata_keys(metadata: dict[str, Any], arch: str, path: Path) -> None:
    """Raise WeightsError naming the first key neither read nor harmless, or a value we
    do not implement (``metadata``: key -> value, as ``GGUFIndex.metadata``); ``arch``'s
    own keys (gguf_arch.py) are read too."""
    entry = GGUF_ARCHITECTURES.get(arch)
    own_keys = entry.keys if entry is not None else frozenset()
    for key in metadata:
        if key.startswith(HARMLESS_PREFIXES) or key in TOKENIZER_KEYS:
            continue
        if key.startswith(f"{arch}.") and key[len(arch) + 1:] in ARCH_KEYS | own_keys:
            continue
        raise WeightsError(
            f"{path}: GGUF metadata key {key!r} is not implemented by inferpath and may change "
            "the model's math; refusing rather than answering wrong"
        )

    value = metadata.get

    if value("tokenizer.ggml.add_sep_token"):
        raise WeightsError(f"{path}: tokenizer.ggml.add_sep_token = true (a BERT-style separator "
                           "after the text) is not implemented")
    if value("tokenizer.ggml.add_space_prefix") and value("tokenizer.ggml.model") != "llama":
        raise WeightsError(f"{path}: tokenizer.ggml.add_space_prefix = true is not implemented "
                           "for byte-level BPE")
    head_dim = value(f"{arch}.attention.key_length")
    if head_dim is None:
        heads, hidden = value(f"{arch}.attention.head_count"), value(f"{arch}.embedding_length")
        head_dim = hidden // heads if heads and hidden else None
    for key in (f"{arch}.rope.dimension_count", f"{arch}.attention.value_length"):
        found = value(key)
        if found is not None and head_dim is not None and int(found) != int(head_dim):
            raise WeightsError(f"{path}: GGUF metadata {key} = {found} differs from the head "
                               f"dimension {head_dim}; partial rotary / unequal K and V heads "
                               "are not implemented")
