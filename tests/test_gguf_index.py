"""The GGUF index (weights/gguf_index.py) and its on-disk cache (gguf_index_cache.py).

The checked walk gives what the ``gguf`` package's own reader gives; a load from the cache
gives the same weights, tokenizer and logits as a load that walks the file; a file
rewritten behind the cache's back (same size, same mtime) is walked again; a corrupted
entry is ignored and rewritten. The hostile-file checks are tests/test_model_files.py's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from inferpath.models import resolve_model
from inferpath.weights import gguf_check, gguf_index, gguf_index_cache
from inferpath.weights.gguf_index import read_gguf_index

PROMPT = "The lighthouse keeper found 3 bottles, each holding a message."


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty index cache of its own, and no index remembered in this process."""
    directory = tmp_path / "cache" / "gguf-index"
    monkeypatch.setattr(gguf_index_cache, "index_cache_dir", lambda: directory)
    monkeypatch.setattr(gguf_index, "_recent", type(gguf_index._recent)())
    return directory


def walks(monkeypatch) -> list[Path]:
    """Record every checked walk of a file (a cache miss)."""
    seen: list[Path] = []
    walk = gguf_check.check_gguf

    def recorded(path):
        seen.append(Path(path))
        return walk(path)

    monkeypatch.setattr(gguf_check, "check_gguf", recorded)
    return seen


def big_header_gguf(path: Path, description: str = "a" * 100_000) -> Path:
    """A small vocab-only GGUF whose header is big enough to be cached."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_description(description)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_walk_reads_what_gguf_reader_reads():
    path = resolve_model("smollm2-135m-instruct")
    index = gguf_check.check_gguf(path)
    reader = gguf.GGUFReader(path)
    assert index.metadata == {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    data = index.map_data()
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(index.tensors, reader.tensors):
        assert (ours.qtype, ours.offset, ours.nbytes) == (theirs.tensor_type, theirs.data_offset, theirs.n_bytes)
        assert ours.shape == tuple(reversed(theirs.shape.tolist()))
        mine = index.array(data, ours)
        assert mine.dtype == theirs.data.dtype and mine.shape == theirs.data.shape
        assert np.array_equal(mine, theirs.data)


def test_cache_hit_and_miss_give_identical_weights_tokenizer_and_logits(fresh_cache, monkeypatch):
    from inferpath.config import EngineConfig
    from inferpath.engine.load import build_for_engine, load_weights
    from inferpath.tokenizer import load_tokenizer

    path = resolve_model("smollm2-135m-instruct")
    seen = walks(monkeypatch)
    config = EngineConfig(threads=1)

    def load():
        checkpoint, plan = load_weights(path, config)
        tokenizer = load_tokenizer(path)
        ids = tokenizer.encode(PROMPT)
        return checkpoint, ids, forward_logits(build_for_engine(checkpoint, plan, config), ids)

    missed = load()
    assert seen == [path] and len(list(fresh_cache.glob("*.json"))) == 1  # walked once, for both readers
    monkeypatch.setattr(gguf_index, "_recent", type(gguf_index._recent)())  # a new process
    hit = load()
    assert seen == [path]  # not walked again
    assert missed[0].config == hit[0].config and missed[0].eos_token_ids == hit[0].eos_token_ids
    assert missed[0].tensors.keys() == hit[0].tensors.keys()
    for name, tensor in missed[0].tensors.items():
        other = hit[0].tensors[name]
        assert torch.equal(getattr(tensor, "data", tensor), getattr(other, "data", other)), name
    assert missed[1] == hit[1]
    assert torch.equal(missed[2], hit[2])


def forward_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits of every position of one sequence: (len(ids), vocab)."""
    from inferpath.cache.kv import KVCache
    from inferpath.model import AttentionMetadata

    n, num_blocks = len(ids), (len(ids) + 15) // 16
    cache = KVCache(model.config, num_blocks, 16, torch.float32)
    meta = AttentionMetadata(slot_mapping=torch.arange(n), query_start_loc=torch.tensor([0, n]),
                             seq_lens=torch.tensor([n]), block_tables=torch.arange(num_blocks)[None, :],
                             query_lens=[n], seq_lens_list=[n], block_size=16)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(n), cache, meta))


@pytest.mark.parametrize("forget_process", [False, True])
def test_a_file_rewritten_with_the_same_size_and_mtime_is_read_again(tmp_path, fresh_cache, monkeypatch,
                                                                      forget_process):
    path = big_header_gguf(tmp_path / "vocab.gguf")
    assert read_gguf_index(path).field("general.description") == "a" * 100_000
    assert len(list(fresh_cache.glob("*.json"))) == 1
    stat = path.stat()
    big_header_gguf(path, "b" * 100_000)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    if forget_process:  # the on-disk entry is the stale one
        monkeypatch.setattr(gguf_index, "_recent", type(gguf_index._recent)())
    seen = walks(monkeypatch)
    assert read_gguf_index(path).field("general.description") == "b" * 100_000
    assert seen == [path]


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "not json", "empty", "other format",
                                    "tensor out of the file"])
def test_a_damaged_cache_entry_is_ignored_and_rewritten(tmp_path, fresh_cache, monkeypatch, damage):
    path = resolve_model("smollm2-135m-instruct")
    expected = read_gguf_index(path)
    (entry,) = fresh_cache.glob("*.json")
    raw = entry.read_bytes()
    digest, _, payload = raw.partition(b"\n")
    if damage == "flip a byte":  # inside a token string: still valid JSON
        at = payload.index(b'"tokenizer.ggml.tokens"') + 1000
        raw = digest + b"\n" + payload[:at] + bytes([payload[at] ^ 1]) + payload[at + 1:]
    elif damage == "truncate":
        raw = raw[:len(raw) // 2]
    elif damage == "not json":
        raw = b"\x00" * 100
    elif damage == "empty":
        raw = b""
    else:  # well-formed entries (a valid digest) that must still be refused
        import hashlib
        import json

        document = json.loads(payload)
        if damage == "other format":
            document["format"] = "an older inferpath"
        else:
            document["index"]["tensors"][0][3] = expected.file_size  # offset past the end
        payload = json.dumps(document).encode()
        raw = hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    entry.write_bytes(raw)
    monkeypatch.setattr(gguf_index, "_recent", type(gguf_index._recent)())
    seen = walks(monkeypatch)
    got = read_gguf_index(path)
    assert seen == [path]  # the entry was not used: the file was walked
    assert got == expected
    assert gguf_index_cache.read(os.path.realpath(path), expected.file_size) == expected  # rewritten


def test_small_headers_are_not_cached_and_entries_are_bounded(tmp_path, fresh_cache, monkeypatch):
    from test_model_files import write_tiny_gguf

    read_gguf_index(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert not fresh_cache.exists() or not list(fresh_cache.glob("*.json"))
    monkeypatch.setattr(gguf_index_cache, "MAX_ENTRIES", 2)
    for i in range(3):
        read_gguf_index(big_header_gguf(tmp_path / f"vocab{i}.gguf"))
    assert len(list(fresh_cache.glob("*.json"))) == 2


def test_an_unwritable_cache_only_costs_the_walk(tmp_path, fresh_cache, monkeypatch):
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_text("a file where the cache directory should be")
    path = big_header_gguf(tmp_path / "vocab.gguf")
    assert read_gguf_index(path).field("general.description") == "a" * 100_000
    shutil.rmtree(fresh_cache.parent)


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "wrong shape"])
def test_a_damaged_tokenizer_table_is_ignored_and_rebuilt(fresh_cache, monkeypatch, damage):
    """The vocabulary's id table (tokenizer/load.py) is cached beside the index; a damaged
    one is rebuilt, never used."""
    import hashlib
    import io

    from inferpath.tokenizer import load_tokenizer

    path = resolve_model("smollm2-135m-instruct")
    expected = load_tokenizer(path).encode(PROMPT)
    (table,) = fresh_cache.glob("*.npy")
    raw = table.read_bytes()
    if damage == "flip a byte":
        raw = raw[:-100] + bytes([raw[-100] ^ 1]) + raw[-99:]
    elif damage == "truncate":
        raw = raw[:len(raw) // 2]
    else:  # intact, a valid digest, but not a (2, n) table
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(6, dtype=np.int64))
        raw = hashlib.sha256(buffer.getvalue()).digest() + buffer.getvalue()
    table.write_bytes(raw)
    monkeypatch.setattr(gguf_index, "_recent", type(gguf_index._recent)())
    assert load_tokenizer(path).encode(PROMPT) == expected
    assert table.read_bytes()[32:].startswith(b"\x93NUMPY") and len(table.read_bytes()) > len(raw) // 2
    reloaded = load_tokenizer(path)
    assert reloaded.encode(PROMPT) == expected and reloaded.encoder.id_table.shape[0] == 2


def test_long_words_take_the_string_path_on_the_lazily_built_merge_ranks():
    """Words over SHORT_WORD symbols merge by (left, right) strings: the GGUF loader's
    MergeRanks builds that dict on first use, and the ids stay Hugging Face's."""
    from tokenizer_fixtures import smollm2_reference

    from inferpath.tokenizer import load_tokenizer
    from inferpath.tokenizer.merges import MergeRanks

    path = resolve_model("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    ranks = tokenizer.encoder.merge_ranks
    assert isinstance(ranks, MergeRanks) and ranks._ranks is None  # encoding runs on ids
    text = "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3 + " " + "=" * 300 + " ok"
    assert tokenizer.encode(text, add_bos=False) == smollm2_reference(path).encode(text).ids
    assert ranks._ranks is not None
    eager: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(ranks.merges):
        eager.setdefault(tuple(merge.split(" ", 1)), rank)
    assert dict(ranks) == eager


def test_a_file_too_big_to_map_copy_on_write_loads_read_only_with_the_same_tensors(monkeypatch):
    """Linux refuses a private writable mapping larger than RAM + swap (ENOMEM); the file is
    then mapped read-only and the Q/K rows copied: the same tensors."""
    from inferpath.weights import load_checkpoint

    path = resolve_model("smollm2-135m-instruct")
    expected = load_checkpoint(path, keep_quantized=True).tensors
    memmap = np.memmap

    def no_private_mapping(*args, mode="r+", **kwargs):
        if mode == "c":
            raise OSError(12, "Cannot allocate memory")
        return memmap(*args, mode=mode, **kwargs)

    monkeypatch.setattr(gguf_index.np, "memmap", no_private_mapping)
    got = load_checkpoint(path, keep_quantized=True).tensors
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(getattr(tensor, "data", tensor), getattr(got[name], "data", got[name])), name


@pytest.mark.parametrize("stored", [gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F16])
def test_float_matrices_read_by_torch_equal_the_dequantized_ones_cast(tmp_path, stored):
    """A BF16 / F16 GGUF read in bfloat16 (a view of the map for BF16, Q/K rows reordered in
    the copy-on-write map) equals the gguf package's float32 values cast to bfloat16."""
    from gguf_files import write_float_gguf
    from test_model_files import VOCAB, write_tiny_gguf

    from inferpath.weights import load_checkpoint
    from inferpath.weights.gguf import unpermute_rows
    from inferpath.weights.names import hf_name

    write_float_gguf(write_tiny_gguf(tmp_path / "f32.gguf"), tmp_path / "bf16.gguf", stored)
    viewed = load_checkpoint(tmp_path / "bf16.gguf", dtype=torch.bfloat16).tensors
    reader = gguf.GGUFReader(tmp_path / "bf16.gguf")  # the reference: gguf's float32 values
    assert viewed["model.embed_tokens.weight"].shape == (len(VOCAB), 32)
    for t in reader.tensors:
        values = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            values = torch.from_numpy(unpermute_rows(values.numpy(), 4).copy())
        name = hf_name(t.name)
        assert viewed[name].dtype == torch.bfloat16
        assert torch.equal(viewed[name], values.to(torch.bfloat16)), name
    as_float32 = load_checkpoint(tmp_path / "bf16.gguf", dtype=torch.float32).tensors
    assert all(as_float32[name].dtype == torch.float32 for name in viewed)


def test_a_bf16_file_read_in_float32_does_not_stay_resident_beside_the_conversion(tmp_path):
    """SmolLM2 as a BF16 GGUF read in float32 (``--dtype float32``; ``auto`` keeps its
    matrices bf16 where the CPU lacks bf16 arithmetic, test_bf16_weights): each matrix's pages
    of the map are dropped once converted, and no tensor is left a view of the map, so the
    load peaks at about the float32 weights, not those plus the file (they did: +50%)."""
    import subprocess
    import sys

    from gguf_files import write_float_gguf

    path = write_float_gguf(resolve_model("smollm2-135m-instruct"), tmp_path / "bf16.gguf")
    # VmHWM: this process's peak resident memory (ru_maxrss would carry pytest's over exec)
    code = ("import sys, torch\n"
            "from inferpath.weights import load_checkpoint\n"
            "status = lambda key: int(open('/proc/self/status').read().split(key + ':')[1].split()[0]) * 1024\n"
            "before = status('VmRSS')\n"
            "tensors = load_checkpoint(sys.argv[1], dtype=torch.float32).tensors\n"
            "print(status('VmHWM') - before, sum(t.nbytes for t in tensors.values()))\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    added, float32_bytes = map(int, done.stdout.split())
    assert added < float32_bytes + path.stat().st_size // 4, (added, float32_bytes)
