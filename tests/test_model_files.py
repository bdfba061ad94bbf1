"""Hostile model files fail fast with one error type (issue 13).

GGUF files (header, metadata, tensor table), tokenizer.json files and chat templates are
fuzzed with hypothesis from a small valid file written here: every variant either loads
or raises ``ModelFileError`` naming the file, within a hang guard of a few seconds, and
never ``MemoryError``, ``RecursionError`` or another exception type. Targeted cases cover
what a red team found: counts of 2^31..2^63, ``head_count`` 0, deeply nested arrays,
huge and negative token ids, wrong field types, invalid UTF-8, runaway templates.
"""

from __future__ import annotations

import contextlib
import json
import signal
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferpath.errors import ModelFileError
from inferpath.tokenizer import load_tokenizer
from inferpath.weights import load_checkpoint
from inferpath.weights.gguf_check import check_gguf

#: A hang guard, not a timing test: a parser that is stuck takes minutes, not seconds.
HANG_GUARD_SECONDS = 5
HOSTILE_COUNTS = [2**31, 2**32 - 1, 2**40, 2**62, 2**63, 2**64 - 1]
VOCAB = ["a", "b", "c", "ab", "abc", "Ġ", "Ġa", "<|im_start|>", "<|im_end|>"]
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@contextlib.contextmanager
def hang_guard(seconds: int = HANG_GUARD_SECONDS):
    def fail(*_):
        raise AssertionError(f"still parsing after {seconds} s: the parser hangs")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def loads_or_refuses(load, path: Path) -> None:
    """``load(path)`` succeeds or raises ModelFileError naming the file, under the guard."""
    with hang_guard():
        try:
            load(path)
        except ModelFileError as exc:
            assert str(path) in str(exc) or path.name in str(exc), str(exc)


# ---------------------------------------------------------------- GGUF

def write_tiny_gguf(path: Path, overrides: dict | None = None) -> Path:
    """A complete tiny Llama GGUF: config keys, a byte-level BPE vocabulary, f32 tensors;
    ``overrides``: key -> (value, GGUFValueType, item type of an array or None), written
    over (or beside) the keys above."""
    h, heads, vocab = 32, 4, len(VOCAB)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(h)
    w.add_feed_forward_length(h)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(VOCAB)
    w.add_token_types([1] * 7 + [3, 3])
    w.add_token_merges(["a b", "ab c", "Ġ a"])
    w.add_bos_token_id(7)
    w.add_eos_token_id(8)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for key, (value, value_type, item_type) in (overrides or {}).items():
        w.add_key_value(key, value, value_type, item_type)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,),
              "blk.0.attn_norm.weight": (h,), "blk.0.ffn_norm.weight": (h,),
              "blk.0.attn_q.weight": (h, h), "blk.0.attn_k.weight": (h, h),
              "blk.0.attn_v.weight": (h, h), "blk.0.attn_output.weight": (h, h),
              "blk.0.ffn_gate.weight": (h, h), "blk.0.ffn_up.weight": (h, h),
              "blk.0.ffn_down.weight": (h, h)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class TinyGGUF(bytes):
    """The file's bytes, and where its tensor data starts (the fuzzer mutates before it)."""

    data_offset: int

    def __repr__(self) -> str:  # hypothesis prints the fixture of a failing example
        return f"TinyGGUF({len(self)} bytes)"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> TinyGGUF:
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    load_checkpoint(path)  # the unmutated file loads
    load_tokenizer(path)
    data = TinyGGUF(path.read_bytes())
    data.data_offset = int(gguf.GGUFReader(path).data_offset)
    return data


def key_offset(data: bytes, key: str) -> int:
    """The offset of ``key``'s value type (just after the key string)."""
    raw = key.encode()
    return data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)


def patched(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


@pytest.mark.parametrize("count", HOSTILE_COUNTS)
@pytest.mark.parametrize("where", ["tensor_count", "kv_count", "vocab array", "key length"])
def test_hostile_gguf_counts_fail_fast(tmp_path, tiny_gguf, where, count):
    data = tiny_gguf
    offset = {"tensor_count": 8, "kv_count": 16,
              "vocab array": key_offset(data, "tokenizer.ggml.tokens") + 8,  # after type, item type
              "key length": 24}[where]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(patched(data, offset, struct.pack("<Q", count)))
    for load in (load_checkpoint, load_tokenizer):
        with hang_guard(), pytest.raises(ModelFileError, match=str(count)):
            load(path)


def test_zero_head_count_and_deep_arrays_are_refused(tmp_path, tiny_gguf):
    data = tiny_gguf
    offset = key_offset(data, "llama.attention.head_count") + 4  # after the u32 type
    path = tmp_path / "zero.gguf"
    path.write_bytes(patched(data, offset, struct.pack("<I", 0)))
    with pytest.raises(ModelFileError, match=r"head_count is 0; allowed: an integer in 1\.\."):
        load_checkpoint(path)
    # an array of arrays of arrays ...: a new key appended to the metadata
    nested = struct.pack("<I", 9) + (struct.pack("<IQ", 9, 1)) * 5000 + struct.pack("<IQ", 4, 0)
    key = b"evil.nested"
    kv_count = struct.unpack_from("<Q", data, 16)[0]
    deep = data[:16] + struct.pack("<Q", kv_count + 1) + data[24:24] + \
        struct.pack("<Q", len(key)) + key + nested + data[24:]
    path.write_bytes(deep)
    with hang_guard(), pytest.raises(ModelFileError, match="nested more than"):
        check_gguf(path)


def test_a_layer_tensor_name_without_its_kind_is_refused(tmp_path, tiny_gguf):
    """A ``blk.`` tensor name whose dots were overwritten ('blk.0' + bytes + 'weight': hypothesis
    found it, patching a u64 inside the name) is refused with ModelFileError naming the file
    and tensor, where it raised IndexError reading the name's third part."""
    name = b"blk.0.attn_v.weight"
    at = tiny_gguf.index(name) + len("blk.0")
    path = tmp_path / "renamed.gguf"
    path.write_bytes(patched(tiny_gguf, at, (2**40).to_bytes(8, "little")))
    with pytest.raises(ModelFileError, match="no Hugging Face counterpart"):
        load_checkpoint(path)
    loads_or_refuses(load_checkpoint, path)


@SETTINGS
@given(st.data())
def test_fuzzed_gguf_loads_or_raises_model_file_error(tmp_path, tiny_gguf, data):
    raw = tiny_gguf
    end = raw.data_offset
    kind = data.draw(st.sampled_from(["u64", "u32", "byte", "truncate"]))
    if kind == "truncate":
        mutated = raw[:data.draw(st.integers(0, len(raw) - 1))]
    else:
        size = {"u64": 8, "u32": 4, "byte": 1}[kind]
        offset = data.draw(st.integers(0, end - size))
        value = data.draw(st.sampled_from(HOSTILE_COUNTS + [0, 1, 2**16, 2**31 - 1])
                          if size > 1 else st.integers(0, 255))
        mutated = patched(raw, offset, (value % 2 ** (8 * size)).to_bytes(size, "little"))
    path = tmp_path / "fuzzed.gguf"
    path.write_bytes(mutated)
    loads_or_refuses(load_checkpoint, path)
    loads_or_refuses(load_tokenizer, path)


from inferpath.weights.gguf_keys import (  # noqa: E402
    ARCH_KEY_TYPES,
    GENERAL_KEY_TYPES,
    TOKENIZER_KEY_TYPES,
)

V = gguf.GGUFValueType
#: a value of each GGUF type, and the key types (gguf_keys.py) it satisfies
_VALUES_OF_EVERY_TYPE = {
    "u32": ((3, V.UINT32, None), {"integer", "number", "integer or integers"}),
    "i64": ((-1, V.INT64, None), {"integer", "number", "integer or integers"}),
    "f32": ((1.5, V.FLOAT32, None), {"number"}),
    "bool": ((True, V.BOOL, None), {"bool"}),
    "string": (("gpt2", V.STRING, None), {"string"}),
    "int array": (([1, 2], V.ARRAY, V.INT32), {"integers", "integer or integers", "numbers"}),
    "float array": (([0.5, -1.0], V.ARRAY, V.FLOAT32), {"numbers"}),
    "string array": ((["a b", "c"], V.ARRAY, V.STRING), {"strings"}),
}
_READ_KEYS = {**GENERAL_KEY_TYPES, **TOKENIZER_KEY_TYPES,
              **{f"llama.{key}": kind for key, kind in ARCH_KEY_TYPES.items()}}


@pytest.mark.parametrize("given", sorted(_VALUES_OF_EVERY_TYPE))
@pytest.mark.parametrize("key", sorted(_READ_KEYS))
def test_every_metadata_key_the_loaders_read_is_type_checked(tmp_path, key, given):
    """Each key the config or tokenizer loader reads, given a value of each GGUF type: the
    file loads or raises ModelFileError, and a value of the wrong type is refused by name
    with the type expected (never a bare TypeError from deep inside a loader)."""
    value, acceptable = _VALUES_OF_EVERY_TYPE[given]
    path = write_tiny_gguf(tmp_path / "confused.gguf", {key: value})
    kind = _READ_KEYS[key]
    for load in (load_checkpoint, load_tokenizer):
        with hang_guard():
            try:
                load(path)
            except ModelFileError as exc:
                assert path.name in str(exc), str(exc)
                if kind not in acceptable:
                    assert key in str(exc) and ("expected:" in str(exc) or "allowed:" in str(exc)), str(exc)
                continue
        assert kind in acceptable or (key == "general.architecture" and given == "string"), (
            f"{load.__name__} accepted {key} = {value[0]!r}")


# ---------------------------------------------------------------- tokenizer.json

def tokenizer_json() -> dict:
    """A small valid byte-level BPE tokenizer.json."""
    return {
        "model": {"type": "BPE", "vocab": {p: i for i, p in enumerate(VOCAB[:7])},
                  "merges": ["a b", "ab c", "Ġ a"]},
        "added_tokens": [{"id": 7, "content": "<|im_start|>", "special": True},
                         {"id": 8, "content": "<|im_end|>", "special": True}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
        "decoder": {"type": "ByteLevel"},
        "normalizer": None,
        "post_processor": None,
    }


@pytest.mark.parametrize("mutate,field", [
    (lambda t: t["model"]["vocab"].update(a=10**8), "model.vocab['a']"),
    (lambda t: t["model"]["vocab"].update(a=10**9), "model.vocab['a']"),
    (lambda t: t["model"]["vocab"].update(a=-1), "model.vocab['a']"),
    (lambda t: t["model"]["vocab"].update(a="1"), "model.vocab['a']"),
    (lambda t: t["added_tokens"][0].update(id=2**40), "added_tokens[0].id"),
    (lambda t: t["added_tokens"].append("x"), "added_tokens[2]"),
    (lambda t: t.update(model=[]), "model"),
    (lambda t: t["model"].update(merges={"a": "b"}), "model.merges"),
    (lambda t: t["model"].update(merges=[1]), "model.merges[0]"),
    (lambda t: t["model"].update(vocab=[["a", 1]]), "model.vocab"),
    (lambda t: t.update(pre_tokenizer="ByteLevel"), "pre_tokenizer"),
])
def test_hostile_tokenizer_json_names_the_field(tmp_path, mutate, field):
    spec = tokenizer_json()
    mutate(spec)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    with hang_guard(), pytest.raises(ModelFileError) as info:
        load_tokenizer(path)
    assert str(path) in str(info.value) and field in str(info.value), str(info.value)


def test_tokenizer_json_that_is_not_utf8_or_nests_too_deep(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(json.dumps(tokenizer_json()).encode().replace(b'"a"', b'"\xff"', 1))
    with pytest.raises(ModelFileError, match="not UTF-8"):
        load_tokenizer(path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with hang_guard(), pytest.raises(ModelFileError):
        load_tokenizer(path)


_JSON_LEAVES = (st.none() | st.booleans() | st.integers(-(2**64), 2**64)
                | st.sampled_from([10**8, 10**9, -1, 0, 2**21, 2**21 - 1]) | st.floats(allow_nan=False)
                | st.text(max_size=6))
_JSON = st.recursive(_JSON_LEAVES, lambda c: st.lists(c, max_size=3)
                     | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([
    ("model",), ("model", "vocab"), ("model", "merges"), ("model", "type"), ("added_tokens",),
    ("pre_tokenizer",), ("decoder",), ("normalizer",), ("post_processor",), ("model", "vocab", "a"),
    ("model", "ignore_merges"), ("pre_tokenizer", "type")]), _JSON), min_size=1, max_size=3))
def test_fuzzed_tokenizer_json_loads_or_raises_model_file_error(tmp_path, changes):
    spec = tokenizer_json()
    for keys, value in changes:
        target = spec
        for key in keys[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[keys[-1]] = value
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    loads_or_refuses(load_tokenizer, path)


# ---------------------------------------------------------------- chat templates

from inferpath.tokenizer.chat import ChatRenderer, ChatTemplateError

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source,rule", [
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "loop iterations"),
    ("{% for m in messages %}{% for a in range(99999) %}{% for b in range(99) %}{% endfor %}{% endfor %}{% endfor %}", "loop iterations"),
    ("{{ 'x' * 1000000000 }}", "with '*'"),
    ("{{ 'x'.ljust(1000000000) }}", "passes 1000000000"),
    ("{{ 'x'|center(1000000000) }}", "passes 1000000000"),
    ("{{ '{:>999999999}'.format('a') }}", "width of 999999999"),
    ("{{ '%999999999s' % 'a' }}", "width of 999999999"),
    ("{{ 2 ** 100000000 }}", "power"),
    ("{% include 'other.jinja' %}", "include"),
    ("{% from 'x' import y %}", "import"),
    ("{% extends 'base' %}", "extends"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed"),
    ("{% for i in range(10**9) %}{% endfor %}", "passes"),
    ("{{ messages[0].content[5] }}{{ 1 / 0 }}", "failed on these messages"),
    ("{{ lipsum(100000) }}", "lipsum"),
    ("{{ lipsum(5, max=1000000) }}", "lipsum"),
    ("{{ lipsum('x') }}", "lipsum with n='x'"),
    ("{% for i in range(3) %}{{ range(99999)|join|length }}{% endfor %}", "items of range"),
    ("{% for i in range(3) %}{{ cycler(*range(99999)).next() }}{% endfor %}", "items of range"),
    ("{% for i in range(99999) %}{% set ns = namespace(a=range(99999)|list) %}{% endfor %}",
     "items of range"),
])
def test_hostile_chat_templates_fail_fast_with_a_clean_error(source, rule):
    with hang_guard(), pytest.raises(ChatTemplateError, match=rule):
        ChatRenderer(source, {}).render(MESSAGES)


def test_template_globals_render_within_the_budget():
    """lipsum, range, cycler, joiner, namespace and dict work as in Jinja when small."""
    source = ("{% set c = cycler('odd', 'even') %}{% set j = joiner('|') %}"
              "{% set ns = namespace(n=0) %}{% for i in range(4) %}{{ j() }}{{ c.next() }}"
              "{% set ns.n = ns.n + i %}{% endfor %} {{ ns.n }} {{ dict(a=1)|tojson }} "
              "{{ lipsum(2, False, 5, 10)|wordcount > 0 }}")
    assert ChatRenderer(source, {}).render(MESSAGES) == 'odd|even|odd|even 6 {"a": 1} True'


@pytest.mark.parametrize("messages,named", [
    ("hi", "got a str"), (5, "got a int"), ({"role": "user"}, "got a dict"),
    (["hi"], r"messages\[0\] must be a dict"), ([{"content": "hi"}], r"messages\[0\]\['role'\]"),
    ([{"role": "user", "content": 5}], r"messages\[0\]\['content'\]"),
    ([{"role": "user", "content": "a"}, None], r"messages\[1\]"),
])
def test_chat_messages_that_are_not_a_list_of_messages_are_value_errors(messages, named):
    """The library's chat entry points (render, render_with_spans through encode_chat)
    refuse a malformed conversation with a ValueError saying what was expected."""
    import regex

    renderer = ChatRenderer("{% for m in messages %}{{ m['content'] }}{% endfor %}", {})
    with pytest.raises(ValueError, match=named):
        renderer.render(messages)
    with pytest.raises(ValueError, match=named):
        renderer.render_with_spans(messages, True, regex.compile("<x>"))
    with pytest.raises(ValueError, match="tools must be a list of dicts"):
        renderer.render(MESSAGES, tools="f")


def test_bounded_templates_still_render_long_chats():
    source = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
              "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    messages = [{"role": "user", "content": "x" * 1000}] * 2000  # 2 MB of chat
    rendered = ChatRenderer(source, {}).render(messages)
    assert rendered.count("<|im_start|>") == 2001


_TEMPLATE_PIECES = st.sampled_from([
    "{% for m in messages %}", "{% endfor %}", "{% for i in range(1000) %}", "{{ m['content'] }}",
    "{{ 'ab' * 1000 }}", "{% if loop.last %}", "{% endif %}", "{{ messages|length }}",
    "{% set x = 'y' * 99999 %}", "{{ x }}", "{{ range(5)|list }}", "{{ 'a'.ljust(50) }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}", "{{ f(1) }}", "{% include 'a' %}", "{{ 9 ** 9 }}",
    "text", "{{ raise_exception('no') }}", "{{ (messages * 1000)|length }}",
    "{{ lipsum(1000) }}", "{{ lipsum(2, False, 5, 10) }}", "{% set c = cycler('a', 'b') %}",
    "{{ c.next() }}", "{% set j = joiner(', ') %}", "{{ j() }}", "{{ range(99999)|join|length }}",
    "{% set ns = namespace(n=0) %}", "{% set ns.n = ns.n + 1 %}", "{{ dict(a=1)|tojson }}",
])


@SETTINGS
@given(st.lists(_TEMPLATE_PIECES, max_size=8))
def test_fuzzed_chat_templates_render_or_raise_chat_template_error(pieces):
    with hang_guard():
        try:
            ChatRenderer("".join(pieces), {}).render(MESSAGES * 3)
        except ChatTemplateError:
            pass
