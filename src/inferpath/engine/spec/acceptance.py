"""When to draft: a sequence whose drafts are mostly rejected stops drafting for a while.

A verification step of k + 1 tokens costs more than a one-token step (the native decode
call serves it since issue 23 item 0, but its quantized matmuls still cost about 1.5x at 2
rows and 2.6-3x at 5 on a CPU-bound step: benchmarks/verify_step.py), so drafts pay only
when enough of them are accepted. Each sequence keeps an exponential average of the drafts accepted per
verification; when it falls below ``min_accepted`` the sequence decodes plainly for
``pause`` steps, then tries again with a clean record; each failed try doubles the pause
(up to ``max_pause``), a good one resets it. Imports no torch.
"""

from __future__ import annotations

MIN_ACCEPTED = 1.0  # drafts accepted per verification below which drafting does not pay
FIRST_PAUSE, MAX_PAUSE = 4, 64
SMOOTHING = 0.3  # weight of the newest verification in the average


class AcceptanceTracker:
    """One sequence's record. ``observe`` after each verification (the scheduler calls
    it); ``should_draft`` once per step before proposing."""

    def __init__(self, min_accepted: float = MIN_ACCEPTED):
        self.min_accepted = min_accepted
        self.mean_accepted: float | None = None  # None: no verification since the last pause
        self.num_verifications = 0
        self.pause = FIRST_PAUSE
        self.num_steps_paused = 0  # steps left without drafts

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        self.num_verifications += 1
        mean = self.mean_accepted
        self.mean_accepted = (float(num_accepted) if mean is None
                              else (1 - SMOOTHING) * mean + SMOOTHING * num_accepted)
        # judge after two verifications: one unlucky draft is not a trend
        if self.num_verifications >= 2 and self.mean_accepted < self.min_accepted:
            self.num_steps_paused = self.pause
            self.pause = min(2 * self.pause, MAX_PAUSE)
            self.mean_accepted, self.num_verifications = None, 0
        elif self.mean_accepted >= self.min_accepted:
            self.pause = FIRST_PAUSE

    def should_draft(self) -> bool:
        if self.num_steps_paused > 0:
            self.num_steps_paused -= 1
            return False
        return True
