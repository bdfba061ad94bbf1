"""Our byte-level BPE against the references: llama.cpp's vocab test vectors and Hugging Face
``tokenizers`` on a 300 KB multilingual corpus; loaders' attributes and errors."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizer_fixtures import (
    LLAMA_CPP_VOCABS,
    first_difference,
    llama3_dir,
    llama_cpp_vocab_dir,
    model_gguf,
    qwen2_reference,
    read_corpus,
    read_vocab_tests,
    smollm2_reference,
)

from inferpath.tokenizer import Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def corpus() -> str:
    text = read_corpus()
    assert len(text.encode("utf-8")) >= 200_000
    return text


@pytest.fixture(scope="session")
def vocab_dir():
    return llama_cpp_vocab_dir()


@pytest.fixture(scope="session")
def llama3():
    return llama3_dir()


@pytest.fixture(scope="session")
def llama3_json(llama3) -> Tokenizer:
    return load_tokenizer(llama3 / "tokenizer.json")


@pytest.fixture(scope="session")
def smollm2_path():
    return model_gguf("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen25_path():
    return model_gguf("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def smollm2(smollm2_path) -> Tokenizer:
    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def trained_json(tmp_path_factory, corpus):
    from inferpath.tokenizer.train import save_tokenizer_json, train_bpe

    return save_tokenizer_json(
        train_bpe(corpus[:20_000], 400, "gpt2", ["<|end|>"]),
        tmp_path_factory.mktemp("trained"),
    )


# ---- llama.cpp's vectors ------------------------------------------------------------------
@pytest.mark.parametrize("name", LLAMA_CPP_VOCABS)
def test_llama_cpp_vocab_vectors(vocab_dir, name):
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    tokenizer = load_tokenizer(path)
    cases = read_vocab_tests(path)
    assert len(cases) >= 40
    failures = [
        (text, first_difference(tokenizer.encode(text, add_bos=False), ids))
        for text, ids in cases
        if tokenizer.encode(text, add_bos=False) != ids
    ]
    assert not failures, failures[:3]
    # NOTE: a SentencePiece vocabulary with add_space_prefix (llama-spm) decodes the prefix
    # space it encoded; llama.cpp drops it when detokenizing a whole text
    prefix = " " if getattr(tokenizer.encoder, "add_space_prefix", False) else ""
    for text, ids in cases:
        assert tokenizer.decode(ids) == (prefix + text if text else text)


def test_gguf_attributes(vocab_dir, smollm2):
    llama = load_tokenizer(vocab_dir / "ggml-vocab-llama-bpe.gguf")
    assert llama.vocab_size == 128_256
    assert llama.bos_token_id == 128_000 and llama.add_bos_token
    assert (
        llama.encode("Hi")[0] == 128_000
        and llama.encode("Hi", add_bos=False)[0] != 128_000
    )
    assert {128_001, 128_009} <= llama.eos_token_ids  # <|end_of_text|>, <|eot_id|>
    # SmolLM2: <|im_start|> (1) is BOS and is not added; <|im_end|> (2) ends a turn
    assert smollm2.vocab_size == 49_152
    assert smollm2.bos_token_id == 1 and not smollm2.add_bos_token
    assert smollm2.pad_token_id == 2 and not smollm2.add_eos_token
    assert 2 in smollm2.eos_token_ids and smollm2.id_to_piece(2) == "<|im_end|>"
    assert smollm2.chat_template and "<|im_start|>" in smollm2.chat_template
    assert smollm2.id_to_piece(smollm2.encode(" is")[0]) == "Ġis"
    assert smollm2.token_bytes(smollm2.encode(" is")[0]) == b" is"
    assert {0, 1, 2} <= smollm2.special_token_ids


# ---- Hugging Face tokenizers on the corpus ---------------------------------------------------
def _assert_same_as_reference(ours: Tokenizer, reference, text: str):
    ids = ours.encode(text, add_bos=False)
    reference_ids = reference.encode(text, add_special_tokens=False).ids
    assert ids == reference_ids, first_difference(ids, reference_ids)
    assert ours.decode(ids) == text
    assert reference.decode(ids, skip_special_tokens=False) == text


def test_llama3_tokenizer_json_equals_tokenizers(llama3, llama3_json, corpus):
    from tokenizers import Tokenizer as Reference

    assert llama3_json.vocab_size == 128_256
    _assert_same_as_reference(
        llama3_json, Reference.from_file(str(llama3 / "tokenizer.json")), corpus
    )


def test_llama3_tiktoken_equals_tokenizer_json(llama3, llama3_json, corpus):
    tiktoken = load_tokenizer(llama3 / "tokenizer.model")
    assert tiktoken.vocab_size == 128_256 and tiktoken.bos_token_id == 128_000
    assert tiktoken.encode("<|eot_id|>", allow_special=True, add_bos=False) == [128_009]
    assert {128_001, 128_008, 128_009} <= tiktoken.eos_token_ids
    # the seed's example: "What is a quadratic equation?" becomes seven integers (with BOS)
    seed_ids = tiktoken.encode("What is a quadratic equation?")
    assert len(seed_ids) == 7 and seed_ids[0] == 128_000
    assert tiktoken.token_bytes(seed_ids[2]) == b" is"  # the leading space is in the token
    assert tiktoken.encode(corpus, add_bos=False) == llama3_json.encode(
        corpus, add_bos=False
    )


def test_tiktoken_merge_table_is_derived_once_and_cached(llama3, corpus, tmp_path, monkeypatch):
    """The id table derived from the ranks is stored and read back (the same table), and
    the native merge loop runs on it; the string path (no table) gives the same ids."""
    import numpy as np

    from inferpath.tokenizer.bpe import BytePairEncoder

    monkeypatch.setenv("INFERPATH_CACHE", str(tmp_path))
    derived = load_tokenizer(llama3 / "tokenizer.model")
    (entry,) = (tmp_path / "tokenizer-tables").glob("tiktoken-*.npy")
    cached = load_tokenizer(llama3 / "tokenizer.model")
    assert np.array_equal(derived.encoder.id_table, cached.encoder.id_table)
    assert cached.encoder._native is not None
    entry.write_bytes(entry.read_bytes()[:-8])  # a damaged entry is derived again
    assert np.array_equal(load_tokenizer(llama3 / "tokenizer.model").encoder.id_table,
                          derived.encoder.id_table)
    string_path = BytePairEncoder(cached.encoder.vocab, None, ignore_merges=True)
    assert string_path.id_table is None
    pieces = cached.pre_tokenizer.split(corpus)
    assert string_path.encode_pieces(pieces) == cached.encoder.encode_pieces(pieces)


def test_smollm2_gguf_equals_tokenizers(smollm2_path, smollm2, corpus):
    reference = smollm2_reference(smollm2_path)
    _assert_same_as_reference(smollm2, reference, corpus)
    assert smollm2.encode("12345") == [33, 34, 35, 36, 37]  # digits one by one


def test_qwen25_gguf_equals_tokenizers(qwen25_path, corpus):
    qwen = load_tokenizer(qwen25_path)
    assert qwen.vocab_size == 151_936
    _assert_same_as_reference(qwen, qwen2_reference(qwen25_path), corpus)
    assert {151_643, 151_645} <= qwen.eos_token_ids  # <|endoftext|>, <|im_end|>


# ---- special tokens ---------------------------------------------------------------------------
def test_special_tokens_only_when_allowed(smollm2):
    text = "a<|im_end|>b"
    plain = smollm2.encode(text)
    assert 2 not in plain and smollm2.decode(plain) == text
    special = smollm2.encode(text, allow_special=True)
    assert special == smollm2.encode("a") + [2] + smollm2.encode("b")
    assert smollm2.decode(special) == text
    assert smollm2.decode(special, skip_special_tokens=True) == "ab"


def test_longest_special_token_wins(tmp_path):
    vocab = {chr(c): i for i, c in enumerate(range(ord("a"), ord("z") + 1))} | {
        "<": 26,
        ">": 27,
        "|": 28,
    }
    spec = {
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "use_regex": True,
        },
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [
            {"id": 29, "content": "<|a|>", "special": True},
            {"id": 30, "content": "<|a|>b", "special": True},
        ],
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.encode("x<|a|>bb", allow_special=True) == [23, 30, 1]
    assert tokenizer.encode("<|a|>", allow_special=True) == [29]


def test_tokenizer_json_pipeline_options_equal_tokenizers(tmp_path, trained_json):
    """Split by string (with gaps), Digits runs, ByteLevel with prefix space, NFC, non-special
    added tokens: the loader's less common paths against the reference."""
    from tokenizers import Tokenizer as Reference

    spec = json.loads(trained_json.read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "NFC"}
    splits = [
        {
            "type": "Split",
            "pattern": {"String": "--"},
            "behavior": "Isolated",
            "invert": False,
        },
        {
            "type": "Split",
            "pattern": {"Regex": "(x)(y)"},
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "Digits", "individual_digits": False},
    ]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": splits + [byte_level]}
    spec["added_tokens"].append(
        {
            "id": len(spec["model"]["vocab"]) + 1,
            "content": "[tool]",
            "special": False,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
        }
    )
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (tmp_path / "prefix.json").write_text(
        json.dumps(spec | {"pre_tokenizer": byte_level | {"add_prefix_space": True}})
    )
    for name in ("tokenizer.json", "prefix.json"):
        ours, reference = (
            load_tokenizer(tmp_path / name),
            Reference.from_file(str(tmp_path / name)),
        )
        for text in [
            "a--b----c 12345 xyxy e\u0301 caf\u00e9",
            "Hello [tool] world",
            "--",
            "   lead",
            "123abc456",
        ]:
            assert (
                ours.encode(text)
                == reference.encode(text, add_special_tokens=False).ids
            ), (name, text)
    (tmp_path / "bad.json").write_text(
        json.dumps(
            spec
            | {
                "pre_tokenizer": {
                    "type": "Sequence",
                    "pretokenizers": splits + [byte_level | {"add_prefix_space": True}],
                }
            }
        )
    )
    with pytest.raises(
        ValueError, match="add_prefix_space only on a ByteLevel that comes first"
    ):
        load_tokenizer(tmp_path / "bad.json")


# ---- errors ---------------------------------------------------------------------------------
def _write_gguf(path, **fields):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in fields.items():
        if isinstance(value, list):
            writer.add_array(key.replace("__", "."), value)
        else:
            writer.add_string(key.replace("__", "."), value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def test_unsupported_gguf_model_names_field(tmp_path):
    _write_gguf(
        tmp_path / "wordpiece.gguf",
        tokenizer__ggml__model="bert",
        tokenizer__ggml__tokens=["a"],
    )
    with pytest.raises(
        ValueError, match=r"tokenizer\.ggml\.model is 'bert'; supported: 'gpt2'"
    ):
        load_tokenizer(tmp_path / "wordpiece.gguf")
    _write_gguf(
        tmp_path / "spm.gguf",
        tokenizer__ggml__model="llama",
        tokenizer__ggml__tokens=["a"],
    )
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.scores"):
        load_tokenizer(tmp_path / "spm.gguf")
    _write_gguf(
        tmp_path / "nomerges.gguf",
        tokenizer__ggml__model="gpt2",
        tokenizer__ggml__tokens=["a"],
    )
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.merges"):
        load_tokenizer(tmp_path / "nomerges.gguf")
    _write_gguf(
        tmp_path / "pre.gguf",
        tokenizer__ggml__model="gpt2",
        tokenizer__ggml__tokens=["a"],
        tokenizer__ggml__merges=["a a"],
        tokenizer__ggml__pre="mystery",
    )
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre.*'mystery'.*supported"):
        load_tokenizer(tmp_path / "pre.gguf")


def test_malformed_files_name_the_problem(tmp_path):
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "Unigram", "vocab": []}})
    )
    with pytest.raises(ValueError, match=r"model\.type is 'Unigram'; supported: BPE"):
        load_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "ranks.model").write_text("not-base64!! 0\n")
    with pytest.raises(ValueError, match=r"line 1 is not '<base64 token> <rank>'"):
        load_tokenizer(tmp_path / "ranks.model")
    (tmp_path / "truncated.gguf").write_bytes(
        b"GGUF\x03\x00\x00\x00" + b"\x00" * 8 + b"\x05"
    )
    with pytest.raises(ValueError, match="truncated"):
        load_tokenizer(tmp_path / "truncated.gguf")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing.gguf")


def test_out_of_range_ids_raise(smollm2):
    with pytest.raises(ValueError, match="49152"):
        smollm2.decode([1, 49_152])
    with pytest.raises(ValueError, match="-1"):
        smollm2.decode([5, -1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smollm2.token_bytes(-1)
