"""Property tests (hypothesis): round trips on arbitrary Unicode, agreement with Hugging Face
``tokenizers`` on arbitrary text, and the incremental detokenizer used for streaming."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizer_fixtures import model_gguf, read_corpus, smollm2_reference

from inferpath.tokenizer import load_tokenizer
from inferpath.tokenizer.pretokenize import DIGITS_PATTERN, GPT2_PATTERN, PreTokenizer
from inferpath.tokenizer.train import train_bpe

PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# Text without U+FFFD, so a U+FFFD in the output can only come from a broken character.
clean_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\ufffd"),
    max_size=80,
)
# Mixes that stress byte-level BPE: emoji, CJK, combining marks, whitespace runs, digits.
tricky_text = st.lists(
    st.sampled_from(
        [
            "é",
            "e\u0301",
            "😊",
            "👩🏽\u200d💻",
            "東京",
            "한국어",
            "مرحبا",
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "123456",
            "'s",
            "DON'T",
            "<|im_end|>",
            "a",
            "Hello",
            "\u3000",
            "\xa0",
        ]
    ),
    max_size=30,
).map("".join)


@pytest.fixture(scope="session")
def smollm2_path():
    return model_gguf("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def qwen():
    # Qwen2.5's vocabulary holds all 256 bytes (SmolLM2's lacks 0xF5..0xFF and drops them,
    # as the references do), so every string round-trips.
    return load_tokenizer(model_gguf("qwen2.5-coder-0.5b-instruct"))


@pytest.fixture(scope="session")
def reference_ids(smollm2_path):
    reference = smollm2_reference(smollm2_path)
    return lambda text: reference.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="session")
def trained():
    return train_bpe(read_corpus()[:40_000], 600, "llama3", ["<|end|>"])


@PROPERTY_SETTINGS
@given(text=st.one_of(st.text(max_size=80), tricky_text))
def test_round_trip_arbitrary_unicode(qwen, trained, text):
    for tokenizer in (qwen, trained):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert all(0 <= i < tokenizer.vocab_size for i in ids)


# Assigned characters only (per this Python's Unicode tables): the `regex` module knows newer
# Unicode versions than the reference's regex engine, so a letter assigned in Unicode 17 is
# \p{L} to us and unknown to it. That is a table-version difference, not a tokenizer one.
assigned_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cn")), max_size=80
)


@pytest.mark.parametrize("text", ['"\x06{', 'a\x01b', '"\x06\x07{', '\x06', 'x\x06\x06y', '"\xf5{'])
def test_a_byte_missing_from_the_vocabulary_is_dropped_before_the_merges(smollm2, reference_ids, text):
    """SmolLM2's vocabulary lacks some bytes (0x06, 0xF5...): the reference drops such a
    character while it builds the word, so its neighbours meet and may merge ('"\x06{' is
    the one token '"{'); hypothesis found the first of these."""
    assert smollm2.encode(text, allow_special=True) == reference_ids(text)


@PROPERTY_SETTINGS
@given(text=st.one_of(assigned_text, tricky_text))
def test_ids_equal_tokenizers_on_arbitrary_text(smollm2, reference_ids, text):
    # the reference always matches special tokens; bytes SmolLM2 lacks are dropped by both
    assert smollm2.encode(text, allow_special=True) == reference_ids(text)


@PROPERTY_SETTINGS
@given(text=st.one_of(clean_text, tricky_text))
def test_fused_digit_pattern_equals_two_passes(text):
    # SmolLM2's digits-then-GPT-2 split runs as one regex; it must equal the two passes
    patterns = (DIGITS_PATTERN, GPT2_PATTERN)
    assert PreTokenizer(patterns).split(text) == PreTokenizer(
        patterns, fuse=False
    ).split(text)


def _stream(tokenizer, ids, skip_special_tokens):
    detokenizer = tokenizer.detokenizer(skip_special_tokens=skip_special_tokens)
    deltas = []
    for token_id in ids:
        deltas.append(detokenizer.add(token_id))
        assert (
            detokenizer.num_pending_bytes <= 3
        )  # at most one incomplete character held back
    deltas.append(detokenizer.flush())
    assert detokenizer.num_pending_bytes == 0
    return deltas


@PROPERTY_SETTINGS
@given(text=st.one_of(clean_text, tricky_text), skip=st.booleans())
def test_detokenizer_deltas_concatenate_to_decode(qwen, text, skip):
    ids = qwen.encode(text, allow_special=True)
    deltas = _stream(qwen, ids, skip)
    assert "".join(deltas) == qwen.decode(ids, skip_special_tokens=skip)
    assert not any(
        "\ufffd" in delta for delta in deltas
    )  # split characters never show as U+FFFD


@PROPERTY_SETTINGS
@given(ids=st.lists(st.integers(0, 49_151), max_size=40), skip=st.booleans())
def test_detokenizer_on_arbitrary_ids(smollm2, ids, skip):
    # arbitrary ids can form invalid UTF-8: the stream still equals decode(), U+FFFD included
    assert "".join(_stream(smollm2, ids, skip)) == smollm2.decode(
        ids, skip_special_tokens=skip
    )


def test_split_characters_arrive_whole(smollm2):
    text = "数学 😊 👩🏽\u200d💻"
    ids = smollm2.encode(text)
    pieces = [smollm2.token_bytes(i) for i in ids]
    assert any(_is_incomplete(p) for p in pieces), (
        "the example must split a character across tokens"
    )
    detokenizer = smollm2.detokenizer()
    emitted = ""
    for token_id in ids:
        delta = detokenizer.add(token_id)
        emitted += delta
        assert "\ufffd" not in delta
        assert text.startswith(emitted)
    assert emitted + detokenizer.flush() == text


def test_incomplete_tail_becomes_replacement_at_flush(smollm2):
    ids = smollm2.encode("数")
    partial = [i for i in smollm2.encode("学")][:1]  # first bytes of a 3-byte character
    assert _is_incomplete(smollm2.token_bytes(partial[0]))
    deltas = _stream(smollm2, ids + partial, skip_special_tokens=True)
    assert deltas[-1] == "\ufffd" and "".join(deltas) == "数\ufffd" == smollm2.decode(
        ids + partial
    )


def _is_incomplete(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
