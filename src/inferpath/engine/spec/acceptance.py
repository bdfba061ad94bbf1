"""When to draft: a sequence whose drafts do not pay for their verification stops drafting.

A verification step of k + 1 rows costs more than a one-token step: on a CPU-bound step
each extra row costs about ``VERIFY_ROW_COST`` of a step (benchmarks/verify_step.py: 2
rows 1.5x, 5 rows 2.6-3x), and it earns one token per accepted draft. So drafts pay when
more than that fraction of them is accepted, whatever their number. Each sequence keeps
an exponential average of the fraction of its drafts accepted per verification; after two
verifications, below ``min_rate`` the sequence decodes plainly for ``pause`` steps (4,
doubling on each failed try up to 64; a good one resets it), then tries again with a
clean record.

Resuming on a match: a drafter whose proposals cost nothing (ngram) keeps proposing
while paused, as shadows that are not verified; each plain step checks the last shadow's
first token against the token the target chose. ``SHADOW_HITS`` right guesses in a row
end the pause at once (the text has turned to copying). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

VERIFY_ROW_COST = 0.45  # one more row in a verification step, in one-token steps (CPU)
FIRST_PAUSE, MAX_PAUSE = 4, 64
SMOOTHING = 0.3  # weight of the newest verification in the average
SHADOW_HITS = 3  # right shadow guesses in a row that end a pause


class AcceptanceTracker:
    """One sequence's record. ``observe`` after each verification (the scheduler calls
    it); ``should_draft`` once per step before proposing; ``shadow`` after a paused step's
    unverified proposal."""

    def __init__(self, min_rate: float = VERIFY_ROW_COST):
        self.min_rate = min_rate
        self.mean_rate: float | None = None  # None: no verification since the last pause
        self.num_verifications = 0
        self.pause = FIRST_PAUSE
        self.num_steps_paused = 0  # steps left without drafts
        self.num_pauses = 0
        self._shadow: tuple[int, int] | None = None  # (position, token guessed there)
        self.shadow_hits = 0

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted <= 0:
            return
        self.num_verifications += 1
        rate = num_accepted / num_drafted
        mean = self.mean_rate
        self.mean_rate = rate if mean is None else (1 - SMOOTHING) * mean + SMOOTHING * rate
        # judge after two verifications: one unlucky draft is not a trend
        if self.num_verifications >= 2 and self.mean_rate < self.min_rate:
            self.num_steps_paused = self.pause
            self.pause = min(2 * self.pause, MAX_PAUSE)
            self.num_pauses += 1
            self.mean_rate, self.num_verifications = None, 0
            self._shadow, self.shadow_hits = None, 0
        elif self.mean_rate >= self.min_rate:
            self.pause = FIRST_PAUSE

    @property
    def paused(self) -> bool:
        return self.num_steps_paused > 0

    def should_draft(self, tokens: Sequence[int] = ()) -> bool:
        """Whether to draft this step; ``tokens``: the sequence's tokens so far (the last
        shadow is checked against them)."""
        if self.num_steps_paused <= 0:
            return True
        if self._shadow is not None:
            position, guess = self._shadow
            hit = position < len(tokens) and tokens[position] == guess
            self.shadow_hits = self.shadow_hits + 1 if hit else 0
            self._shadow = None
            if self.shadow_hits >= SHADOW_HITS:
                self.num_steps_paused, self.shadow_hits = 0, 0
                return True
        self.num_steps_paused -= 1
        return False

    def shadow(self, position: int, drafts: Sequence[int]) -> None:
        """A paused step's proposal ``drafts`` for the tokens from ``position`` on (not
        verified; only its first token is checked, next step)."""
        self._shadow = (position, drafts[0]) if drafts else None
        if not drafts:
            self.shadow_hits = 0
