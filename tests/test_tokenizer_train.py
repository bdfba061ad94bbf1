"""BPE training: a worked example, determinism, tokenizer.json that Hugging Face ``tokenizers``
loads with the same ids as ours on held-out text; the ``tokenize`` / ``tokenizer train`` CLI."""

from __future__ import annotations

import argparse
import os

import pytest

os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizer_fixtures import read_corpus

from inferpath.cli import tokenize as tokenize_cli
from inferpath.tokenizer import load_tokenizer
from inferpath.tokenizer.train import learn_merges, save_tokenizer_json, train_bpe

A, B, C, D = (ord(c) for c in "abcd")


def main(argv: list[str]) -> int:
    """``inferpath ARGV`` with only our subcommands registered (the other modules of the
    CLI are not this test's business)."""
    parser = argparse.ArgumentParser(prog="inferpath")
    tokenize_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_worked_example_merges_most_frequent_pair_first():
    # "aaabdaaabac": pair counts aa 4, ab 2, ...; then (a, b) beats (aa, a) on the bytes tie-break
    token_bytes, merges = learn_merges({"aaabdaaabac": 1}, num_merges=10)
    assert merges == [(A, A), (A, B), (256, 257)]
    assert token_bytes[256:] == [b"aa", b"ab", b"aaab"]  # stops: no pair occurs twice


def test_word_frequencies_count():
    _, merges = learn_merges({"cd": 5, "ab": 3, "abab": 1}, num_merges=2)
    assert merges == [
        (A, B),
        (C, D),
    ]  # ab: 3 + 2 = 5 beats cd: 5 on the bytes tie-break


@pytest.fixture(scope="module")
def split_corpus():
    text = read_corpus()
    cut = len(text) // 2
    return text[:cut], text[cut:]


@pytest.mark.parametrize("pattern", ["gpt2", "llama3", "smollm"])
def test_trained_tokenizer_json_equals_tokenizers(tmp_path, split_corpus, pattern):
    from tokenizers import Tokenizer as Reference

    train_text, held_out = split_corpus
    ours = train_bpe(train_text, 800, pattern, ["<|endoftext|>"])
    assert ours.vocab_size == 800
    path = save_tokenizer_json(ours, tmp_path)
    reference = Reference.from_file(str(path))
    ids = ours.encode(held_out)
    assert ids == reference.encode(held_out, add_special_tokens=False).ids
    assert ours.decode(ids) == held_out
    reloaded = load_tokenizer(path)
    assert reloaded.encode(held_out) == ids
    text = "x<|endoftext|>y"
    assert (
        reloaded.encode(text, allow_special=True)
        == reference.encode(text, add_special_tokens=False).ids
    )
    assert len(ids) < 0.9 * len(
        held_out.encode("utf-8")
    )  # the merges compress (mostly non-English half)


def test_training_is_deterministic(split_corpus):
    text = split_corpus[0][:30_000]
    first, second = train_bpe(text, 400), train_bpe(text, 400)
    assert first.encoder.merge_ranks == second.encoder.merge_ranks
    with pytest.raises(ValueError, match="vocab_size 200 is below the minimum 256"):
        train_bpe(text, 200)


def test_cli_train_and_tokenize(tmp_path, capsys, split_corpus):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(split_corpus[0][:30_000], encoding="utf-8")
    out = tmp_path / "tok"
    assert (
        main(
            [
                "tokenizer",
                "train",
                str(corpus),
                "--vocab-size",
                "300",
                "--out",
                str(out),
                "--pattern",
                "llama3",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert main(["tokenize", "What is a quadratic equation?", "--model", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    ours = load_tokenizer(out)
    ids = ours.encode("What is a quadratic equation?")
    assert [int(line.split()[0]) for line in lines[:-1]] == ids
    assert any(
        line.split()[1].startswith("␣") for line in lines[:-1]
    )  # the leading space is visible
    assert lines[-1] == f"{len(ids)} tokens, 29 characters, 29 bytes"
    assert main(["tokenize", "--model", str(out), "--stats", str(corpus)]) == 0
    stats = capsys.readouterr().out
    assert "tokens per word" in stats and "per byte" in stats


def test_cli_tokenize_default_model_splits_pieces(capsys):
    assert main(["tokenize", "What is a quadratic equation? 2024"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pieces = [line.split(maxsplit=1)[1] for line in lines[:-1]]
    assert pieces[:2] == ["What", "␣is"]
    assert pieces[-4:] == ["2", "0", "2", "4"]  # SmolLM2 splits digits one by one
