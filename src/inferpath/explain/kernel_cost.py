"""Each matmul stage priced at the rate of the kernel that runs it, in the format it runs in.

cost.py prices a stage as ``max(FLOPs / peak, bytes / bandwidth)`` at the mean bytes per
weight of the whole model. That is the roofline of an ideal kernel; the engine's kernels
are not ideal, and each weight format has its own (kernels/quantized.py, kernels/modules.py):
on the probed 2-core EPYC a Q4_1 GEMV streams its blocks at a fifth of the rate the float32
one does. Where the precision knows each stage's matrices as they run
(``Precision.formats``, explain/stage_formats.py), this module re-prices those stages:

- weight bytes: each matrix at its own format's size (a Q4_K_M file's Q6_K ``v_proj``
  layers at 210/256 bytes a value, its Q4_K ones at 144/256), times the share of the
  stage's weights the pass reads (experts: the ones its tokens route to);
- memory time: each matrix's bytes over the GEMV rate the probe measured for its format,
  activations and call shape (``HardwareSpec.gemv_rates``: ``"Q4_K/float32/2048x1536"``,
  else ``"Q4_K/float32"``, else the read bandwidth), plus the activations' bytes over the
  bandwidth;
- compute time: the FLOPs over the GEMM rate of the format (``gemm_rates``), else the peak.
  With one row (a batch-1 decode step) the GEMV's measured time already holds its
  arithmetic: the stage's time is the GEMV's, and it is memory-bound.

A hardware preset has no kernel rates: only the bytes change (formats sized as they run).

Which kernel runs a layer's matmuls depends on the step's path (the trace says which:
``StepRecord.native_decode``). Module by module, each is a module call (``QuantLinear``:
Python, an output allocation, the ctypes call; a matrix of fewer than 2^20 multiply-adds on
one thread): priced at the shape's module rate (``"Q4_1/float32/576x576"``), whose probe
pays all of that once per call. In the native decode call (csrc/drivers/decode.c) they are
C calls of the step's own matmul, split over its pool whatever their size: priced at the
shape's native rate (``"Q4_1/float32/576x576/native"``, probed through the same C matmul:
probe_kernels.measure_native_gemv), which holds none of a module call's cost. The LM head
runs after the call, as a module, on either path (``NATIVE_STAGES`` lists what the call runs).

The cache rule: a matrix is read from memory unless it is still in the last-level cache
since the step before, which it is only if everything the step reads and writes between its
two reads (the whole step: every matrix, the KV cache read, the activations: its "hot data")
fits in the cache beside what else the machine keeps there. A step whose hot data is at most
``CACHE_SHARE`` of ``HardwareSpec.cache_bytes`` reads each matrix at its call shape's
cache-resident GEMV rate (``"Q4_1/float32/576x576/resident"``, probed with the copies filling
a quarter of the cache), any other at its streamed rate. A decode step of SmolLM2-135M in
Q4_1 reads ~96 MB against a 32 MB cache: streamed, every matrix.

Invariant: a re-priced stage keeps its name, count, parameters, FLOPs and non-weight bytes.
"""

from __future__ import annotations

from dataclasses import replace

from inferpath.explain.cost import LAYER_MATMUL_STAGES
from inferpath.explain.stage_formats import MatrixRun, bytes_per_value


CACHE_SHARE = 0.5  # of the last-level cache a step's hot data may fill and stay there (module doc)
NATIVE = "native"  # the suffix of a shape key measured through the native step's matmul
# the stages the native decode call runs (the layers' matmuls); the LM head is a module on both paths
NATIVE_STAGES = frozenset(LAYER_MATMUL_STAGES)


def rate_format(run: MatrixRun, stage: str, repacked: tuple = ()) -> str:
    """The format a rate key names for ``run`` of ``stage``: ``"Q4_K_R8"`` where the loader
    repacks it by 8 rows (a layer matrix of a format in ``repacked``, ``Precision.repacked``,
    whose shape r8.c takes: rows of 8, columns of 256), else its own. NOTE: an untied LM head
    of a repacked format is repacked too, but is keyed here as laid out (its module rate)."""
    from inferpath.explain.probe_weights import R8

    takes = run.rows % 8 == 0 and run.cols % 256 == 0
    return run.format + R8 if run.format in repacked and stage in NATIVE_STAGES and takes else run.format


def gemv_rate(hardware, run: MatrixRun, activations: str, resident: bool = False, native: bool = False,
              fmt: str | None = None) -> float:
    """Bytes/s of ``run``'s GEMV: its shape's measured rate (``native``: the native step's
    first; ``resident``: the cache-resident one first), its format's, or the bandwidth;
    ``fmt``: the format as it runs (``rate_format``; default the run's)."""
    rates = hardware.gemv_rates
    fmt = fmt or run.format
    shape = f"{fmt}/{activations}/{run.call_rows}x{run.cols}"
    keys = [f"{shape}/{NATIVE}", shape] if native else [shape]
    for key in keys:
        rate = (resident and rates.get(f"{key}/resident")) or rates.get(key)
        if rate:
            return rate
    return rates.get(f"{fmt}/{activations}") or rates.get(f"{run.format}/{activations}") or hardware.memory_bandwidth


def hot_bytes(stages: tuple) -> float:
    """What a pass of ``stages`` reads and writes (module doc: its hot data)."""
    return sum(s.bytes_read + s.bytes_written for s in stages if s.on_accelerator)


def stays_in_cache(hardware, hot: float) -> bool:
    """The cache rule: a pass moving ``hot`` bytes keeps its matrices in the cache between passes."""
    return bool(hardware.cache_bytes) and hot <= CACHE_SHARE * hardware.cache_bytes


def price_stages(stages: tuple, precision, hardware, native: bool = False) -> tuple:
    """``stages`` with each one ``precision.formats`` describes re-priced (module doc),
    cache-resident where the priced pass's hot data passes the cache rule; ``native``: a
    step of the native decode call (its layers' matmuls at the native rates)."""
    formats = dict(precision.formats)
    if not formats:
        return stages

    def priced(resident: bool) -> tuple:
        return tuple(price_stage(s, formats[s.name], precision, hardware, resident,
                                 native and s.name in NATIVE_STAGES)
                     if s.name in formats and s.flops else s for s in stages)

    streamed = priced(False)
    return priced(True) if stays_in_cache(hardware, hot_bytes(streamed)) else streamed


def price_stage(stage, runs: tuple[MatrixRun, ...], precision, hardware, resident: bool = False,
                native: bool = False):
    values = sum(r.values for r in runs)
    mean_bytes = values * precision.weight_bytes
    share = min(1.0, stage.weight_bytes / mean_bytes) if mean_bytes else 1.0  # experts: those touched
    activations = precision.activation_format
    peak, bandwidth = hardware.flops_for(precision.compute_dtype), hardware.memory_bandwidth
    weights = gemv_s = gemm_s = 0.0
    for run in runs:
        run_bytes = share * run.values * bytes_per_value(run.format)
        weights += run_bytes
        fmt = rate_format(run, stage.name, precision.repacked)
        gemv_s += run_bytes / gemv_rate(hardware, run, activations, resident, native, fmt)
        gemm_s += stage.flops * run.values / values / (hardware.gemm_rates.get(f"{run.format}/{activations}") or peak)
    rows = stage.flops / (2 * share * values) if values else 1.0  # activation rows per matrix read
    other = stage.bytes_read - stage.weight_bytes + stage.bytes_written
    compute_s = min(gemm_s, gemv_s) if rows < 1.5 else gemm_s  # one row: the GEMV's time is the time
    return replace(stage, weight_bytes=weights, bytes_read=stage.bytes_read - stage.weight_bytes + weights,
                   memory_time_s=gemv_s + other / bandwidth, compute_time_s=compute_s)


def gemv_shapes(precision, native: bool = False) -> list[str]:
    """The rate keys of every call shape ``precision.formats`` runs, streamed and resident
    (what the probe measures for a model: probe_kernels.with_gemv_shapes); ``native``: the
    layers' shapes through the native step's matmul too (``".../native"``)."""
    act = precision.activation_format
    keys = {f"{rate_format(r, name, precision.repacked)}/{act}/{r.call_rows}x{r.cols}"
            for name, runs in precision.formats for r in runs}
    if native:
        keys |= {f"{rate_format(r, name, precision.repacked)}/{act}/{r.call_rows}x{r.cols}/{NATIVE}"
                 for name, runs in precision.formats if name in NATIVE_STAGES for r in runs}
    return sorted(keys | {f"{k}/resident" for k in keys})
