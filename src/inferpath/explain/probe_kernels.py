"""The rate of each matmul kernel the engine runs, per weight format: what a stage costs here.

A decode step's matmuls are one GEMV per weight (one row of activations), a prompt's are a
GEMM over its rows, and each weight format has its own kernel (kernels/quantized.py for
the GGUF blocks, kernels/modules.py ``CPULinear`` for float weights, kernels/bf16_weights.py
for bf16 weights beside float32 activations). The same bytes cost a different time in
each: on this 2-core AMD EPYC a Q4_1 GEMV streams ~4 GB/s where the float32 one streams
~25. So the probe times every format through the module the engine builds for it:

- GEMV: one row against a weight of ``GEMV_BYTES`` (larger than a last-level cache of
  32 MB, so the weight streams from memory as a model's do), the weight's bytes over the
  best time: bytes/s;
- the same GEMV of each call shape a model runs, streamed (enough copies, each called once a
  round, to pass ``GEMV_BYTES``: from memory) and resident (``"...x576/resident"``: copies
  filling at most a quarter of the last-level cache, ``llc_bytes``, so they stay in it
  between rounds): the two rates kernel_cost.py's cache rule chooses between; streamed
  copies pass at least ``STREAM_LLC_MULTIPLE`` last-level caches (``streamed_bytes``);
- the same shapes as the native decode step runs them (``".../native"``,
  ``measure_native_gemv``: one C call over the copies through decode.c's matmul and pool, no
  module call between them): what a native step's layer matmuls are priced at;
- GEMM: ``GEMM_ROWS`` rows (a chat prompt's order of size) against a 1024 x 2048 weight:
  FLOP/s.

Keys are ``"FORMAT/ACTIVATIONS"``: ``"Q4_K/float32"``, ``"F32/float32"``, ``"BF16/float32"``
(widened in the kernel), ``"BF16/bfloat16"``; ``"Q4_K_R8"`` is Q4_K repacked by 8 rows. The
weights are random, in the engine's own module for each format (explain/probe_weights.py).
Each figure is the best of ``REPEATS`` runs; the whole measurement takes a few seconds.

Invariant: every rate recorded is positive; a format whose kernel does not run here
(no native kernels) is left out, and the cost model falls back to bandwidth and peak.
"""

from __future__ import annotations

import time

from inferpath.explain.probe_weights import (R8, file_bytes_per_value, file_format,  # noqa: F401 - re-exported
                                             linear_weight_bytes, random_blocks, random_linear)

# the names these had here before probe_weights.py (tests import them from this module)
_linear, _bytes_per_value, _weight_bytes = random_linear, file_bytes_per_value, linear_weight_bytes

GEMV_BYTES = 48 * 2**20  # at most: gemv_bytes()
GEMM_ROWS = 64
IN_FEATURES = 2048  # a multiple of every block (256 values for the K formats)
REPEATS = 4
MAX_COPIES = 1024  # of a small matrix, to stream GEMV_BYTES of them
RESIDENT = "resident"  # the suffix of a shape key measured in the cache
NATIVE = "native"  # after the shape: measured through the native decode step's matmul (kernel_cost.py)
STREAM_LLC_MULTIPLE = 3  # a streamed GEMV probe passes at least this many last-level caches of copies
BLOCK_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def rate_key(fmt: str, activations: str) -> str:
    """e.g. rate_key("Q4_K", "float32") == "Q4_K/float32"."""
    return f"{fmt}/{activations}"


def measure_kernel_rates() -> dict[str, dict[str, float]]:
    """{"gemv": {"FORMAT/ACTIVATIONS": bytes/s}, "gemm": {...: FLOP/s}} of every format whose
    kernel runs on this CPU, GEMV over 1536 x 2048 weights (module doc)."""
    import torch

    from inferpath.kernels.quantized import quantized_kernels_available

    keys = [rate_key("F32", "float32"), rate_key("BF16", "float32"), rate_key("BF16", "bfloat16")]
    if quantized_kernels_available():
        keys += [rate_key(fmt, "float32") for fmt in BLOCK_FORMATS]
    gemv, gemm = {}, {}
    with torch.inference_mode():
        for key in keys:
            fmt, act = key.split("/")
            gemv[key] = measure_gemv(fmt, act, 1536, IN_FEATURES)
            small = random_linear(fmt, 1024, IN_FEATURES)
            rows = torch.randn(GEMM_ROWS, IN_FEATURES).to(getattr(torch, act))  # (GEMM_ROWS, in)
            gemm[key] = 2 * GEMM_ROWS * IN_FEATURES * 1024 / _best(lambda: small(rows))
    return {"gemv": gemv, "gemm": gemm}


def measure_module_call() -> float:
    """Seconds of one call of a tiny stage through the engine's module (CPURMSNorm on one row
    of 576): what a stage costs beyond its bytes when a step runs the module path — the
    Python of ``forward``, the dispatch into the kernel, the threads' wake-up."""
    import torch

    from inferpath.kernels.modules import CPURMSNorm

    norm = CPURMSNorm(576, 1e-5).prepare()
    x = torch.randn(1, 576)  # (1, hidden)
    with torch.inference_mode():
        norm(x)

        def run():
            for _ in range(100):
                norm(x)

        return _best(run) / 100


def measure_gemv(fmt: str, activations: str, rows: int, cols: int, resident: bool = False) -> float:
    """Bytes/s of one activation row against (rows, cols) weights of ``fmt`` through the
    engine's module for it: enough copies to pass GEMV_BYTES (``MAX_COPIES`` at most; a
    matrix larger than that is cut to GEMV_BYTES' worth of rows), each called once a round;
    ``resident``: as many as fill a quarter of the last-level cache (at least one), so the
    rounds after the first read them from the cache."""
    import torch

    rows, copies = _copies(fmt, rows, cols, resident)
    with torch.inference_mode():
        linears = [random_linear(fmt, rows, cols) for _ in range(copies)]
        one = torch.randn(1, cols).to(getattr(torch, activations))  # (1, in)

        def run():
            for linear in linears:
                linear(one)

        return sum(linear_weight_bytes(linear) for linear in linears) / _best(run)


def measure_native_gemv(fmt: str, activations: str, rows: int, cols: int, resident: bool = False) -> float | None:
    """Bytes/s of the same GEMVs as ``measure_gemv`` (the same copies, streamed or
    ``resident``) as the native decode step runs them: one C call looping over the copies
    through the step's own matmul and pool (csrc/drivers/decode.c
    ``inferpath_decode_matmuls``), so none of a module call's Python, allocation and
    dispatch is in the time, and the step's threading rule is (the module path's
    ``inferpath_quant_matmul`` keeps a matrix under 2^20 multiply-adds on one thread; the
    step splits every matmul over its pool). None where that call is not built here."""
    import torch

    fn = native_matmul_fn(fmt, activations)
    if fn is None:
        return None
    rows, copies = _copies(fmt, rows, cols, resident)
    with torch.inference_mode():
        linears = [random_linear(fmt, rows, cols) for _ in range(copies)]
        run = native_matmul_call(fn, fmt, activations, linears)
        return sum(linear_weight_bytes(linear) for linear in linears) / _best(run)


def native_matmul_fn(fmt: str, activations: str):
    """The native decode step's matmul (``inferpath_decode_matmuls``) for weights of ``fmt``
    beside ``activations`` rows, None where it is not built here (or takes no such pair)."""
    import torch

    from inferpath.kernels import build
    from inferpath.kernels.groups import GGUF_FLOAT_TYPES

    dtype = getattr(torch, activations)
    if dtype not in GGUF_FLOAT_TYPES or fmt == "F16":
        return None
    return build.native_decode_matmuls(dtype if fmt in ("F32", "BF16") else "quantized")


def native_matmul_call(fn, fmt: str, activations: str, linears: list):
    """``run(count=len(linears))``: ``fn`` over the first ``count`` of ``linears`` (one shape,
    from ``random_linear``) against one fresh row of x; raises where the C rejects the call. The
    closure keeps the weights, row and output alive."""
    import ctypes

    import torch

    from inferpath.kernels.groups import GGUF_FLOAT_TYPES
    from inferpath.kernels.repacked import kernel_type

    dtype = getattr(torch, activations)
    floats = fmt in ("F32", "BF16")
    weights = [linear.weight if floats else linear.qweight.data for linear in linears]
    pointers = (ctypes.c_void_p * len(weights))(*(w.data_ptr() for w in weights))
    qtype = GGUF_FLOAT_TYPES[weights[0].dtype] if floats else kernel_type(linears[0].qweight)
    rows, cols = linears[0].out_features, linears[0].in_features
    row_bytes = weights[0].shape[1] * weights[0].element_size()
    one = torch.randn(1, cols).to(dtype)  # (1, in)
    out = torch.empty(1, rows, dtype=dtype)  # (1, rows)
    threads = torch.get_num_threads()

    def run(count: int = len(linears)):
        status = fn(count, qtype, pointers, row_bytes, rows, one.data_ptr(), out.data_ptr(), 1, cols, threads, 0,
                    GGUF_FLOAT_TYPES[dtype])
        if status:
            raise RuntimeError(f"inferpath_decode_matmuls rejected {fmt} {rows}x{cols} (status {status})")

    run.keep = (linears, one, out, pointers)
    return run


def _copies(fmt: str, rows: int, cols: int, resident: bool) -> tuple[int, int]:
    """(rows, copies) of a (rows, cols) ``fmt`` matrix that a GEMV probe calls once a round
    (``measure_gemv``'s doc)."""
    per_matrix = rows * cols * file_bytes_per_value(fmt)
    total = max(per_matrix, llc_bytes() / 4) if resident else streamed_bytes()
    if per_matrix > total:
        return max(1, int(total / (cols * file_bytes_per_value(fmt)))), 1
    if resident:
        return rows, max(1, int(total // per_matrix))
    return rows, min(MAX_COPIES, -(-total // int(per_matrix)))


def busy() -> bool:
    """More than probe_guard.BUSY_LOAD_PER_CPU runnable tasks a CPU now."""
    import os

    from inferpath.explain.probe_guard import BUSY_LOAD_PER_CPU, load_now

    return load_now() / (os.cpu_count() or 1) > BUSY_LOAD_PER_CPU


def gemv_bytes() -> int:
    """GEMV_BYTES, or a quarter of the probe's bandwidth buffer where that is smaller (the
    probe's sizes shrink together: a test's small probe times small GEMVs)."""
    from inferpath.explain import probe

    return min(GEMV_BYTES, probe.DEFAULT_BANDWIDTH_BYTES // 4)


def streamed_bytes() -> int:
    """What a streamed GEMV probe passes: ``gemv_bytes()``, and at least
    ``STREAM_LLC_MULTIPLE`` last-level caches where the probe is full size. NOTE: two
    copies of SmolLM2's 30 MB Q8_0 head (48 MB) kept part of it in the 32 MB cache between
    rounds, and priced the head ~1.4x faster than a decode step reads it (~100 MB between
    two reads of it)."""
    base = gemv_bytes()
    return max(base, STREAM_LLC_MULTIPLE * llc_bytes()) if base == GEMV_BYTES else base


def measure_gemv_key(key: str) -> float | None:
    """``measure_gemv`` of a shape key "FORMAT/ACTIVATIONS/ROWSxCOLS", or of one ending in
    "/resident" (cache-resident); ``measure_native_gemv`` of one with "/native" after the
    shape (None where the native call is not built)."""
    fmt, act, shape, *rest = key.split("/")
    rows, cols = (int(v) for v in shape.split("x"))
    resident = RESIDENT in rest
    if NATIVE in rest:
        return measure_native_gemv(fmt, act, rows, cols, resident=resident)
    return measure_gemv(fmt, act, rows, cols, resident=resident)


def llc_bytes() -> int:
    """Bytes of this CPU's last-level cache (the highest cache level sysfs lists for CPU 0),
    0 where sysfs does not say."""
    from pathlib import Path

    best_level, size = 0, 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        value = int(text.rstrip("KMG")) * scale if text.rstrip("KMG").isdigit() else 0
        if level > best_level and value:
            best_level, size = level, value
    return size


def _best(fn) -> float:
    fn()  # warm up: first touch, kernel selection
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def with_gemv_shapes(hardware, keys: list[str], refresh: bool = False, cache_path=None, measure: bool = True):
    """``hardware`` with the GEMV rates of the call shapes ``keys`` (kernel_cost.gemv_shapes)
    measured and cached beside this machine's probe (``"shape_gemv"``: a re-probe drops them;
    none measured on a busy machine is kept);
    a preset is returned as it is. ``refresh`` measures them again; ``measure=False`` takes
    only those cached (a server, whose engine may be decoding: measuring beside it would
    slow both and cache a rate of a shared machine)."""
    from dataclasses import replace

    from inferpath.explain.hardware import THIS_MACHINE
    from inferpath.explain.probe import cached_entry, store
    from inferpath.explain.probe_guard import load_now

    if hardware.name != THIS_MACHINE or not keys:
        return hardware
    path, cached, key = cached_entry(cache_path=cache_path)
    known = {} if refresh else dict(cached.get(key, {}).get("shape_gemv", {}))
    missing = [k for k in keys if k not in known] if measure else []
    load = load_now()  # before measuring, as the probe's (probe_guard.py)
    layer = [k for k in keys if k.endswith("/" + NATIVE)]  # streamed native shapes: one sequence
    if any(k in missing for k in layer):  # one missing: the whole layer again, so they share a moment
        from inferpath.explain.probe_layers import measure_layer_sequence

        known.update(measure_layer_sequence(layer))
        missing = [k for k in missing if k not in layer] + [k for k in layer if k in known]
    for k in [k for k in missing if k not in layer]:
        rate = measure_gemv_key(k)
        if rate is not None:  # a native shape where the call is not built: priced at the module rate
            known[k] = rate
    missing = list(dict.fromkeys(k for k in missing if k in known))
    if missing and not busy():  # a rate of a busy machine serves this run, and is not kept
        path, cached, key = cached_entry(cache_path=cache_path)  # another process may have written
        if key in cached:  # rates live beside the probe they belong to, never alone
            cached[key].setdefault("shape_gemv", {}).update({k: known[k] for k in missing})
            cached[key].setdefault("shape_gemv_load", {}).update({k: load for k in missing})
            store(path, cached)
    return replace(hardware, gemv_rates={**hardware.gemv_rates, **known}, cache_bytes=llc_bytes())
