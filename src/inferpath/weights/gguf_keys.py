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

#: "{arch}." keys the config reads (gguf.config_from_gguf), with the type each must have
ARCH_KEY_TYPES = {
    "block_count": "integer", "context_length": "integer", "embedding_length": "integer",
    "feed_forward_length": "integer", "attention.head_count": "integer",
    "attention.head_count_kv": "integer or integers",  # a per-layer list in some files
    "attention.key_length": "integer", "attention.value_length": "integer",
    "attention.layer_norm_rms_epsilon": "number", "attention.sliding_window": "integer",
    "rope.freq_base": "number", "rope.dimension_count": "integer", "rope.scaling.type": "string",
    "rope.scaling.factor": "number", "rope.scaling.original_context_length": "integer",
    "vocab_size": "integer", "expert_count": "integer", "expert_used_count": "integer",
    "expert_feed_forward_length": "integer",
}
ARCH_KEYS = frozenset(ARCH_KEY_TYPES)
_TOKEN_ID_KEYS = ("bos", "eos", "eot", "eom", "padding", "unknown", "seperator", "separator",
                  "mask", "cls", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")
#: keys the tokenizer loader reads (tokenizer/load.py), or that name tokens it need not
#: know, with their types
TOKENIZER_KEY_TYPES = {
    "tokenizer.ggml.model": "string", "tokenizer.ggml.tokens": "strings",
    "tokenizer.ggml.merges": "strings", "tokenizer.ggml.token_type": "integers",
    "tokenizer.ggml.pre": "string", "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_eos_token": "bool", "tokenizer.ggml.add_space_prefix": "bool",
    "tokenizer.chat_template": "string", "tokenizer.ggml.scores": "numbers",
    "tokenizer.ggml.add_sep_token": "bool",
    **{f"tokenizer.ggml.{name}_token_id": "integer" for name in _TOKEN_ID_KEYS},
}
TOKENIZER_KEYS = frozenset(TOKENIZER_KEY_TYPES)
#: bookkeeping keys a loader reads too (general.alignment is checked by gguf_check)
GENERAL_KEY_TYPES = {"general.architecture": "string", "general.name": "string"}
# Bookkeeping prefixes: file layout, provenance, licence, quantization bookkeeping
HARMLESS_PREFIXES = ("GGUF.", "general.", "tokenizer.chat_template.", "quantize.")


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_KIND_CHECKS = {
    "integer": _is_integer,
    "number": lambda v: _is_integer(v) or isinstance(v, float),
    "bool": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "integers": lambda v: isinstance(v, list) and all(_is_integer(x) for x in v),
    "numbers": lambda v: isinstance(v, list) and all(_is_integer(x) or isinstance(x, float) for x in v),
}
_KIND_CHECKS["integer or integers"] = lambda v: _is_integer(v) or _KIND_CHECKS["integers"](v)
_KIND_NAMES = {"integer": "an integer", "number": "a number", "bool": "a bool",
               "string": "a string", "strings": "an array of strings",
               "integers": "an array of integers", "numbers": "an array of numbers",
               "integer or integers": "an integer or an array of integers (one per layer)"}


def _describe(value: Any) -> str:
    if isinstance(value, list):
        kinds = sorted({type(x).__name__ for x in value})
        return f"an array of {len(value)} ({', '.join(kinds) or 'empty'})"
    shown = repr(value)
    return f"{shown if len(shown) <= 40 else shown[:37] + '...'} (a {type(value).__name__})"


def check_metadata_types(metadata: dict[str, Any], path: Path) -> None:
    """Raise WeightsError naming the first key a loader reads whose value is not of the
    type it needs (a GGUF value's own type: a string where an id belongs, an integer where
    the tokens belong...), before any loader uses it."""
    arch = metadata.get("general.architecture")
    expected = {**GENERAL_KEY_TYPES, **TOKENIZER_KEY_TYPES}
    if isinstance(arch, str):
        expected.update({f"{arch}.{key}": kind for key, kind in ARCH_KEY_TYPES.items()})
    for key, kind in expected.items():
        if key in metadata and not _KIND_CHECKS[kind](metadata[key]):
            raise WeightsError(f"{path}: GGUF metadata {key} is {_describe(metadata[key])}; "
                               f"expected: {_KIND_NAMES[kind]}")


def check_metadata_keys(metadata: dict[str, Any], arch: str, path: Path) -> None:
    """Raise WeightsError naming the first key neither read nor harmless, a value of the
    wrong type, or a value we do not implement (``metadata``: key -> value, as
    ``GGUFIndex.metadata``); ``arch``'s own keys (gguf_arch.py) are read too."""
    check_metadata_types(metadata, path)
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
        if entry is not None and entry.own_head_dims:  # read (and checked) by the entry's config_fields
            break
        found = value(key)
        if found is not None and head_dim is not None and int(found) != int(head_dim):
            raise WeightsError(f"{path}: GGUF metadata {key} = {found} differs from the head "
                               f"dimension {head_dim}; partial rotary / unequal K and V heads "
                               "are not implemented")
