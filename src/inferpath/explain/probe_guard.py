"""When a cached measurement of this machine must be taken again, so the probe cannot lie for long.

The probe (probe.py) is measured once and cached, and every "x% of the floor" the engine
prints is quoted against it. Two things make a cached figure wrong:

- it was taken while the machine was busy: the bandwidth it read was shared. Each
  measurement records the 1-minute load average (taken just before measuring, so the
  probe's own work is not counted) and the CPU count; one taken at more than
  ``BUSY_LOAD_PER_CPU`` runnable tasks a CPU is measured again as soon as the load has
  fallen to ``QUIETER`` of what it was (measuring again under the same load gains nothing);
- a real step beat it: a decode step that read its weight bytes faster than the probed
  bandwidth proves the probe low. ``note_observed`` marks the entry stale and keeps the rate
  the step attained as a lower bound of the floor (``raised_bandwidth``), so no fraction of
  the floor is ever printed above 100%; the next use measures again, and the attained rate
  stays the floor's lower bound across that measurement.

An entry written before the load was recorded is measured again once.
"""

from __future__ import annotations

import os

BUSY_LOAD_PER_CPU = 0.5
QUIETER = 0.5


def load_now() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def reprobe_reason(entry: dict, load: float) -> str:
    """Why ``entry`` (one cached measurement) must be measured again now, or ''."""
    if entry.get("stale"):
        return (f"a decode step read {entry['observed_read_bandwidth'] / 1e9:.1f} GB/s, faster than the "
                f"probed {entry['read_bandwidth'] / 1e9:.1f} GB/s")
    taken = entry.get("load_average")
    if taken is None:
        return "measured before the probe recorded its load average"
    cpus = entry.get("cpus") or os.cpu_count() or 1
    if taken / cpus > BUSY_LOAD_PER_CPU and load <= taken * QUIETER:
        return f"measured under load {taken:.2f} on {cpus} CPUs; the load is now {load:.2f}"
    return ""


def raised_bandwidth(entry: dict) -> tuple[float, str]:
    """(the floor's bandwidth, a note for the spec's source): the probed read bandwidth, or the
    rate a real step attained where that is higher."""
    observed = entry.get("observed_read_bandwidth", 0.0)
    if observed > entry["read_bandwidth"]:
        return observed, (f"; floor raised to {observed / 1e9:.1f} GB/s, which a decode step attained"
                          + (" (stale: measured again on next use)" if entry.get("stale") else ""))
    return entry["read_bandwidth"], ""


def observe(entry: dict, bytes_per_second: float) -> bool:
    """Record in ``entry`` that a step read at ``bytes_per_second``; True if that beats the
    floor (the entry is then stale)."""
    floor, _ = raised_bandwidth(entry)
    if bytes_per_second <= floor:
        return False
    entry["observed_read_bandwidth"] = bytes_per_second
    entry["stale"] = True
    return True


def carry_observed(old: dict | None, new: dict) -> dict:
    """``new`` (a fresh measurement) keeping the attained rate of ``old`` as the floor's lower
    bound, not stale."""
    if old and old.get("observed_read_bandwidth", 0.0) > new["read_bandwidth"]:
        new["observed_read_bandwidth"] = old["observed_read_bandwidth"]
    return new
