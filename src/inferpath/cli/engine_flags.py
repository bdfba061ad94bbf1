"""The engine's command-line flags, made from ``EngineConfig``'s fields: one definition for
``generate``, ``chat`` and ``serve``.

Every field of ``EngineConfig`` becomes a flag: ``--field-name`` with the field's type,
unless ``SPELLINGS`` gives it a friendlier form (a unit, a ``--no-`` switch for a default-on
boolean, a short alias). A field added to EngineConfig therefore gets a flag with no change
here. Each flag's default is None, meaning "EngineConfig's default", so the defaults live in
one place; the help text shows them.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferpath.config import EngineConfig

GIB = 1024**3


@dataclass(frozen=True)
class Spelling:
    """How one field is spelled on the command line and turned back into its value."""

    flags: tuple[str, ...]
    help: str
    type: Callable[[str], Any] | None = None
    to_value: Callable[[Any], Any] = lambda value: value
    show_default: Callable[[Any], str] = str
    choices: tuple[str, ...] | None = None
    negate: bool = False  # a --no-X switch that sets the (default-on) field to False
    affirm: bool = False  # a switch that sets the (default-off) field to True
    metavar: str | None = None
    none_means: str = "none"  # what a default of None stands for, in the help


SPELLINGS: dict[str, Spelling] = {
    "dtype": Spelling(("--dtype",), "auto: a quantized GGUF runs quantized (float32 activations), "
                      "float weights bf16 where the CPU has native bf16, else float32; a dtype: "
                      "every weight in it", choices=("auto", "float32", "bfloat16", "float16")),
    "kv_cache_dtype": Spelling(("--kv-cache-dtype",), "the KV cache's dtype: auto (the activations') or "
                               "bfloat16 (half a float32 cache's bytes: K and V rounded once as they are "
                               "written)", choices=("auto", "bfloat16")),
    "quantization": Spelling(("--quantization",), "quantize float weights on load (a Hugging Face "
                             "directory or an F32/F16/BF16 GGUF)", choices=("q8_0", "q4_0", "q4_k")),
    "threads": Spelling(("--threads",), "compute threads, the kernels' and PyTorch's", type=int,
                        metavar="N", none_means="the physical cores"),
    "tensor_parallel_size": Spelling(("--tensor-parallel-size", "--tp"),
                                     "shard the model over N local processes (torch.distributed)",
                                     type=int, metavar="N"),
    "max_model_len": Spelling(("--max-model-len",), "longest prompt + output in tokens",
                              type=int, metavar="N", none_means="the model's limit"),
    "kv_cache_memory_bytes": Spelling(("--kv-cache-memory",), "KV-cache budget in GiB", type=float,
                                      to_value=lambda gib: int(gib * GIB), metavar="GIB",
                                      show_default=lambda b: f"{b / GIB:g}"),
    "num_kv_blocks": Spelling(("--num-kv-blocks",), "KV-cache blocks", type=int, metavar="N",
                              none_means="sized from --kv-cache-memory"),
    "block_size": Spelling(("--block-size",), "tokens per KV-cache block", type=int, metavar="N"),
    "max_num_seqs": Spelling(("--max-num-seqs",), "most sequences in one batch", type=int,
                             metavar="N"),
    "max_num_batched_tokens": Spelling(("--max-num-batched-tokens",), "token budget of one "
                                       "engine step", type=int, metavar="N"),
    "max_waiting_requests": Spelling(("--max-waiting-requests", "--max-waiting"),
                                     "waiting requests before new ones are refused (429)", type=int,
                                     metavar="N"),
    "enable_prefix_caching": Spelling(("--no-prefix-caching",), "disable automatic prefix caching",
                                      negate=True),
    "cpu_kernels": Spelling(("--no-cpu-kernels",), "run PyTorch's ops only, not inferpath's "
                            "native CPU kernels", negate=True),
    "batch_invariant": Spelling(("--deterministic", "--batch-invariant"), "batch-invariant mode: a "
                                "request's tokens and logprobs are bitwise the same whatever shares its "
                                "steps (slower prompts)", affirm=True),
    "deterministic_seeded": Spelling(("--deterministic-seeded",), "batch-invariant rows for the "
                                     "requests that set a seed only: their tokens and logprobs are "
                                     "bitwise the same whatever shares their steps; other requests "
                                     "keep the fast kernels (a step with both runs twice)", affirm=True),
    "speculative_config": Spelling(("--speculative-config",), "speculative decoding, as a JSON "
                                   "object: {\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                                   "\"prompt_lookup_max\": 4}, {\"method\": \"suffix\", "
                                   "\"num_speculative_tokens\": 8} or {\"method\": \"draft_model\", "
                                   "\"model\": ALIAS, \"num_speculative_tokens\": 4}", type=str,
                                   metavar="JSON", none_means="off"),
    "seed": Spelling(("--engine-seed",), "seed of the engine's shared random generator "
                     "(requests with their own seed do not use it)", type=int, metavar="S"),
}


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per EngineConfig field to ``parser`` (an ``engine`` group)."""
    group = parser.add_argument_group("engine (EngineConfig)")
    hints = typing.get_type_hints(EngineConfig)
    defaults = EngineConfig()
    for field in dataclasses.fields(EngineConfig):
        spelling = SPELLINGS.get(field.name) or _generic_spelling(field.name, hints[field.name])
        default = getattr(defaults, field.name)
        if spelling.negate:
            group.add_argument(*spelling.flags, dest=field.name, action="store_false",
                               default=None, help=spelling.help)
            continue
        if spelling.affirm:
            group.add_argument(*spelling.flags, dest=field.name, action="store_const", const=True,
                               default=None, help=spelling.help)
            continue
        shown = spelling.none_means if default is None else spelling.show_default(default)
        group.add_argument(*spelling.flags, dest=field.name, type=spelling.type, default=None,
                           choices=spelling.choices, metavar=spelling.metavar,
                           help=f"{spelling.help} (default: {shown})")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe; unset flags keep EngineConfig's defaults
    (validated by EngineConfig itself)."""
    values = {}
    for field in dataclasses.fields(EngineConfig):
        value = getattr(args, field.name, None)
        if value is None:
            continue
        spelling = SPELLINGS.get(field.name)
        values[field.name] = spelling.to_value(value) if spelling and not spelling.negate else value
    return EngineConfig(**values)


def _generic_spelling(name: str, hint: Any) -> Spelling:
    """``--field-name`` of the field's own type (``X | None`` reads as X; a bool field is
    ``--field-name true|false``)."""
    kinds = [t for t in typing.get_args(hint) if t is not type(None)] if _is_union(hint) else [hint]
    kind = kinds[0] if len(kinds) == 1 else str
    if kind is bool:
        return Spelling((f"--{name.replace('_', '-')}",), f"EngineConfig.{name}",
                        type=_parse_bool, choices=None)
    return Spelling((f"--{name.replace('_', '-')}",), f"EngineConfig.{name}",
                    type=kind if kind in (int, float, str) else str)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
