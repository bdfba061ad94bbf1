"""Build a Tokenizer from a file: GGUF metadata, a Hugging Face tokenizer.json, or tiktoken ranks.

``load_tokenizer(path)`` decides by what the path is:

- a ``.gguf`` file (or any file starting with ``b"GGUF"``): ``tokenizer.ggml.*`` metadata;
- a directory holding ``tokenizer.json`` (plus optional ``tokenizer_config.json``,
  ``chat_template.jinja``, ``generation_config.json``), or a ``tokenizer.json`` file;
- a tiktoken rank file (lines ``<base64 bytes> <rank>``), e.g. Llama-3's ``tokenizer.model``.

Every loader ends in the same ``Tokenizer``; only byte-level BPE is supported.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from pathlib import Path

import numpy as np

from inferpath.errors import ModelFileError
from inferpath.tokenizer.bpe import BytePairEncoder, bytes_to_piece
from inferpath.tokenizer.merges import MergeRanks
from inferpath.tokenizer.spm import SentencePieceEncoder, spm_token_bytes
from inferpath.tokenizer.pretokenize import LLAMA3_PATTERN, PreTokenizer, patterns_for
from inferpath.tokenizer.tokenizer import AddedToken, Tokenizer

# Texts of tokens that end a turn or a document, in the vocabularies we know. A model stops
# on any of them that its vocabulary marks special (llama.cpp does the same).
END_OF_TURN_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|end|>",
    "<end_of_turn>",
    "</s>",
)

# GGUF token types (llama.cpp): 3 = control (special), 4 = user defined (always split).
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4

# Llama-3's special tokens follow its 128,000 tiktoken ranks (llama-models' tokenizer.py).
_LLAMA3_NUM_BASE_TOKENS = 128_000
_LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(2, 2 + 256 - 12)]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A Tokenizer from a GGUF file, a tokenizer.json (file or directory) or a tiktoken rank file."""
    path = Path(path)
    if path.is_dir():
        from inferpath.tokenizer.load_hf import load_hf_directory

        return load_hf_directory(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no tokenizer at {path} (expected a .gguf, tokenizer.json, directory or tiktoken file)"
        )
    with open(path, "rb") as file:
        head = file.read(4)
    if head == b"GGUF":
        return load_gguf(path)
    if path.suffix == ".json" or head.lstrip()[:1] == b"{":
        from inferpath.tokenizer.load_hf import load_tokenizer_json

        return load_tokenizer_json(path)
    return load_tiktoken(path)


def end_of_turn_ids(
    added_tokens: list[AddedToken], eos_id: int | None
) -> frozenset[int]:
    """The primary EOS plus every special token whose text ends a turn."""
    ids = {t.id for t in added_tokens if t.special and t.content in END_OF_TURN_TOKENS}
    if eos_id is not None:
        ids.add(eos_id)
    return frozenset(ids)


def _require(metadata: dict, key: str, path: Path):
    if key not in metadata:
        raise ModelFileError(
            f"GGUF file {path} has no {key!r}; a byte-level BPE tokenizer needs it"
        )
    return metadata[key]


def load_gguf(path: str | Path) -> Tokenizer:
    """A Tokenizer from GGUF metadata (``tokenizer.ggml.model`` must be ``gpt2``), read
    through the file's index: checked, cached, and shared with the weights' loader."""
    from inferpath.weights.gguf_index import read_gguf_index
    from inferpath.weights.gguf_keys import check_metadata_types

    path = Path(path)
    index = read_gguf_index(path)
    metadata = index.metadata
    check_metadata_types(metadata, path)  # every key read below has the type it needs
    model = _require(metadata, "tokenizer.ggml.model", path)
    if model == "llama":
        return _load_gguf_sentencepiece(metadata, path)
    if model != "gpt2":
        raise ModelFileError(
            f"GGUF file {path}: tokenizer.ggml.model is {model!r}; supported: 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece BPE); WordPiece ('bert') and others are not"
        )
    pieces = list(_require(metadata, "tokenizer.ggml.tokens", path))
    merges = _require(metadata, "tokenizer.ggml.merges", path)
    token_types = metadata.get("tokenizer.ggml.token_type") or [1] * len(pieces)
    if len(token_types) != len(pieces):
        raise ModelFileError(
            f"GGUF file {path}: tokenizer.ggml.token_type has {len(token_types)} entries, "
            f"tokenizer.ggml.tokens has {len(pieces)}"
        )
    pre = metadata.get("tokenizer.ggml.pre", "gpt-2")
    try:
        patterns = patterns_for(pre)
    except ValueError as exc:
        raise ModelFileError(f"GGUF file {path}: tokenizer.ggml.pre: {exc}") from None
    added = [
        AddedToken(piece, i, special=(kind == _GGUF_CONTROL))
        for i, (piece, kind) in enumerate(zip(pieces, token_types))
        if kind in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
    ]
    vocab = {
        piece: i
        for i, (piece, kind) in enumerate(zip(pieces, token_types))
        if kind not in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
    }
    for rank, merge in enumerate(merges):
        if " " not in merge:
            raise ModelFileError(
                f"GGUF file {path}: tokenizer.ggml.merges[{rank}] = {merge!r} is not 'left right'"
            )
    is_llama3 = pre in ("llama-bpe", "llama3")
    eos_id = metadata.get("tokenizer.ggml.eos_token_id")
    extra_eos = [
        metadata[k]
        for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if k in metadata
    ]
    for token_id in [metadata.get("tokenizer.ggml.bos_token_id"), eos_id, *extra_eos]:
        if token_id is not None and not 0 <= token_id < len(pieces):
            raise ModelFileError(
                f"GGUF file {path}: special token id {token_id} is outside the {len(pieces)} tokens"
            )
    return Tokenizer(
        pieces=pieces,
        encoder=_encoder_with_cached_table(index, vocab, MergeRanks(merges), is_llama3),
        pre_tokenizer=PreTokenizer(patterns),
        added_tokens=added,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos_id,
        eos_token_ids=end_of_turn_ids(added, eos_id) | frozenset(extra_eos),
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", is_llama3)),
        add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
        chat_template=metadata.get("tokenizer.chat_template"),
        name=str(metadata.get("general.name", path.stem)),
    )


def _load_gguf_sentencepiece(metadata: dict, path: Path) -> Tokenizer:
    """A SentencePiece BPE vocabulary (pieces + scores) as llama.cpp encodes it (spm.py):
    control tokens are special added tokens, user-defined ones always split out, and
    ``add_space_prefix`` defaults to true, as llama.cpp reads these files."""
    pieces = list(_require(metadata, "tokenizer.ggml.tokens", path))
    scores = [float(x) for x in _require(metadata, "tokenizer.ggml.scores", path)]
    token_types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(pieces))
    if not len(scores) == len(token_types) == len(pieces):
        raise ModelFileError(f"GGUF file {path}: tokenizer.ggml.tokens has {len(pieces)} entries, "
                             f"scores {len(scores)}, token_type {len(token_types)}; they must agree")
    if (pre := metadata.get("tokenizer.ggml.pre", "default")) != "default":
        raise ModelFileError(f"GGUF file {path}: tokenizer.ggml.pre = {pre!r} with a SentencePiece "
                             "vocabulary is not implemented (only 'default')")
    added = [AddedToken(piece, i, special=(kind == _GGUF_CONTROL))
             for i, (piece, kind) in enumerate(zip(pieces, token_types))
             if kind in (_GGUF_CONTROL, _GGUF_USER_DEFINED)]
    eos_id = metadata.get("tokenizer.ggml.eos_token_id")
    extra_eos = [metadata[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                 if k in metadata]
    for token_id in [metadata.get("tokenizer.ggml.bos_token_id"), eos_id, *extra_eos]:
        if token_id is not None and not 0 <= token_id < len(pieces):
            raise ModelFileError(f"GGUF file {path}: special token id {token_id} is outside the "
                                 f"{len(pieces)} tokens")
    return Tokenizer(
        pieces=pieces,
        encoder=SentencePieceEncoder(pieces, scores, token_types,
                                     bool(metadata.get("tokenizer.ggml.add_space_prefix", True))),
        pre_tokenizer=PreTokenizer(()),
        added_tokens=added,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos_id,
        eos_token_ids=end_of_turn_ids(added, eos_id) | frozenset(extra_eos),
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", True)),
        add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
        chat_template=metadata.get("tokenizer.chat_template"),
        name=str(metadata.get("general.name", path.stem)),
        token_bytes=spm_token_bytes(pieces, token_types),
    )


def _encoder_with_cached_table(index, vocab: dict[str, int], merges: MergeRanks,
                               ignore_merges: bool) -> BytePairEncoder:
    """The encoder, its id table read from the GGUF index cache when this file's metadata
    and this code built it before (building it is most of the load), else built and stored."""
    from inferpath.weights import gguf_index_cache

    name = f"bpe-id-table-{_id_table_version()}"
    table = gguf_index_cache.read_array(index, name)
    if table is not None and (table.dtype != np.int64 or table.ndim != 2 or table.shape[0] != 2):
        table = None
    encoder = BytePairEncoder(vocab, merges, ignore_merges=ignore_merges, id_table=table)
    if table is None and encoder.id_table is not None:
        gguf_index_cache.write_array(index, name, encoder.id_table)
    return encoder


@functools.cache
def _id_table_version() -> str:
    """Changes with the code that makes a GGUF vocabulary's id table (this file, bpe.py)."""
    from inferpath.tokenizer import bpe

    sources = Path(__file__).read_bytes() + Path(bpe.__file__).read_bytes()
    return hashlib.sha256(sources).hexdigest()[:16]


def load_tiktoken(path: str | Path) -> Tokenizer:
    """A Tokenizer from a tiktoken rank file; a 128,000-rank file gets Llama-3's special tokens."""
    from inferpath.tokenizer.tiktoken_table import cached_id_table

    path = Path(path)
    vocab: dict[str, int] = {}
    file_bytes = path.read_bytes()
    for line_number, line in enumerate(file_bytes.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token_b64, rank = line.split()
            vocab[bytes_to_piece(base64.b64decode(token_b64, validate=True))] = int(
                rank
            )
        except (ValueError, binascii.Error):
            raise ModelFileError(
                f"{path}: line {line_number} is not '<base64 token> <rank>' ({line[:60]!r}); "
                "supported tokenizer files: .gguf, tokenizer.json, tiktoken rank files"
            ) from None
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ModelFileError(
            f"{path}: tiktoken ranks must be 0..{len(vocab) - 1} without gaps or repeats"
        )
    pieces = [""] * len(vocab)
    for piece, rank in vocab.items():
        pieces[rank] = piece
    added: list[AddedToken] = []
    if len(vocab) == _LLAMA3_NUM_BASE_TOKENS:
        added = [
            AddedToken(t, len(vocab) + i, special=True)
            for i, t in enumerate(_LLAMA3_SPECIAL_TOKENS)
        ]
        pieces += _LLAMA3_SPECIAL_TOKENS
    by_content = {t.content: t.id for t in added}
    eos_id = by_content.get("<|end_of_text|>")
    return Tokenizer(
        pieces=pieces,
        encoder=BytePairEncoder(vocab, merge_ranks=None, ignore_merges=True,
                                id_table=cached_id_table(path, file_bytes, vocab)),
        pre_tokenizer=PreTokenizer((LLAMA3_PATTERN,)),
        added_tokens=added,
        bos_token_id=by_content.get("<|begin_of_text|>"),
        eos_token_id=eos_id,
        eos_token_ids=end_of_turn_ids(added, eos_id),
        add_bos_token="<|begin_of_text|>" in by_content,
        pad_token_id=by_content.get("<|finetune_right_pad_id|>"),
        name=path.stem,
    )
