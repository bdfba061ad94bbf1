"""How many threads compute, and how they wait: chosen deliberately, for the native kernels
and PyTorch alike (both run on the one OpenMP pool of libgomp).

- Count: the physical cores this process may run on (hyper-threads share a core's
  vector units and add nothing to a memory-bound decode), or ``EngineConfig.threads``.
- Waiting: OpenMP threads that finish a parallel region spin-wait for the next by
  default. On a machine where other programs run, a spinning thread holds a core that the
  thread it waits for needs, and a decode step (hundreds of short regions) slows 10x or
  more (measured: 2.8 -> 41.7 tok/s on a 2-core VM with other work running).
  ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep) is set as the default when inferpath is
  imported before torch; an explicit setting in the environment wins. libgomp reads it
  once, when it loads: importing torch first leaves its policy as it was. Bounded
  spinning measured worse still on a loaded machine (``GOMP_SPINCOUNT=2000``, about 20
  us: 28 tok/s against PASSIVE's 54, SmolLM2 Q4_1 beside a niced busy loop).
- A step's sampling, where its logits are few (``sampling_threads``): on the calling
  thread. Each PyTorch op on a decode step's (rows, vocab) logits otherwise opened an
  OpenMP region, whose thread then woke (PASSIVE) or spun beside the decode pool's workers
  (libgomp's default): the step's native layers run on the pool (kernels/csrc/drivers/pool.c),
  so with this no OpenMP team runs during a decode step at all.
- Single-sequence decode steps: with other programs holding cores, every parallel region
  waits for its slowest thread, and one thread can beat two (shared 2-core VM under load,
  SmolLM2 decode: Q4_1 79 vs 62 tok/s, BF16 47 vs 41), while on an idle machine two
  threads read the weights faster. Which wins changes with what else runs, so
  ``DecodeThreadTuner`` measures it while the engine decodes (when ``threads`` is left to
  inferpath).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_WAIT_POLICY = "PASSIVE"


def set_default_wait_policy() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless the environment says otherwise (module doc)."""
    os.environ.setdefault("OMP_WAIT_POLICY", DEFAULT_WAIT_POLICY)


def physical_cores() -> int:
    """Physical cores among the CPUs this process may use (at least 1)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        processor = physical = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "processor":
                processor, physical = int(value), "0"
            elif key == "physical id":
                physical = value
            elif key == "core id" and processor in allowed:
                cores.add((physical, value))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores) or len(allowed), len(allowed)))


def configure_threads(threads: int | None) -> int:
    """Set PyTorch's (and so the kernels') thread count: ``threads`` or the physical
    cores. Returns the count."""
    import torch

    count = threads or physical_cores()
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def wait_policy() -> str:
    return os.environ.get("OMP_WAIT_POLICY", "libgomp default (spin, then sleep)")


class DecodeThreadTuner:
    """Chooses the thread count of single-sequence decode steps by their measured time.

    Decode steps run in phases: a trial runs TRIAL_STEPS steps at each candidate count (the
    configured count, then 1; the first step after each switch is not counted: it wakes
    or parks threads; one thread's part ends after EARLY_STOP_STEPS where each was slower
    than the configured count's median), then the count with the lower median step time
    serves the next EXPLOIT_STEPS steps, then a new trial; one thread only where it is
    faster by more than MARGIN (a stable choice where the two measure alike). A decode step of one sequence reads the same
    weights whatever the count, and the native kernels give the same results at any
    count (each output is one thread's sum), so switching changes only the time.

    Invariant: for each decode step, ``next_count()`` once before it and ``observe()``
    once after it; other steps run at ``configured`` and leave the phases as they were.
    """

    TRIAL_STEPS = 6
    EXPLOIT_STEPS = 250
    # One thread is chosen only when its median step is this much faster than the configured
    # count's: within it the two measure alike, and a choice by the smaller median alone
    # flipped from trial to trial (the same run measured at 46 and at 54 tok/s).
    MARGIN = 0.10
    # A trial's one-thread steps stop after this many counted ones, where every one of them
    # was slower than the configured count's median: one thread cannot then come out MARGIN
    # faster but by the load changing within the trial, which the next trial sees anyway. On
    # the 1.5B Q4_K_M file one thread's steps cost ~1.3x two's, and a 64-token answer paid 7
    # of them; now 3.
    EARLY_STOP_STEPS = 2

    def __init__(self, configured: int) -> None:
        if configured < 2:
            raise ValueError(f"a thread tuner needs at least 2 threads to choose from, got {configured}")
        self.configured = configured
        self.chosen = configured  # the count of the last trial's winner (before any trial: configured)
        self.candidates = (configured, 1)
        self._trial: list[tuple[int, bool]] = []  # (count, counted) of the trial steps to run
        self._times: dict[int, list[float]] = {}
        self._exploit_left = 0
        self.num_trials = 0  # trials finished

    def next_count(self) -> int:
        """The thread count for the next decode step."""
        if self._exploit_left > 0:
            return self.chosen
        if not self._trial:
            self._trial = [(count, step > 0) for count in self.candidates for step in range(self.TRIAL_STEPS + 1)]
            self._times = {count: [] for count in self.candidates}
        return self._trial[0][0]

    def observe(self, seconds: float) -> None:
        """The wall time of the decode step ``next_count()`` was asked for."""
        if self._exploit_left > 0:
            self._exploit_left -= 1
            return
        count, counted = self._trial.pop(0)
        if counted:
            self._times[count].append(seconds)
        tried = self._times[1]
        if count == 1 and len(tried) >= self.EARLY_STOP_STEPS \
                and min(tried) > statistics.median(self._times[self.configured]):
            self._trial = []  # one thread lost every step: the configured count stays
        if not self._trial:
            medians = {count: statistics.median(times) for count, times in self._times.items()}
            self.chosen = 1 if medians[1] < (1 - self.MARGIN) * medians[self.configured] else self.configured
            self._exploit_left = self.EXPLOIT_STEPS
            self.num_trials += 1

    def describe(self) -> str:
        """For the summary line: the configured count, and what one-sequence decode runs."""
        if not self.num_trials:
            return f"{self.configured} threads (one-sequence decode: trying {' and '.join(map(str, self.candidates))})"
        return f"{self.configured} threads (one-sequence decode: {self.chosen}, measured faster)"


def threads_phrase(count: int) -> str:
    """"1 thread", "2 threads": a count as the summary line says it."""
    return f"{count} thread{'' if count == 1 else 's'}"


# A step's sampling works on (rows, vocab) logits. PyTorch splits an op over its OpenMP team
# once a tensor passes its grain (32,768 values), and each such region either wakes a
# sleeping thread (PASSIVE: a 151,936-value amax took 63 us at 2 threads, 8.7 on the calling
# thread alone) or leaves it spinning, after the region, beside the decode pool's workers
# (libgomp's default policy, which a process that imported torch before inferpath keeps:
# greedy decode of SmolLM2 ran 25% slower, of the 1.5B Q4_K_M file 19%, from that one
# region a step). Up to this many logits the sampling runs on the calling thread.
INLINE_SAMPLING_VALUES = 1 << 20


@contextmanager
def sampling_threads(values: int) -> Iterator[None]:
    """PyTorch's thread count 1 while a step samples from ``values`` logits, where they are
    few (INLINE_SAMPLING_VALUES); restored after."""
    import torch

    count = torch.get_num_threads()
    if count == 1 or values > INLINE_SAMPLING_VALUES:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(count)


def set_thread_count(count: int) -> None:
    """PyTorch's (and so the kernels') thread count, set only when it changes."""
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
