"""Instruction-set levels and the CPU flags the kernels' dispatch decides on.

Four levels, each its own shared library built from one source set with its own flags
(libraries.py builds them):

- ``generic``: portable C (csrc/portable, csrc/quant), no intrinsics, vectorised by the
  compiler; every CPU runs it (and it is what an aarch64 machine compiles);
- ``avx2``: the same sources with ``-mavx2 -mfma -mf16c`` (AMD Zen 2/3, Intel client
  CPUs), and csrc/avx2 (intrinsics: the causal prefill attention on 256-bit registers);
  the quantized dot products take their AVX2 branch (maddubs/madd);
- ``avxvnni``: the avx2 sources with ``-mavxvnni`` too (Intel's client cores from Alder
  Lake, Sapphire Rapids, AMD Zen 5): the quantized dot products take ``vpdpbusd`` on
  256-bit registers (VEX), one instruction where AVX2 takes three, with the same integer
  sums, so the repacked kernels give avx2's bits (the file-layout Q8_0 kernel offsets its
  weights to unsigned as avx512's does); 16 vector registers, so avx2's tile heights. A CPU with
  AVX-512 but not AVX-VNNI (Zen 4, Ice Lake) skips it: forced, it runs avx2;
- ``avx512``: csrc/avx512 (intrinsics; AMX for bf16 where the CPU has it) and csrc/quant
  with VNNI (its GEMM's panels through AMX-INT8 tiles where the CPU has them:
  ``amx_int8_engine_for``).

The level is the best the CPU reports (/proc/cpuinfo), or a lower one forced with
``INFERPATH_ISA=generic|avx2|avxvnni|avx512``. A kernel family (float32, bfloat16, quantized)
may run at a level whose CPU flags, and the family's own there, are present
(``can_run``). Tests decide as if the CPU had or lacked AMX flags
(``simulated_cpu_flags``); the AMX-INT8 engine is set from the flags decided on.

``_loaded`` is the dispatch's one cache, guarded by ``_lock``: each level's library (by
level name: libraries.py) and every choice made from the CPU flags (the CPU's level, the
active one, the levels families resolve to, the functions build.py hands out).
``_forget_decisions`` drops the choices and keeps the libraries. NOTE: the other kernel
modules read ``_loaded`` and ``_cpu_flags`` as ``isa._loaded`` / ``isa._cpu_flags()``, so
that a test patching them here reaches every reader.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Level:
    """One instruction-set level: its sources, compiler flags and the CPU flags it needs."""

    name: str
    source_dirs: tuple[str, ...]
    flags: tuple[str, ...]
    cpu_flags: frozenset[str]


LEVELS = (  # lowest first
    Level("generic", ("portable", "quant", "drivers"), (), frozenset()),
    Level("avx2", ("portable", "avx2", "quant", "drivers"), ("-mavx2", "-mfma", "-mf16c"), frozenset({"avx2", "fma", "f16c"})),
    Level("avxvnni", ("portable", "avx2", "quant", "drivers"), ("-mavx2", "-mfma", "-mf16c", "-mavxvnni"),
          frozenset({"avx2", "fma", "f16c", "avx_vnni"})),
    Level("avx512", ("avx512", "quant", "drivers"),
          ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mfma", "-mf16c",
           "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
          frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"})),
)
LEVEL_NAMES = tuple(level.name for level in LEVELS)
_LEVEL = {level.name: level for level in LEVELS}
# Kernel families and the CPU flags each needs beyond its level's (avx512 bf16: vdpbf16ps).
FAMILIES = ("float32", "bfloat16", "quantized")
_FAMILY_FLAGS = {("avx512", "bfloat16"): frozenset({"avx512_bf16"})}
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})  # the bf16 AMX GEMM's (csrc/avx512/amx.c)
AMX_INT8_FLAGS = frozenset({"amx_tile", "amx_int8"})  # the quantized GEMM's AMX-INT8 engine (avx512/amx_int8.c)
AMX_INT8_ENGINES = ("none", "reference", "tiles")  # drivers/amx_int8_tiles.h's AMX_INT8_NONE, _REFERENCE, _TILES

_lock = threading.Lock()
_loaded: dict = {}  # level name -> (library or None, reason); (pattern, family, level) -> resolved fn


@cache
def _probed_cpu_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo reports: what this CPU executes."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


_simulated_flags: frozenset[str] | None = None  # set by simulated_cpu_flags


def _cpu_flags() -> frozenset[str]:
    """The CPU flags the kernels' choices read: the probed ones, or those a test simulates."""
    return _probed_cpu_flags() if _simulated_flags is None else _simulated_flags


def cpu_flags() -> frozenset[str]:
    """The CPU flags the dispatch decides on (see ``simulated_cpu_flags``)."""
    return _cpu_flags()


@contextmanager
def simulated_cpu_flags(add=(), remove=()):
    """Decide as if this CPU reported ``add`` and lacked ``remove`` (tests: the AMX dispatch
    on a CPU without AMX, the AVX-512-without-AMX one on a CPU with it). Only AMX flags may
    be added, and an added AMX flag the CPU lacks gives the portable reference of the AMX
    GEMM (``native_amx_gemm``), and of the quantized GEMM's AMX-INT8 engine
    (``amx_int8_engine``): no instruction this CPU lacks ever runs. Choices made
    inside (kernel lookups, a model's prepared kernels) belong to the simulation.

    Raises ValueError for an added flag that is not an AMX one."""
    global _simulated_flags
    added, removed = frozenset(add), frozenset(remove)
    if any(not flag.startswith("amx") for flag in added):
        raise ValueError(f"simulated_cpu_flags adds only AMX flags (amx_tile, amx_bf16, amx_int8), not "
                         f"{sorted(f for f in added if not f.startswith('amx'))}: a level's flags the CPU "
                         f"lacks would run instructions it cannot execute; remove flags instead")
    previous = _simulated_flags
    _simulated_flags = (_cpu_flags() | added) - removed
    _forget_decisions()
    try:
        yield _simulated_flags
    finally:
        _simulated_flags = previous
        _forget_decisions()


def amx_int8_engine_for(flags: frozenset[str], probed: frozenset[str], tiles_granted: bool,
                        enabled: bool) -> str:
    """Which engine serves the quantized GEMM's panels (one of ``AMX_INT8_ENGINES``) at the
    avx512 level, for the CPU flags the dispatch decides on (``flags``), those the CPU
    really has (``probed``), whether the kernel granted the AMX tile state, and whether
    INFERPATH_AMX_INT8=1 asked for it (``enabled``: off by default, since the tiles did not
    beat the VNNI tiles, docs/amx.md): "tiles" only on a CPU with amx_tile and amx_int8
    that was granted it, "reference" (plain C, the same layout and results) where the
    AMX-INT8 flags are only simulated, else "none"."""
    if not enabled or not AMX_INT8_FLAGS <= flags:
        return "none"
    if AMX_INT8_FLAGS <= probed:
        return "tiles" if tiles_granted else "none"
    return "reference"


def _set_amx_int8_engine(level: str, lib) -> None:
    """Tell the avx512 library which AMX-INT8 engine the flags decide (none elsewhere)."""
    if level != "avx512":
        return
    engine = amx_int8_engine_for(_cpu_flags(), _probed_cpu_flags(), lib.amx_int8_ready,
                                 os.environ.get("INFERPATH_AMX_INT8", "0") == "1")
    if lib.inferpath_amx_int8_use(AMX_INT8_ENGINES.index(engine)) != 0:
        raise RuntimeError(f"the avx512 kernels refused the AMX-INT8 engine {engine!r}")
    lib.amx_int8_engine = engine


def _forget_decisions() -> None:
    """Drop the choices made from the CPU flags (levels, resolved functions), keeping the
    built libraries, and set the avx512 library's AMX-INT8 engine anew."""
    with _lock:
        for key in [key for key in _loaded if key not in _LEVEL]:
            del _loaded[key]
        lib = _loaded.get("avx512", (None, ""))[0]
    if lib is not None:
        _set_amx_int8_engine("avx512", lib)


def cpu_level() -> str:
    """The best level this CPU can run."""
    if "cpu_level" not in _loaded:
        _loaded["cpu_level"] = [level.name for level in LEVELS if can_run(level.name)][-1]
    return _loaded["cpu_level"]


def active_level() -> str:
    """The level kernels are chosen at: ``cpu_level()``, or lower if INFERPATH_ISA says so.

    Raises ValueError for an INFERPATH_ISA that names no level.
    """
    forced = os.environ.get("INFERPATH_ISA", "")
    level = _loaded.get(("active", forced))  # the per-step path: one lookup
    if level is None:
        name, best = forced.strip().lower(), cpu_level()
        if name and name not in _LEVEL:
            raise ValueError(f"INFERPATH_ISA={forced!r} names no instruction-set level; "
                             f"use one of {', '.join(LEVEL_NAMES)}")
        # the highest level at or below the forced one that the CPU runs: never above the CPU's
        # best, nor a level it lacks the flags of (avxvnni on Zen 4 runs avx2)
        level = [n for n in LEVEL_NAMES[:LEVEL_NAMES.index(name) + 1] if can_run(n)][-1] if name else best
        _loaded[("active", forced)] = level
    return level


def can_run(level: str, family: str | None = None) -> bool:
    """Whether this CPU has the flags ``level`` (and ``family`` at that level) needs."""
    needed = _LEVEL[level].cpu_flags | _FAMILY_FLAGS.get((level, family), frozenset())
    return needed <= _cpu_flags()
