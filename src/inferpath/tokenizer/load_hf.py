"""Build a Tokenizer from a Hugging Face ``tokenizer.json`` (and the files next to it).

Supported: a ``BPE`` model (``ignore_merges`` honoured) made byte-level by a ``ByteLevel``
pre-tokenizer or decoder; pre-tokenizers ``ByteLevel``, ``Split`` (regex or string,
``Isolated``), ``Digits`` and ``Sequence`` of them; normalizers ``NFC``/``NFKC``/``NFD``/
``NFKD``; added tokens with their ``special`` flag; a ``TemplateProcessing`` post-processor
that prepends BOS. Anything else raises ModelFileError (a ValueError) naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import regex

from inferpath.errors import ModelFileError
from inferpath.tokenizer.bpe import BytePairEncoder
from inferpath.tokenizer.load import end_of_turn_ids
from inferpath.tokenizer.pretokenize import DIGITS_PATTERN, GPT2_PATTERN, PreTokenizer
from inferpath.tokenizer.tokenizer import AddedToken, Tokenizer

_NORMALIZERS = ("NFC", "NFKC", "NFD", "NFKD")
#: Token ids must be below this (the largest real vocabularies hold ~256k tokens): the
#: token table is a list indexed by id, so an id of 10^9 must not size it.
MAX_TOKEN_ID = 2**21
_BOS_GUESSES = ("<|begin_of_text|>", "<s>", "<|im_start|>")
_EOS_GUESSES = ("<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "</s>")


def _fail(path: Path, field: str, value, supported: str) -> ModelFileError:
    return ModelFileError(f"{path}: {field} is {value!r}; supported: {supported}")


def _pre_tokenizer(spec: dict | None, path: Path) -> tuple[list[str], bool, bool]:
    """(patterns, add_prefix_space, has_byte_level) of a pre_tokenizer spec."""
    if spec is None:
        return [], False, False
    kind = spec.get("type")
    if kind == "Sequence":
        patterns, prefix, byte_level = [], False, False
        for sub in spec.get("pretokenizers", []):
            sub_patterns, sub_prefix, sub_byte_level = _pre_tokenizer(sub, path)
            if sub_prefix and patterns:
                # NOTE: there Hugging Face adds the space to every piece, not to the text
                raise _fail(
                    path,
                    "pre_tokenizer ByteLevel.add_prefix_space",
                    True,
                    "add_prefix_space only on a ByteLevel that comes first",
                )
            patterns += sub_patterns
            prefix |= sub_prefix
            byte_level |= sub_byte_level
        return patterns, prefix, byte_level
    if kind == "ByteLevel":
        patterns = [GPT2_PATTERN] if spec.get("use_regex", True) else []
        return patterns, bool(spec.get("add_prefix_space", False)), True
    if kind == "Digits":
        return (
            [DIGITS_PATTERN if spec.get("individual_digits", False) else r"\p{N}+"],
            False,
            False,
        )
    if kind == "Split":
        if spec.get("behavior") != "Isolated" or spec.get("invert", False):
            raise _fail(
                path,
                "pre_tokenizer Split behavior/invert",
                (spec.get("behavior"), spec.get("invert")),
                "Isolated, invert=false",
            )
        pattern = spec.get("pattern", {})
        if "Regex" in pattern:
            return [pattern["Regex"]], False, False
        if "String" in pattern:
            return [regex.escape(pattern["String"])], False, False
        raise _fail(
            path,
            "pre_tokenizer Split pattern",
            pattern,
            "{'Regex': ...} or {'String': ...}",
        )
    raise _fail(path, "pre_tokenizer.type", kind, "ByteLevel, Split, Digits, Sequence")


def _normalizer(spec: dict | None, path: Path) -> str | None:
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        forms = [_normalizer(sub, path) for sub in spec.get("normalizers", [])]
        forms = [f for f in forms if f is not None]
        if len(forms) > 1:
            raise _fail(
                path, "normalizer", forms, "at most one Unicode normalization form"
            )
        return forms[0] if forms else None
    if kind in _NORMALIZERS:
        return kind
    raise _fail(path, "normalizer.type", kind, ", ".join(_NORMALIZERS))


def _merge_ranks(merges: list, path: Path) -> dict[tuple[str, str], int]:
    ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(merges):
        if isinstance(merge, str):
            left, sep, right = merge.partition(" ")
            pair = (left, right) if sep else None
        else:
            pair = tuple(merge) if len(merge) == 2 else None
        if pair is None:
            raise _fail(
                path,
                f"model.merges[{rank}]",
                merge,
                "'left right' strings or [left, right] pairs",
            )
        ranks.setdefault(pair, rank)
    return ranks


def _bos_from_post_processor(spec: dict | None) -> tuple[bool, str | None]:
    """(adds BOS, BOS text) from a TemplateProcessing post-processor."""
    if not spec:
        return False, None
    if spec.get("type") == "Sequence":
        for sub in spec.get("processors", []):
            adds, text = _bos_from_post_processor(sub)
            if adds:
                return adds, text
        return False, None
    if spec.get("type") == "TemplateProcessing":
        first = (spec.get("single") or [{}])[0]
        if "SpecialToken" in first:
            return True, first["SpecialToken"]["id"]
    return False, None


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _check_id(path: Path, field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_TOKEN_ID:
        raise _fail(path, field, value, f"an integer id in [0, {MAX_TOKEN_ID})")
    return value


def _check_types(spec, path: Path) -> None:
    """The fields read below have the JSON types they must have (ids in range)."""
    if not isinstance(spec, dict):
        raise _fail(path, "the top level", type(spec).__name__, "a JSON object")
    for name in ("model", "pre_tokenizer", "normalizer", "decoder", "post_processor"):
        if spec.get(name) is not None and not isinstance(spec[name], dict):
            raise _fail(path, name, type(spec[name]).__name__, "a JSON object or null")
    model = spec.get("model") or {}
    if model.get("type", "BPE") != "BPE":
        raise _fail(path, "model.type", model.get("type"), "BPE (byte-level)")
    vocab = model.get("vocab")
    if vocab is not None and not isinstance(vocab, dict):
        raise _fail(path, "model.vocab", type(vocab).__name__, "a token -> id object")
    for piece, token_id in (vocab or {}).items():
        _check_id(path, f"model.vocab[{piece!r}]", token_id)
    merges = model.get("merges")
    if merges is not None and not isinstance(merges, list):
        raise _fail(path, "model.merges", type(merges).__name__, "a list")
    for rank, merge in enumerate(merges or []):
        if not (isinstance(merge, str) or (isinstance(merge, list)
                                           and all(isinstance(m, str) for m in merge))):
            raise _fail(path, f"model.merges[{rank}]", merge,
                        "'left right' strings or [left, right] pairs")
    added = spec.get("added_tokens")
    if added is not None and not isinstance(added, list):
        raise _fail(path, "added_tokens", type(added).__name__, "a list")
    for i, token in enumerate(added or []):
        if not isinstance(token, dict) or not isinstance(token.get("content"), str):
            raise _fail(path, f"added_tokens[{i}]", token, 'an object with a string "content"')
        _check_id(path, f"added_tokens[{i}].id", token.get("id"))


def load_tokenizer_json(
    path: str | Path,
    config: dict | None = None,
    chat_template: str | None = None,
    extra_eos_ids: list[int] = (),
) -> Tokenizer:
    """A Tokenizer from tokenizer.json; ``config`` is tokenizer_config.json's content if any.

    Every malformed file raises ModelFileError naming it: fields of the wrong JSON type,
    ids outside [0, MAX_TOKEN_ID), text that is not UTF-8, JSON nested too deep.
    """
    path = Path(path)
    try:
        return _load_tokenizer_json(path, config or {}, chat_template, extra_eos_ids)
    except ModelFileError:
        raise
    except (TypeError, KeyError, AttributeError, IndexError, ValueError, RecursionError) as exc:
        # NOTE: a guard behind the checks above, for shapes deeper than they look
        raise ModelFileError(f"{path}: malformed tokenizer file ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from None


def _load_tokenizer_json(path: Path, config: dict, chat_template: str | None,
                         extra_eos_ids) -> Tokenizer:
    if not isinstance(config, dict):
        raise _fail(path, "tokenizer_config.json", type(config).__name__, "a JSON object")
    spec = _read_json(path, required=True)
    _check_types(spec, path)
    model = spec.get("model") or {}
    if model.get("type", "BPE") != "BPE":
        raise _fail(path, "model.type", model.get("type"), "BPE (byte-level)")
    for field in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(field):
            raise _fail(path, f"model.{field}", model[field], "null")
    patterns, add_prefix_space, byte_level = _pre_tokenizer(
        spec.get("pre_tokenizer"), path
    )
    decoder_type = (spec.get("decoder") or {}).get("type")
    if not byte_level and decoder_type != "ByteLevel":
        raise _fail(
            path,
            "pre_tokenizer/decoder",
            decoder_type,
            "a ByteLevel pre-tokenizer or decoder (byte-level BPE)",
        )
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    if not vocab:
        raise _fail(path, "model.vocab", "empty", "a non-empty token -> id map")
    added = [
        AddedToken(t["content"], int(t["id"]), bool(t.get("special", False)))
        for t in spec.get("added_tokens") or []
    ]
    vocab_size = max(max(vocab.values()), max((t.id for t in added), default=-1)) + 1
    pieces = [""] * vocab_size
    for piece, token_id in vocab.items():
        pieces[token_id] = piece
    for token in added:
        pieces[token.id] = token.content
        vocab.pop(token.content, None)
    by_content = {t.content: t.id for t in added} | {
        p: i for p, i in vocab.items() if p in _BOS_GUESSES + _EOS_GUESSES
    }
    adds_bos, bos_text = _bos_from_post_processor(spec.get("post_processor"))
    bos_text = (
        _token_text(config.get("bos_token"))
        or bos_text
        or next((t for t in _BOS_GUESSES if t in by_content), None)
    )
    eos_text = _token_text(config.get("eos_token")) or next(
        (t for t in _EOS_GUESSES if t in by_content), None
    )
    bos_id, eos_id = by_content.get(bos_text), by_content.get(eos_text)
    return Tokenizer(
        pieces=pieces,
        encoder=BytePairEncoder(
            vocab,
            _merge_ranks(model.get("merges") or [], path),
            bool(model.get("ignore_merges")),
        ),
        pre_tokenizer=PreTokenizer(patterns, add_prefix_space),
        added_tokens=added,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        eos_token_ids=end_of_turn_ids(added, eos_id) | frozenset(extra_eos_ids),
        add_bos_token=bool(config.get("add_bos_token", adds_bos)),
        add_eos_token=bool(config.get("add_eos_token", False)),
        pad_token_id=by_content.get(_token_text(config.get("pad_token"))),
        chat_template=chat_template,
        normalizer=_normalizer(spec.get("normalizer"), path),
        name=path.parent.name,
    )


def load_hf_directory(directory: str | Path) -> Tokenizer:
    """A Tokenizer from a directory with tokenizer.json and optional tokenizer_config.json,
    chat_template.jinja and generation_config.json (its eos_token_id adds stop ids)."""
    directory = Path(directory)
    tokenizer_json = directory / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise FileNotFoundError(
            f"{directory} has no tokenizer.json (only byte-level BPE tokenizer.json is supported)"
        )
    try:
        return _load_hf_directory(directory, tokenizer_json)
    except ModelFileError:
        raise
    except (TypeError, KeyError, AttributeError, IndexError, ValueError, RecursionError) as exc:
        raise ModelFileError(f"{directory}: malformed tokenizer files ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from None


def _load_hf_directory(directory: Path, tokenizer_json: Path) -> Tokenizer:
    config = _read_json(directory / "tokenizer_config.json")
    if not isinstance(config, dict):
        raise _fail(directory / "tokenizer_config.json", "the top level", type(config).__name__,
                    "a JSON object")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next(
            (t["template"] for t in template if t.get("name") == "default"), None
        )
    if (directory / "chat_template.jinja").is_file():
        try:
            template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFileError(f"{directory / 'chat_template.jinja'} is not UTF-8 text "
                                 f"({exc.reason} at byte {exc.start})") from None
    if template is not None and not isinstance(template, str):
        raise _fail(directory / "tokenizer_config.json", "chat_template", type(template).__name__,
                    "a string, or a list of {name, template} objects")
    generation = _read_json(directory / "generation_config.json")
    eos = generation.get("eos_token_id") if isinstance(generation, dict) else None
    extra_eos = [eos] if isinstance(eos, int) else list(eos or [])
    for i, token_id in enumerate(extra_eos):
        _check_id(directory / "generation_config.json", f"eos_token_id[{i}]", token_id)
    return load_tokenizer_json(tokenizer_json, config, template, extra_eos)


def _read_json(path: Path, required: bool = False):
    if not required and not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ModelFileError(f"{path}: JSON nested too deep to be a tokenizer file") from None
