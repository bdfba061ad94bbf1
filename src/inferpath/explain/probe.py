"""Measure ``this-machine`` as the engine will use it: read bandwidth and matmul rates.

Each figure is the best of a few repeats, so it approximates what the machine can do,
not what a busy moment gave:
- read bandwidth: ``x.sum()`` over a large fp32 tensor reads ``x.nbytes`` (the roof);
- copy bandwidth: ``y.copy_(x)`` reads and writes ``x.nbytes`` each (counted twice);
- GEMM FLOP/s per dtype (fp32, bf16): an ``n x n`` activation against an ``n x n`` weight
  through the engine's own linear (``kernels.ops.small_batch_linear`` with the kernels the
  engine would choose for that weight: the native ones where this CPU and build have them,
  oneDNN/MKL otherwise), ``2 n^3`` FLOPs;
- GEMV bandwidth per dtype: one row against the same weight through the same call, the
  weight's bytes over the time (what a batch-1 decode step's matmuls attain).

A dtype this machine has no fast kernel for (bf16 on a CPU without AVX512-BF16) is
measured as slow, so its ridge point (peak / bandwidth) is small but positive and most
stages come out compute-bound, which is what they are here.

Results are cached as JSON under ``$INFERPATH_CACHE`` (default ``~/.cache/inferpath``),
keyed by what changes them: CPU model and flags, torch version, kernel level and build,
thread count and sizes (``probe_key``). ``refresh=True`` (``--reprobe``) measures again.

NOTE: a cached figure must not lie for long (probe_guard.py). Each measurement records
the load average it was taken under; one taken on a busy machine is measured again once
the machine is quieter, and one that a real step has beaten (a decode step that read its
bytes faster than the probed bandwidth allows) is marked stale, its floor raised to what
the step attained, and measured again on the next use.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

from inferpath.explain.hardware import THIS_MACHINE, HardwareSpec
from inferpath.explain.probe_kernels import llc_bytes
from inferpath.explain.probe_guard import carry_observed, load_now, observe, raised_bandwidth, reprobe_reason

DEFAULT_BANDWIDTH_BYTES = 256 * 2**20
DEFAULT_MATMUL_N = 1024
_REPEATS = 5
_BANDWIDTH_REPEATS = 9  # the floor every fraction is quoted against: the best of more short runs
_DTYPES = (("fp32", "float32"), ("bf16", "bfloat16"))
# GGUF block formats whose kernels the probe times (QuantLinear, the engine's path for a
# quantized file); the slower one is the "quantized" compute rate the cost model uses
_QUANT_TYPES = ("Q8_0", "Q4_K")
# what a measurement holds; a new one (v3: each weight format's kernel rates, a module call's cost) measures anew
PROBE_VERSION = "v3"


def cache_dir() -> Path:
    """``$INFERPATH_CACHE`` or ``~/.cache/inferpath`` (the same root as inferpath.models)."""
    return Path(os.environ.get("INFERPATH_CACHE") or "~/.cache/inferpath").expanduser()


def kernel_level() -> str:
    """The kernel level the engine runs at, as the kernels resolve it (``$INFERPATH_ISA``
    forces a lower one): "generic", "avx2", "avxvnni" or "avx512", with "+amx" where the bf16 AMX
    GEMM runs; "off" with ``INFERPATH_KERNELS=0``; an ``INFERPATH_ISA`` the kernels refuse
    keys the cache as written (the engine refuses it with the kernels' message)."""
    import torch

    from inferpath.kernels import build

    if os.environ.get("INFERPATH_KERNELS", "1") == "0":
        return "off"
    try:
        level = build.active_level()
    except ValueError:
        return os.environ.get("INFERPATH_ISA", "").strip().lower()
    amx = level == "avx512" and build.native_amx_gemm(torch.bfloat16, level) is not None
    return level + ("+amx" if amx else "")


def kernel_build() -> str:
    """The build of the kernels' library (changes with their sources: new kernels measure
    anew); "" where none runs."""
    from inferpath.kernels import build

    try:
        return build.library_build()
    except ValueError:  # an INFERPATH_ISA the kernels refuse: kernel_level() keys it
        return ""


def cpu_flags() -> frozenset[str]:
    """The CPU's flags, as the kernels read them (kernels/build.py)."""
    from inferpath.kernels import build

    return build._cpu_flags()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_key(device: str, threads: int, bandwidth_bytes: int, matmul_n: int) -> str:
    """The cache key: everything that changes what the probe measures."""
    import torch

    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    return (f"{device}|{cpu_model()}|flags-{flags}|torch-{torch.__version__}|isa-{kernel_level()}"
            f"|kernels-{kernel_build()}|t{threads}|b{bandwidth_bytes}|n{matmul_n}|{PROBE_VERSION}")


def probe_this_machine(device: str = "cpu", bandwidth_bytes: int | None = None,
                       matmul_n: int | None = None, refresh: bool = False,
                       cache_path: Path | None = None) -> HardwareSpec:
    """Measured HardwareSpec of this machine, from the cache unless ``refresh``."""
    import torch

    bandwidth_bytes = bandwidth_bytes or DEFAULT_BANDWIDTH_BYTES
    matmul_n = matmul_n or DEFAULT_MATMUL_N
    threads = torch.get_num_threads()
    key = probe_key(device, threads, bandwidth_bytes, matmul_n)
    path = cache_path or cache_dir() / "probe.json"
    cached = _load(path)
    if not refresh and key in cached and not reprobe_reason(cached[key], load_now()):
        return spec_from_measurement(cached[key])
    measured = measure(device, bandwidth_bytes, matmul_n)
    measured["threads"] = threads
    measured["kernel_level"] = kernel_level()
    cached = _load(path)  # another process may have written meanwhile
    cached[key] = carry_observed(cached.get(key), measured)
    _store(path, cached)
    return spec_from_measurement(cached[key])


def note_observed(bytes_per_second: float, device: str = "cpu", cache_path: Path | None = None) -> bool:
    """A real step read its bytes at ``bytes_per_second``: if that beats the cached probe of
    this configuration (default sizes, the current thread count), mark it stale and raise its
    floor (probe_guard.py). True if it did."""
    import torch

    key = probe_key(device, torch.get_num_threads(), DEFAULT_BANDWIDTH_BYTES, DEFAULT_MATMUL_N)
    path = cache_path or cache_dir() / "probe.json"
    cached = _load(path)
    if key not in cached or not observe(cached[key], bytes_per_second):
        return False
    _store(path, cached)
    return True


def cached_entry(device: str = "cpu", cache_path: Path | None = None) -> tuple[Path, dict, str]:
    """(the cache file, its contents, the key of this configuration's entry): what
    ``note_observed`` and the shape rates (probe_kernels.py) update."""
    import torch

    key = probe_key(device, torch.get_num_threads(), DEFAULT_BANDWIDTH_BYTES, DEFAULT_MATMUL_N)
    path = cache_path or cache_dir() / "probe.json"
    return path, _load(path), key


def store(path: Path, cached: dict) -> None:
    _store(path, cached)


def with_measured(hardware: HardwareSpec, field: str, keys, measure_one, refresh: bool = False,
                  cache_path: Path | None = None, measure: bool = True) -> HardwareSpec:
    """``hardware`` with its dict ``field`` holding every key of ``keys``: measured by
    ``measure_one(key)`` (None: not measurable here, left out) or cached beside this
    machine's probe under ``field`` (JSON lists read back as tuples); a busy machine's figures
    are used and not kept; ``refresh`` measures again; ``measure=False`` takes the cached
    ones only. A preset is returned as it is (its stages keep the roofline)."""
    from inferpath.explain.probe_kernels import busy

    keys = sorted({k for k in keys if k})
    if hardware.name != THIS_MACHINE or not keys:
        return hardware
    path, cached, entry = cached_entry(cache_path=cache_path)
    known = {} if refresh else {k: tuple(v) if isinstance(v, list) else v
                                for k, v in cached.get(entry, {}).get(field, {}).items()}
    missing = [k for k in keys if k not in known] if measure else []
    for k in missing:
        value = measure_one(k)
        if value is not None:
            known[k] = value
    if missing and not busy():
        path, cached, entry = cached_entry(cache_path=cache_path)
        if entry in cached:
            cached[entry].setdefault(field, {}).update({k: known[k] for k in missing if k in known})
            store(path, cached)
    return replace(hardware, **{field: {**getattr(hardware, field), **known}})


def _store(path: Path, cached: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cached, indent=2))
    tmp.replace(path)  # atomic: a concurrent reader sees the old or the new file


def spec_from_measurement(m: dict) -> HardwareSpec:
    """The HardwareSpec of a measurement; every figure must be positive (a zero rate would
    make a ridge of 0 and call everything compute-bound)."""
    for name in ("read_bandwidth", "fp32_flops", "bf16_flops"):
        if not m.get(name, 0) > 0:
            raise ValueError(f"probe measurement {name}={m.get(name)!r} is not a positive rate; "
                             "run with --reprobe")
    names = [d for d, _ in _DTYPES] + [t.lower() for t in _QUANT_TYPES]
    gemv = "".join(f", {d} GEMV {m[f'{d}_gemv_bandwidth'] / 1e9:.1f} GB/s" for d in names
                   if f"{d}_gemv_bandwidth" in m)
    quant = "".join(f", {t} GEMM {m[f'{t.lower()}_flops'] / 1e9:.1f} GFLOP/s" for t in _QUANT_TYPES
                    if f"{t.lower()}_flops" in m)
    peak_flops = {"fp32": m["fp32_flops"], "bf16": m["bf16_flops"]}
    quant_rates = [m[f"{t.lower()}_flops"] for t in _QUANT_TYPES if m.get(f"{t.lower()}_flops", 0) > 0]
    if quant_rates:
        peak_flops["quantized"] = min(quant_rates)
    bandwidth, raised = raised_bandwidth(m)
    load = (f", load average {m['load_average']:.2f} on {m.get('cpus', '?')} CPUs"
            if "load_average" in m else "")
    rates = m.get("kernel_rates", {})
    return HardwareSpec(
        name=THIS_MACHINE, memory_bandwidth=bandwidth,
        peak_flops=peak_flops,
        gemv_rates={**rates.get("gemv", {}), **m.get("shape_gemv", {})}, gemm_rates=dict(rates.get("gemm", {})),
        module_call_s=m.get("module_call_s", 0.0), cache_bytes=llc_bytes(),
        memory_bytes=m["memory_bytes"],
        source=(f"measured on {m['device']} with {m.get('threads', '?')} threads, kernels "
                f"{m.get('kernel_level', '?')}: read {m['read_bandwidth'] / 1e9:.1f} GB/s, copy "
                f"{m['copy_bandwidth'] / 1e9:.1f} GB/s, fp32 GEMM {m['fp32_flops'] / 1e9:.1f} GFLOP/s, "
                f"bf16 GEMM {m['bf16_flops'] / 1e9:.1f} GFLOP/s{quant}{gemv}{load}{raised}"),
    )


def measure(device: str, bandwidth_bytes: int, matmul_n: int) -> dict:
    import torch

    from inferpath.kernels.ops import linear_kernels, small_batch_linear

    numel = bandwidth_bytes // 4
    x = torch.ones(numel, dtype=torch.float32, device=device)  # (numel,)
    y = torch.empty_like(x)
    result = {
        "device": device,
        "load_average": load_now(),  # before measuring: the probe's own load is not counted
        "cpus": os.cpu_count() or 1,
        "measured_at": time.time(),
        "read_bandwidth": x.nbytes / _best_time(lambda: x.sum(), device, repeats=_BANDWIDTH_REPEATS),
        "copy_bandwidth": 2 * x.nbytes / _best_time(lambda: y.copy_(x), device),
        "memory_bytes": _memory_bytes(device),
        "bandwidth_bytes": bandwidth_bytes,
        "matmul_n": matmul_n,
    }
    del x, y
    n = matmul_n
    with torch.inference_mode():
        for name, dtype_name in _DTYPES:
            dtype = getattr(torch, dtype_name)
            weight = torch.randn(n, n, device=device).to(dtype)  # (out, in), as nn.Linear holds it
            kernels = linear_kernels(weight, None)
            rows = torch.randn(n, n, device=device).to(dtype)  # (n tokens, in)
            one = rows[:1].contiguous()  # (1, in)
            gemm_s = _best_time(lambda: small_batch_linear(rows, weight, None, kernels), device)
            gemv_s = _best_time(lambda: small_batch_linear(one, weight, None, kernels), device)
            result[f"{name}_flops"] = 2 * n**3 / gemm_s
            result[f"{name}_gemv_bandwidth"] = weight.nbytes / gemv_s
        result.update(measure_quantized(device, n))
    if device == "cpu":  # each weight format's own kernel (probe_kernels.py)
        from inferpath.explain.probe_kernels import measure_kernel_rates, measure_module_call

        result["kernel_rates"] = measure_kernel_rates()
        result["module_call_s"] = measure_module_call()
    return result


def measure_quantized(device: str, n: int) -> dict:
    """GEMM FLOP/s (n rows) and GEMV bytes/s (one row) of the engine's quantized linear
    (``QuantLinear``: the fused int8 kernels, gemm.c's panels for many rows at the avx512
    level, dequantized tiles for many rows below it)
    for each of ``_QUANT_TYPES``; nothing where the native kernels do not run."""
    import torch

    from inferpath.kernels.quantized import QuantLinear, quantized_kernels_available
    from inferpath.weights.quantize import quantization_type, quantize_tensor

    if device != "cpu" or not quantized_kernels_available():
        return {}
    result = {}
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(n, n, generator=generator)  # (n tokens, in)
    one = rows[:1].contiguous()  # (1, in)
    for type_name in _QUANT_TYPES:
        weight = quantize_tensor(torch.randn(n, n, generator=generator).numpy(), quantization_type(type_name))
        linear = QuantLinear(weight)
        gemm_s = _best_time(lambda: linear(rows), device)
        gemv_s = _best_time(lambda: linear(one), device)
        result[f"{type_name.lower()}_flops"] = 2 * n**3 / gemm_s
        result[f"{type_name.lower()}_gemv_bandwidth"] = weight.nbytes / gemv_s
    return result


def _best_time(fn, device: str, repeats: int = _REPEATS) -> float:
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()  # warm up: first-touch page faults, kernel selection
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def _memory_bytes(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
