"""The sampler's cost: measured by running the engine's own sampler, per vocabulary and parameters.

The cost model's ``sampling`` stage (cost.py) is the roofline of reading the logits once:
~6 us for SmolLM2's 49,152 float32 logits at 30 GB/s. The engine's sampler
(sampling/sampler.py) is Python around a few PyTorch ops — the min-tokens ban, the logit
bias, grammar masks, penalties, checks that every row can be chosen, the argmax or the
temperature/truncation/softmax/draw, the guard on the ids, logprobs — and costs ~0.2-0.6 ms
a step there, 30-100x the roofline. Its work depends on the vocabulary, the number of rows
and each row's parameters, not on the model; so the probe runs the sampler itself, built as
the engine builds it (``engine.builder.build_sampler``: the native argmax for greedy rows), on
random float32 logits of that vocabulary and rows of those parameters, best of a few calls.

Hot and cold: called again and again, the sampler runs with its Python, PyTorch's dispatch
and its data in the caches (~30-40 us for one greedy SmolLM2 row here); in a decode step it
runs after the step's weights streamed through the caches (~100 MB for SmolLM2 against a
32 MB last-level cache) and costs ~10x that (0.3-0.5 ms: replaying a step's own call on its
own logits took 240 us the first time, 40-66 us after). A key ending in ``"/cold"`` is
measured with ``probe_kernels.STREAM_LLC_MULTIPLE`` last-level caches of other data read
(by numpy, on one thread, untimed) before each call; a step the cache rule streams
(kernel_cost.py) is priced at its cold key, one whose hot data stays in the cache at the hot.

A step's rows are described by a key: ``"VOCAB/KIND:COUNT,KIND:COUNT"`` (kinds sorted), each
row's kind ``row_kind(params)``: ``greedy`` or ``sample``, plus ``+top_k``, ``+top_p``,
``+min_p``, ``+penalties``, ``+logprobs`` where its parameters ask. A row with a grammar
(structured output) is ``grammar``, which is not probed (its mask's cost depends on the
grammar): such a step's sampling keeps the roofline's price (its key is None).

Measured keys live in ``HardwareSpec.sampler_s`` (seconds a call) and are cached beside the
probe like the GEMV shapes (``"sampler_s"``; a re-probe drops them, a busy machine's
figure is used and not kept).
"""

from __future__ import annotations

import time
from dataclasses import replace

REPEATS = 7
COLD = "cold"  # the suffix of a key measured after the caches were flushed (module doc)
PROMPT_TOKENS = 32  # the token history a penalised probe row carries
# the parameters a probe row of each feature runs with (any values that turn the feature on)
_FEATURES = {"top_k": {"top_k": 40}, "top_p": {"top_p": 0.9}, "min_p": {"min_p": 0.05},
             "penalties": {"repetition_penalty": 1.1}, "logprobs": {"logprobs": 5}}


GRAMMAR = "grammar"


def row_kind(params) -> str:
    """The sampler's kind of work for one row of ``params`` (module doc)."""
    if getattr(params, "structured", None) is not None:
        return GRAMMAR
    kind = "greedy" if params.is_greedy else "sample"
    if not params.is_greedy:
        kind += "".join(f"+{name}" for name, on in (("top_k", params.top_k > 0), ("top_p", params.top_p < 1.0),
                                                   ("min_p", params.min_p > 0.0)) if on)
    if params.has_penalties:
        kind += "+penalties"
    if params.logprobs is not None:
        kind += "+logprobs"
    return kind


def sampler_key(vocab_size: int, kinds: list[str]) -> str | None:
    """The key of a step whose sampled rows are of ``kinds``; None where none sampled or
    one has a grammar (not probed)."""
    if not kinds or GRAMMAR in kinds:
        return None
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return f"{vocab_size}/" + ",".join(f"{k}:{n}" for k, n in sorted(counts.items()))


def _params_of(kind: str):
    from inferpath.sampling.params import SamplingParams

    name, *features = kind.split("+")
    fields = {"temperature": 0.0 if name == "greedy" else 0.8}
    for feature in features:
        fields.update(_FEATURES[feature])
    return SamplingParams(**fields)


def measure_sampler(key: str, cpu_kernels: bool = True) -> float:
    """Seconds of one call of the engine's sampler on the rows ``key`` describes (best of
    ``REPEATS``, after a warm-up call); a ``"/cold"`` key with the caches flushed before each."""
    import numpy as np
    import torch

    from inferpath.explain.probe_kernels import STREAM_LLC_MULTIPLE, llc_bytes

    from inferpath.config import EngineConfig
    from inferpath.engine.builder import build_sampler
    from inferpath.sampling.sampler import SamplingRow

    vocab, described, *cold = key.split("/")
    flush = np.ones(max(1, STREAM_LLC_MULTIPLE * llc_bytes() // 4), dtype=np.float32) if cold == [COLD] else None
    sampler = build_sampler(EngineConfig(cpu_kernels=cpu_kernels, seed=0))
    rows = []
    for part in described.split(","):
        kind, count = part.rsplit(":", 1)
        params = _params_of(kind)
        rows += [SamplingRow(params, list(range(PROMPT_TOKENS)), list(range(PROMPT_TOKENS, PROMPT_TOKENS + 8)))
                 for _ in range(int(count))]
    logits = torch.randn(len(rows), int(vocab))  # (rows, vocab) float32, as the LM head writes them
    with torch.inference_mode():
        sampler(logits, rows)
        best = float("inf")
        for _ in range(REPEATS):
            if flush is not None:
                flush.sum()  # one thread (numpy), reading every line: the step's weights passing
            start = time.perf_counter()
            sampler(logits, rows)
            best = min(best, time.perf_counter() - start)
    return best


def step_sampler_key(record, engine) -> str | None:
    """The key of a traced step's sampled rows (engine/trace.py ChunkRecord.sampling_kind)."""
    return sampler_key(engine.model_config.vocab_size, [c.sampling_kind for c in record.chunks if c.sampling_kind])


def probed_keys(keys) -> list[str]:
    """Each key hot and cold (what a trace's steps may be priced at)."""
    return sorted({k for key in keys if key for k in (key, f"{key}/{COLD}")})


def with_sampler_costs(hardware, keys, refresh: bool = False, cache_path=None, measure: bool = True):
    """``hardware`` with ``sampler_s`` holding every key of ``keys`` (measured, or cached
    beside this machine's probe: probe.with_measured); a preset is returned as it is (its
    sampling keeps the roofline)."""
    from inferpath.explain.probe import with_measured

    return with_measured(hardware, "sampler_s", keys, measure_sampler, refresh, cache_path, measure)


def price_sampling(stage, key: str | None, hardware, cold: bool = False):
    """The ``sampling`` stage at the sampler's measured cost for ``key`` (``cold``: its cold
    figure first) where the hardware has it (bytes and FLOPs kept: what the roofline
    counts); else as it is."""
    rates = hardware.sampler_s
    seconds = ((cold and rates.get(f"{key}/{COLD}")) or rates.get(key)) if key else None
    if not seconds:
        return stage
    return replace(stage, memory_time_s=seconds, compute_time_s=min(stage.compute_time_s, seconds))
