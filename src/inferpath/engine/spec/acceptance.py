"""How many tokens to draft: the k that maximizes expected tokens per second, priced by the
engine's own measured step costs (engine/spec/step_costs.py).

A verification of k drafts is one step of k more rows; it earns 1 + (accepted drafts)
tokens. Each sequence keeps a decayed estimate ``rate`` of the chance that a drafted token
is accepted given the ones before it were (per position: a verification that accepted n
of d drafts is n successes in n + 1 trials, or d in d when all were accepted; older
verifications weigh ``DECAY`` per verification, a prior of ``PRIOR_RATE`` over
``PRIOR_TRIALS`` trials starts the record). With acceptance of each next draft at ``rate``,
k drafts are expected to yield ``1 + rate + ... + rate**k`` tokens. ``choose_num_drafts``
then takes, of k = 0..k_max, the one whose expected tokens over the step's cost (the
measured cost of the step's rows with k more, plus k times the drafter's own cost per
token) is highest, and drafts only when that beats plain decoding by ``MARGIN`` of this
sequence's tokens (in a batch the step's other rows earn their own) — so on
weights whose extra rows are dear (a 5-row step at 5x one row) it drafts little or not at
all, and where they are cheap (1.1-1.5x) it drafts long runs at the same acceptance.

Trying: a record with no verification yet (a new sequence, or one out of a pause) is
priced at rate 1 (every draft accepted) for its first verification, so a good drafter is
always tried once and then judged by what it did; where even that does not pay (extra
rows as dear as whole steps), it pauses at once.

Pausing: when the best k is 0 the sequence decodes plainly for ``pause`` steps (4,
doubling on each pause up to 64; a record of two or more verifications at or above the
prior's rate resets it), then tries again with its record back at the prior.

Resuming on a match: a drafter whose proposals cost nothing (ngram) keeps proposing
while paused, as shadows that are not verified; each plain step checks the last shadow's
first token against the token the target chose. ``SHADOW_HITS`` right guesses in a row
end the pause at once (the text has turned to copying). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferpath.engine.spec.step_costs import StepCosts

FIRST_PAUSE, MAX_PAUSE = 4, 64
PRIOR_RATE, PRIOR_TRIALS = 0.6, 2.0  # the record of a sequence that has not been verified yet
DECAY = 0.7  # weight of the record before the newest verification
MARGIN = 0.05  # drafting must beat plain decoding's tokens per second by this fraction
SHADOW_HITS = 3  # right shadow guesses in a row that end a pause


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a verification of k drafts yields on average when each next draft is
    accepted with probability ``rate``: 1 + rate + ... + rate**k."""
    return float(k + 1) if rate >= 1.0 else (1.0 - rate ** (k + 1)) / (1.0 - rate)


def choose_num_drafts(rate: float, k_max: int, costs: StepCosts, base_rows: int = 1,
                      base_tokens: float = 1.0) -> int:
    """The k in 0..k_max with the most expected tokens per second for a step of
    ``base_rows`` rows (this sequence's own one among them) that yields ``base_tokens``
    without drafts (module docstring); k_max when no step has been measured yet (draft,
    and so measure)."""
    plain = costs.cost(base_rows)
    if plain is None:
        return k_max
    # the margin is in this sequence's own tokens: drafts must add MARGIN of a token per step
    best_k, best = 0, (base_tokens + MARGIN) / plain
    for k in range(1, k_max + 1):
        # NOTE: never cheaper than the plain step: a noisy median must not make a draft
        # that is never accepted look free
        seconds = max(costs.cost(base_rows + k), plain) + k * costs.draft_cost
        tokens_per_s = (base_tokens - 1.0 + expected_tokens(rate, k)) / seconds
        if tokens_per_s > best:
            best_k, best = k, tokens_per_s
    return best_k


class AcceptanceTracker:
    """One sequence's record. ``observe`` after each verification (the scheduler calls
    it); ``should_draft`` once per step before proposing, then ``num_drafts`` for how
    many; ``shadow`` after a paused step's unverified proposal."""

    def __init__(self):
        self.num_accepted = PRIOR_RATE * PRIOR_TRIALS  # decayed successes
        self.num_trials = PRIOR_TRIALS  # decayed trials
        self.num_verifications = 0  # since the last pause
        self.pause = FIRST_PAUSE
        self.num_steps_paused = 0  # steps left without drafts
        self.num_pauses = 0
        self._shadow: tuple[int, int] | None = None  # (position, token guessed there)
        self.shadow_hits = 0

    @property
    def rate(self) -> float:
        """The estimated chance that a draft is accepted after the ones before it were."""
        return self.num_accepted / self.num_trials

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted <= 0:
            return
        self.num_verifications += 1
        trials = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.num_accepted = DECAY * self.num_accepted + num_accepted
        self.num_trials = DECAY * self.num_trials + trials

    def num_drafts(self, k_max: int, costs: StepCosts, base_rows: int = 1, base_tokens: float = 1.0) -> int:
        """How many tokens to draft this step (``choose_num_drafts`` at this record's
        rate); 0 starts a pause."""
        # a record with no verification yet (new, or just out of a pause) tries once at the
        # best case's k: a prior alone would keep a drafter that is right 9 times in 10 from ever
        # being tried where the prior's rate does not pay; it pauses only if even that cannot
        rate = 1.0 if self.num_verifications == 0 else self.rate
        k = choose_num_drafts(rate, k_max, costs, base_rows, base_tokens)
        if k > 0:
            if self.num_verifications >= 2 and self.rate >= PRIOR_RATE:  # doing well: the backoff is reset
                self.pause = FIRST_PAUSE
            return k
        self.num_steps_paused = self.pause
        self.pause = min(2 * self.pause, MAX_PAUSE)
        self.num_pauses += 1
        self.num_accepted, self.num_trials = PRIOR_RATE * PRIOR_TRIALS, PRIOR_TRIALS
        self.num_verifications = 0
        self._shadow, self.shadow_hits = None, 0
        return 0

    @property
    def paused(self) -> bool:
        return self.num_steps_paused > 0

    def should_draft(self, tokens: Sequence[int] = ()) -> bool:
        """Whether this step may draft (not paused); ``tokens``: the sequence's tokens so
        far (the last shadow is checked against them)."""
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
