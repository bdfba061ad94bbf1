"""The BPE merge paths agree with each other and with ``tokenizers``: the native loop
(tokenizer/native.py) against the Python loop it implements, ``encode_batch`` (any number
of threads) against ``tokenizers``' ``encode_batch`` per document of the multilingual
corpus, and a pathological single pre-token of 100,000+ symbols (O(n log n) heap work)."""

from __future__ import annotations

import heapq
import os
import random

import pytest

os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizer_fixtures import first_difference, model_gguf, qwen2_reference, read_corpus, smollm2_reference

from inferpath.tokenizer import load_tokenizer
from inferpath.tokenizer import bpe as bpe_module
from inferpath.tokenizer.bpe import BytePairEncoder

MODELS = {"smollm2": ("smollm2-135m-instruct", smollm2_reference),
          "qwen2.5": ("qwen2.5-coder-0.5b-instruct", qwen2_reference)}


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request):
    alias, reference = MODELS[request.param]
    path = model_gguf(alias)
    return load_tokenizer(path), reference(path)


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return [d for d in read_corpus().split("\n\n") if d.strip()]


def test_native_merge_is_built_and_equals_the_python_loop(pair, documents):
    ours, _ = pair
    encoder = ours.encoder
    assert encoder._native is not None, "the native merge did not build (is gcc installed?)"
    python_only = BytePairEncoder(encoder.vocab, encoder.merge_ranks, encoder.ignore_merges,
                                  native_enabled=False)
    encoder.cache.clear()
    for document in documents[::3]:
        pieces = ours.pre_tokenizer.split(document)
        assert encoder.encode_pieces(pieces) == python_only.encode_pieces(pieces)


@pytest.mark.parametrize("num_threads", [1, 3])
def test_encode_batch_equals_tokenizers_encode_batch(pair, documents, num_threads):
    ours, reference = pair
    ours.encoder.cache.clear()  # cold
    ids = ours.encode_batch(documents, add_bos=False, num_threads=num_threads)
    expected = [e.ids for e in reference.encode_batch(documents, add_special_tokens=False)]
    assert len(ids) == len(expected) == len(documents)
    for i, (got, want) in enumerate(zip(ids, expected)):
        assert got == want, f"document {i}: {first_difference(got, want)}"
    with pytest.raises(ValueError, match="num_threads"):
        ours.encode_batch(documents, num_threads=0)


def test_one_huge_pre_token_is_n_log_n_and_exact(pair, monkeypatch):
    """A 150,000-letter "word" (one pre-token): the heap path pushes O(n) entries, so the
    merge is O(n log n); the ids equal tokenizers'."""
    ours, reference = pair
    pushes = []
    real_push = heapq.heappush
    monkeypatch.setattr(bpe_module.heapq, "heappush", lambda heap, item: (pushes.append(1), real_push(heap, item)))
    rng = random.Random(0)
    word = "".join(rng.choice("etaoinshrdlu") for _ in range(150_000))
    ours.encoder.cache.clear()
    ids = ours.encode(word, add_bos=False)
    assert ids == reference.encode(word, add_special_tokens=False).ids
    assert 0 < len(pushes) <= 2 * len(word)  # at most two new pairs per merge
