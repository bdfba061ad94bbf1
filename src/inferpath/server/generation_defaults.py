"""The server's sampling defaults: what a request that leaves a sampling field out gets.

OpenAI's defaults (temperature 1.0, top_p 1.0, no top_k) suit models tuned for them; many
checkpoints ship their own in ``generation_config.json`` (Qwen2.5: temperature 0.7, top_p
0.8, top_k 20, repetition_penalty 1.05), and agents such as Codex CLI and Claude Code send
no temperature at all. As vLLM's ``--generation-config`` / ``--override-generation-config``:

- ``auto`` (the default): the model directory's ``generation_config.json``, its keys of
  ``FIELDS`` only (``do_sample``, ids and versions are not sampling defaults); a GGUF file
  carries none, so its defaults stay OpenAI's;
- ``none``: OpenAI's defaults, whatever the model ships;
- ``--override-generation-config JSON``: these keys on top (a key not in ``FIELDS`` is an
  error naming it, never ignored).

Invariant: a field the request sets itself (even to its default value) is the request's;
a default fills only fields the request left out, on every route (chat, completions,
responses, messages).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

#: the sampling fields a default may fill, with the type each must have
FIELDS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float,
          "repetition_penalty": float, "presence_penalty": float, "frequency_penalty": float}
CHOICES = ("auto", "none")


def read_generation_defaults(model: str | Path, choice: str = "auto") -> dict[str, Any]:
    """The defaults ``choice`` takes from ``model`` (an alias, a file or a directory)."""
    if choice not in CHOICES:
        raise ValueError(f"--generation-config is {choice!r}; it takes one of {', '.join(CHOICES)}")
    path = Path(model) / "generation_config.json"
    if choice == "none" or not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not readable as JSON ({exc})") from None
    return checked({k: v for k, v in config.items() if k in FIELDS}, str(path))


def parse_override(text: str | None) -> dict[str, Any]:
    """``--override-generation-config``'s JSON object, checked."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--override-generation-config is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("--override-generation-config must be a JSON object, "
                         f"e.g. '{{\"temperature\": 0.7}}'; got {text!r}")
    return checked(value, "--override-generation-config")


def checked(values: dict[str, Any], where: str) -> dict[str, Any]:
    for key, value in values.items():
        kind = FIELDS.get(key)
        if kind is None:
            raise ValueError(f"{where}: {key!r} is not a sampling default inferpath applies; "
                             f"it takes {', '.join(FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise ValueError(f"{where}: {key} is {value!r}; it must be a {kind.__name__}")
    return {k: kind(values[k]) for k, kind in FIELDS.items() if k in values}


def with_defaults(params, body, defaults: dict[str, Any]):
    """``params`` with each default whose field ``body`` (a pydantic request) did not set."""
    given = body.model_fields_set
    fill = {k: v for k, v in defaults.items() if k not in given}
    return dataclasses.replace(params, **fill) if fill else params
