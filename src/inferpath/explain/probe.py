"""Measure ``this-machine``: memory bandwidth (read, copy) and matmul FLOP/s (fp32, bf16).

Each figure is the best of a few repeats of one large operation, so it approximates what
the machine can do, not what a busy moment gave:
- read bandwidth: ``x.sum()`` over a large fp32 tensor reads ``x.nbytes``;
- copy bandwidth: ``y.copy_(x)`` reads and writes ``x.nbytes`` each (counted twice);
- matmul: ``a @ b`` with square ``n x n`` operands does ``2 n^3`` FLOPs.

The roofline uses the read bandwidth (weights are read, not copied). Results are cached as
JSON under ``$INFERPATH_CACHE`` (default ``~/.cache/inferpath``), keyed by device,
thread count and sizes, since they cost seconds to measure and change rarely.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from inferpath.explain.hardware import THIS_MACHINE, HardwareSpec

DEFAULT_BANDWIDTH_BYTES = 256 * 2**20
DEFAULT_MATMUL_N = 1024
_REPEATS = 5


def cache_dir() -> Path:
    """``$INFERPATH_CACHE`` or ``~/.cache/inferpath`` (the same root as inferpath.models)."""
    return Path(os.environ.get("INFERPATH_CACHE") or "~/.cache/inferpath").expanduser()


def probe_this_machine(device: str = "cpu", bandwidth_bytes: int | None = None,
                       matmul_n: int | None = None, refresh: bool = False,
                       cache_path: Path | None = None) -> HardwareSpec:
    """Measured HardwareSpec of this machine, from the cache unless ``refresh``."""
    import torch

    bandwidth_bytes = bandwidth_bytes or DEFAULT_BANDWIDTH_BYTES
    matmul_n = matmul_n or DEFAULT_MATMUL_N

    threads = torch.get_num_threads()
    key = f"{device}-t{threads}-b{bandwidth_bytes}-n{matmul_n}"
    path = cache_path or cache_dir() / "probe.json"
    cached = _load(path)
    if not refresh and key in cached:
        return spec_from_measurement(cached[key])
    measured = measure(device, bandwidth_bytes, matmul_n)
    measured["threads"] = threads
    cached[key] = measured
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cached, indent=2))
    tmp.replace(path)  # atomic: a concurrent reader sees the old or the new file
    return spec_from_measurement(measured)


def spec_from_measurement(m: dict) -> HardwareSpec:
    return HardwareSpec(
        name=THIS_MACHINE, memory_bandwidth=m["read_bandwidth"],
        peak_flops={"fp32": m["fp32_flops"], "bf16": m["bf16_flops"]},
        memory_bytes=m["memory_bytes"],
        source=(f"measured on {m['device']} with {m.get('threads', '?')} threads: read "
                f"{m['read_bandwidth'] / 1e9:.1f} GB/s, copy {m['copy_bandwidth'] / 1e9:.1f} GB/s, "
                f"fp32 {m['fp32_flops'] / 1e9:.1f} GFLOP/s, bf16 {m['bf16_flops'] / 1e9:.1f} GFLOP/s"),
    )


def measure(device: str, bandwidth_bytes: int, matmul_n: int) -> dict:
    import torch

    numel = bandwidth_bytes // 4
    x = torch.ones(numel, dtype=torch.float32, device=device)  # (numel,)
    y = torch.empty_like(x)
    read_s = _best_time(lambda: x.sum(), device)
    copy_s = _best_time(lambda: y.copy_(x), device)
    flops = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(matmul_n, matmul_n, device=device).to(dtype)  # (n, n)
        b = torch.randn(matmul_n, matmul_n, device=device).to(dtype)  # (n, n)
        flops[name] = 2 * matmul_n**3 / _best_time(lambda a=a, b=b: a @ b, device)
    return {
        "device": device,
        "read_bandwidth": x.nbytes / read_s,
        "copy_bandwidth": 2 * x.nbytes / copy_s,
        "fp32_flops": flops["fp32"],
        "bf16_flops": flops["bf16"],
        "memory_bytes": _memory_bytes(device),
        "bandwidth_bytes": bandwidth_bytes,
        "matmul_n": matmul_n,
    }


def _best_time(fn, device: str) -> float:
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()  # warm up: first-touch page faults, kernel selection
    sync()
    best = float("inf")
    for _ in range(_REPEATS):
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
