"""The native decode step's matmul rates as a step sustains them: layers' matrices streamed in sequence.

A decode step reads every layer's matrices once, one after the other, each a different
shape and often a different format (a Q4_K_M file: Q4_K beside Q6_K), the whole far beyond
the last-level cache. Copies of one matrix called in a tight loop, best of short rounds,
read faster than that: on the 2-core Xeon the shape probe of the 1.5B file's ``gate_up``
reached 34-40 GB/s while its decode steps sustained ~27, and the stages came out 1.4-1.5x
slower than predicted. So the native shapes (``".../native"``) are measured here together:

- one probe layer is one matrix of every native call shape a model's layers run, in the
  order given (``kernel_cost.gemv_shapes``'s); distinct layers are allocated until the
  sequence passes ``min_bytes`` (``probe_kernels.streamed_bytes``: three last-level
  caches), at least one layer (``plan_layers``);
- a round calls every matrix of every layer once, in order, each through the native step's
  matmul (csrc/drivers/decode.c ``inferpath_decode_matmuls``, the same call
  ``probe_kernels.measure_native_gemv`` times), and adds each call's time to its shape;
  the ctypes call's own cost (the same call with no weights, its median) is taken off each;
- a shape's rate is its bytes in a round over the **median** of ``ROUNDS`` rounds' times
  (after one warm-up round): what a step sustains on this machine as it is, not its best
  moment.

A repacked format (``"Q4_K_R8"``: kernels/repacked.py) is measured repacked, its bytes
counted at the file format's size as the cost model counts them (probe_weights.py).
Cost: allocating and filling the sequence (~0.3 GB of random blocks at a 105 MB cache:
about a second) and ``ROUNDS + 1`` passes over it (tens of milliseconds each).

Invariant: every rate returned is positive; a shape whose native call is not built here is
left out (priced at its module rate).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

ROUNDS = 7


@dataclass(frozen=True)
class Shape:
    """A native shape key ``"FORMAT/ACTIVATIONS/ROWSxCOLS/native"`` as parsed."""

    key: str
    format: str
    activations: str
    rows: int
    cols: int

    @classmethod
    def of(cls, key: str) -> "Shape":
        fmt, act, shape, *rest = key.split("/")
        if rest != ["native"]:
            raise ValueError(f"{key!r} is not a streamed native shape key (FORMAT/ACTIVATIONS/ROWSxCOLS/native)")
        rows, cols = (int(v) for v in shape.split("x"))
        return cls(key, fmt, act, rows, cols)

    @property
    def bytes(self) -> float:
        from inferpath.explain.probe_weights import file_bytes_per_value

        return self.rows * self.cols * file_bytes_per_value(self.format)


def plan_layers(keys: list[str], min_bytes: float) -> tuple[list[Shape], int]:
    """(one probe layer's shapes, in order; how many distinct layers the sequence holds): the
    fewest layers whose bytes pass ``min_bytes``, at least one."""
    layer = [Shape.of(k) for k in dict.fromkeys(keys)]
    per_layer = sum(s.bytes for s in layer)
    if not layer or per_layer <= 0:
        raise ValueError(f"no native shape keys to stream: {keys!r}")
    return layer, int(max(0.0, min_bytes) // per_layer) + 1


def measure_layer_sequence(keys: list[str], min_bytes: float | None = None, rounds: int | None = None) -> dict[str, float]:
    """{key: bytes/s} of the native shape ``keys`` streamed as layers in sequence (module
    doc); {} where the native call is not built for any of them."""
    import torch

    from inferpath.explain import probe_kernels

    layer, count = plan_layers(keys, probe_kernels.streamed_bytes() if min_bytes is None else min_bytes)
    rounds = rounds or ROUNDS
    layer = [s for s in layer if probe_kernels.native_matmul_fn(s.format, s.activations) is not None]
    if not layer:
        return {}
    with torch.inference_mode():
        calls = [(i, _call(shape)) for _ in range(count) for i, shape in enumerate(layer)]
        empty = _empty_call(calls[0][1])
        times = []
        for _ in range(rounds + 1):  # the first: warm-up (first touch of the pages, the pool's threads)
            spent = [0.0] * len(layer)
            for i, call in calls:
                start = time.perf_counter()
                call()
                spent[i] += time.perf_counter() - start
            times.append(spent)
    rates = {}
    for i, shape in enumerate(layer):
        seconds = statistics.median(t[i] for t in times[1:]) - count * empty
        rates[shape.key] = count * shape.bytes / max(seconds, 1e-9)
    return rates


def _call(shape: Shape):
    """A call ``run(count=1)`` of the native matmul over one fresh matrix of ``shape``, None
    where that call is not built here (probe_kernels.native_matmul_call)."""
    from inferpath.explain.probe_kernels import native_matmul_call, native_matmul_fn
    from inferpath.explain.probe_weights import random_linear

    fn = native_matmul_fn(shape.format, shape.activations)
    if fn is None:
        return None
    linear = random_linear(shape.format, shape.rows, shape.cols)
    return native_matmul_call(fn, shape.format, shape.activations, [linear])


def _empty_call(call) -> float:
    """Seconds of ``call`` with no weights (the ctypes call and the clock), the median of 201."""
    samples = []
    for _ in range(201):
        start = time.perf_counter()
        call(0)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
