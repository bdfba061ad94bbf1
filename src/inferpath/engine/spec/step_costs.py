"""What a step of n rows costs here, measured by the engine: the speculative policy's prices.

Whether k drafts pay depends on what k more rows add to a step, and that is a property of
the machine, the model and its weight layout, not a constant: on the 1.5B Q4_K_M file at 2
threads (AMD EPYC) a 5-row step costs 5x a one-row step with the file's layout and 1.5x
with the weights repacked by 8 rows, while SmolLM2's costs ~2x on the module path and
~1.1x in the native call. So the engine measures it: ``record(rows, seconds)`` after each
step whose every chunk is a decode or a verification (no prompt chunk: its attention and
its length would price the rows wrongly), and ``cost(rows)`` is the median of the last
``WINDOW`` such steps of that many rows. A row count not seen yet is priced from the
nearest seen ones: linearly between two, and past the largest seen at ``PRIOR_ROW_COST``
of the one-row step per extra row (a deliberately cheap prior, so that drafts get tried
and their real cost is measured once; then the median replaces it). Fewer rows than the
smallest seen are priced at the prior's slope below it. ``needs_sample(rows)`` says a row
count has not been measured in the last ``REFRESH_STEPS`` recorded steps (the speculator
then decodes one step plainly to price the step without drafts: a draft model that
always drafts would otherwise never measure it, and the machine's load drifts).

``draft_cost`` is the drafter's own price per drafted token (a draft model's forward pass;
ngram lookups are ~free), recorded by the speculator around each proposal.

Imports no torch; tests feed it fake times.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections import deque

WINDOW = 16  # recent steps per row count whose median is the price
PRIOR_ROW_COST = 0.15  # an unmeasured row past the largest measured, in one-row steps
REFRESH_STEPS = 64  # recorded steps after which a row count's price is measured again


class StepCosts:
    """Recent step times by row count, and the drafter's recent time per drafted token."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self._times: dict[int, deque[float]] = {}
        self._medians: dict[int, float] = {}  # rows -> median, refreshed on record
        self._rows: list[int] = []  # measured row counts, sorted
        self._draft_times: deque[float] = deque(maxlen=window)
        self._draft_median = 0.0
        self.num_recorded = 0
        self._last_recorded: dict[int, int] = {}  # rows -> num_recorded when last seen

    def record(self, rows: int, seconds: float) -> None:
        """One step of ``rows`` rows (decodes and verifications only) took ``seconds``."""
        if rows < 1 or seconds <= 0:
            return
        times = self._times.get(rows)
        if times is None:
            times = self._times[rows] = deque(maxlen=self.window)
            self._rows.insert(bisect_left(self._rows, rows), rows)
        times.append(seconds)
        self._medians[rows] = statistics.median(times)
        self.num_recorded += 1
        self._last_recorded[rows] = self.num_recorded

    def needs_sample(self, rows: int) -> bool:
        """Whether steps were measured but none of ``rows`` rows lately (module docstring)."""
        last = self._last_recorded.get(rows)
        return bool(self._rows) and (last is None or self.num_recorded - last >= REFRESH_STEPS)

    def record_draft(self, num_tokens: int, seconds: float) -> None:
        """The drafter took ``seconds`` to draft up to ``num_tokens`` tokens per sequence."""
        if num_tokens >= 1 and seconds >= 0:
            self._draft_times.append(seconds / num_tokens)
            self._draft_median = statistics.median(self._draft_times)

    @property
    def draft_cost(self) -> float:
        """Seconds per drafted token (0 until measured)."""
        return self._draft_median

    def num_samples(self, rows: int) -> int:
        times = self._times.get(rows)
        return len(times) if times else 0

    def cost(self, rows: int) -> float | None:
        """Seconds a step of ``rows`` rows takes (module docstring), or None before any
        step was measured."""
        known = self._rows
        if not known:
            return None
        median = self._medians.get(rows)
        if median is not None:
            return median
        i = bisect_left(known, rows)
        if i == 0:  # fewer rows than any seen: the prior's slope down from the smallest
            smallest = known[0]
            return self._medians[smallest] * (1 + PRIOR_ROW_COST * (rows - 1)) / (1 + PRIOR_ROW_COST * (smallest - 1))
        below = known[i - 1]
        low = self._medians[below]
        if i == len(known):  # past the largest seen: the prior's slope up from it
            one_row = self._medians[known[0]] / (1 + PRIOR_ROW_COST * (known[0] - 1))
            return low + PRIOR_ROW_COST * one_row * (rows - below)
        above = known[i]
        high = self._medians[above]
        return low + (high - low) * (rows - below) / (above - below)
