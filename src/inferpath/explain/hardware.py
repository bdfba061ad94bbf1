"""Hardware specs: the two numbers a roofline needs, memory bandwidth and peak FLOP/s.

Every preset quotes its vendor datasheet. Peak FLOP/s are *dense* figures (datasheets
often print the 2:4-sparsity number, which is twice the dense one). ``this-machine`` is
not a preset: it is measured by ``probe.py`` and cached.

Invariant: ``ridge_point(dtype) = peak_flops[dtype] / memory_bandwidth`` is the arithmetic
intensity (FLOP per byte moved) above which a kernel is bound by arithmetic rather than by
memory. For the H100 SXM in bf16 that is 989e12 / 3.35e12 = 295 FLOP/byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or a group of identical ones, see ``scaled``).

    ``peak_flops`` maps a compute dtype ("fp32", "bf16") to dense FLOP/s. Weight-only
    quantized models (int8, int4) dequantize to bf16 before the matmul, so they use "bf16".
    """

    name: str
    memory_bandwidth: float  # bytes/s
    peak_flops: dict[str, float] = field(hash=False)  # FLOP/s by compute dtype
    memory_bytes: float  # capacity of one device
    source: str = ""
    num_devices: int = 1
    # measured on this machine only (explain/probe_kernels.py): the bytes/s of each matmul
    # kernel's GEMV, keyed "FORMAT/ACTIVATIONS" and "FORMAT/ACTIVATIONS/ROWSxCOLS" (a shape
    # a model runs), and the FLOP/s of its GEMM keyed "FORMAT/ACTIVATIONS"; presets have none
    # and are priced at their bandwidth and peak
    gemv_rates: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    gemm_rates: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    # seconds one stage's module call costs beyond its kernel on the module path (Python,
    # dispatch, threads waking): measured here, 0 for presets (probe_kernels.measure_module_call)
    module_call_s: float = 0.0
    # the last-level cache's bytes (sysfs; 0: unknown, presets): a step whose hot data fits in
    # half of it reads its matrices at their cache-resident GEMV rates (explain/kernel_cost.py)
    cache_bytes: float = 0.0
    # seconds one call of the engine's sampler costs, keyed by vocabulary and the rows' kinds
    # (explain/sampler_cost.py: measured here by running it; presets: none, the roofline's price)
    sampler_s: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    # (seconds of the paged decode attention kernel's fixed part a call, seconds per context
    # token) on one thread, keyed by shape (explain/attention_cost.py: measured here by
    # running it; presets: none, the roofline's price)
    attention_s: dict[str, tuple[float, float]] = field(default_factory=dict, hash=False, compare=False)

    def flops_for(self, compute_dtype: str) -> float:
        if compute_dtype == "quantized" and "quantized" not in self.peak_flops:
            compute_dtype = "bf16"  # weight-only quantization dequantizes to bf16 (see above)
        try:
            return self.peak_flops[compute_dtype]
        except KeyError:
            raise ValueError(
                f"hardware {self.name!r} has no peak FLOP/s for {compute_dtype!r}; "
                f"known: {', '.join(sorted(self.peak_flops))}"
            ) from None

    def ridge_point(self, compute_dtype: str = "bf16") -> float:
        """FLOP per byte at which compute time equals memory time."""
        return self.flops_for(compute_dtype) / self.memory_bandwidth

    def scaled(self, num_devices: int) -> "HardwareSpec":
        """``num_devices`` of these, sharded ideally: bandwidth, FLOP/s and memory add up.

        NOTE: this ignores the all-reduce traffic of tensor parallelism (two per layer);
        for a decode step it is kilobytes per token against gigabytes of weights.
        """
        if num_devices < 1:
            raise ValueError(f"number of devices must be at least 1, got {num_devices}")
        if num_devices == 1:
            return self
        return replace(
            self,
            name=f"{num_devices}x {self.name}",
            memory_bandwidth=self.memory_bandwidth * num_devices,
            peak_flops={k: v * num_devices for k, v in self.peak_flops.items()},
            gemv_rates={k: v * num_devices for k, v in self.gemv_rates.items()},
            gemm_rates={k: v * num_devices for k, v in self.gemm_rates.items()},
            memory_bytes=self.memory_bytes * num_devices,
            cache_bytes=self.cache_bytes * num_devices,
            num_devices=self.num_devices * num_devices,
        )


TB = 1e12
GB = 1e9

HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): 80 GB HBM3, 3.35 TB/s,
    # BF16 Tensor Core 1,979 TFLOPS "with sparsity" -> 989 dense; FP32 67 TFLOPS.
    "h100-sxm": HardwareSpec(
        name="h100-sxm", memory_bandwidth=3.35 * TB,
        peak_flops={"bf16": 989e12, "fp32": 67e12}, memory_bytes=80 * GB,
        source="NVIDIA H100 datasheet, SXM: 3.35 TB/s HBM3, 1,979 sparse / 989 dense bf16 TFLOPS",
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s; same
    # compute as the H100 SXM (BF16 1,979 TFLOPS sparse -> 989 dense; FP32 67 TFLOPS).
    "h200": HardwareSpec(
        name="h200", memory_bandwidth=4.8 * TB,
        peak_flops={"bf16": 989e12, "fp32": 67e12}, memory_bytes=141 * GB,
        source="NVIDIA H200 datasheet, SXM: 4.8 TB/s HBM3e, 989 dense bf16 TFLOPS",
    ),
    # NVIDIA A100 datasheet (A100 80GB SXM): 2,039 GB/s HBM2e, BF16 Tensor Core 312 TFLOPS
    # dense (624 sparse), FP32 19.5 TFLOPS.
    "a100-80gb-sxm": HardwareSpec(
        name="a100-80gb-sxm", memory_bandwidth=2.039 * TB,
        peak_flops={"bf16": 312e12, "fp32": 19.5e12}, memory_bytes=80 * GB,
        source="NVIDIA A100 datasheet, 80GB SXM: 2,039 GB/s HBM2e, 312 dense bf16 TFLOPS",
    ),
    # NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, BF16 Tensor Core 242 TFLOPS with
    # sparsity -> 121 dense; FP32 30.3 TFLOPS.
    "l4": HardwareSpec(
        name="l4", memory_bandwidth=0.300 * TB,
        peak_flops={"bf16": 121e12, "fp32": 30.3e12}, memory_bytes=24 * GB,
        source="NVIDIA L4 datasheet: 300 GB/s GDDR6, 242 sparse / 121 dense bf16 TFLOPS",
    ),
    # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X,
    # 1,008 GB/s; peak BF16 Tensor TFLOPS with FP32 accumulate 165.2 dense (330.4 sparse);
    # peak FP32 82.6 TFLOPS.
    "rtx-4090": HardwareSpec(
        name="rtx-4090", memory_bandwidth=1.008 * TB,
        peak_flops={"bf16": 165.2e12, "fp32": 82.6e12}, memory_bytes=24 * GB,
        source="NVIDIA Ada whitepaper, RTX 4090: 1,008 GB/s GDDR6X, 165.2 dense bf16 TFLOPS",
    ),
}

_ALIASES = {"h100": "h100-sxm", "h200-sxm": "h200", "a100": "a100-80gb-sxm", "4090": "rtx-4090"}

THIS_MACHINE = "this-machine"


def hardware_names() -> list[str]:
    return [*HARDWARE_PRESETS, THIS_MACHINE]


def get_hardware(name: str, refresh: bool = False) -> HardwareSpec:
    """A preset by name (or alias), or ``this-machine`` (probed once, then cached;
    ``refresh`` measures it again)."""
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key == THIS_MACHINE:
        from inferpath.explain.probe import probe_this_machine

        return probe_this_machine(refresh=refresh)
    try:
        return HARDWARE_PRESETS[key]
    except KeyError:
        raise ValueError(
            f"unknown hardware {name!r}; choose one of {', '.join(hardware_names())}"
        ) from None
