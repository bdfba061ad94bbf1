"""The speculative policy (engine/spec/acceptance.py, step_costs.py) on fake step costs:
how many drafts pay follows from what extra rows cost and from the acceptance rate, a
sequence whose drafts do not pay pauses and resumes, and the speculator prices steps
only from decodes and verifications. No wall time is read: every cost is fed in."""

import pytest

from inferpath.engine.spec.acceptance import (
    DECAY,
    FIRST_PAUSE,
    MARGIN,
    MAX_PAUSE,
    PRIOR_RATE,
    SHADOW_HITS,
    AcceptanceTracker,
    choose_num_drafts,
    expected_tokens,
)
from inferpath.engine.spec.step_costs import PRIOR_ROW_COST, REFRESH_STEPS, StepCosts


def costs_of(per_rows: dict[int, float], draft: float = 0.0) -> StepCosts:
    costs = StepCosts()
    for rows, seconds in per_rows.items():
        costs.record(rows, seconds)
    if draft:
        costs.record_draft(1, draft)
    return costs


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_step_costs_are_medians_interpolated_and_extrapolated_with_the_prior():
    costs = StepCosts(window=3)
    assert costs.cost(1) is None and not costs.needs_sample(1)
    for seconds in (0.10, 0.30, 0.11, 0.12):  # the window keeps the last three: 0.30, 0.11, 0.12
        costs.record(1, seconds)
    costs.record(5, 0.20)
    assert costs.cost(1) == pytest.approx(0.12)
    assert costs.cost(3) == pytest.approx(0.12 + (0.20 - 0.12) / 2)  # between two measured
    assert costs.cost(7) == pytest.approx(0.20 + PRIOR_ROW_COST * 0.12 * 2)  # past the largest
    only_five = costs_of({5: 0.16})
    assert only_five.cost(1) == pytest.approx(0.16 / (1 + PRIOR_ROW_COST * 4))  # below the smallest
    costs.record(0, 1.0), costs.record(2, 0.0)  # nonsense is not a price
    assert costs.num_samples(0) == costs.num_samples(2) == 0


def test_a_row_count_not_measured_lately_asks_for_a_sample():
    costs = costs_of({5: 0.2})
    assert costs.needs_sample(1) and not costs.needs_sample(5)
    costs.record(1, 0.1)
    for _ in range(REFRESH_STEPS - 1):
        costs.record(5, 0.2)
    assert not costs.needs_sample(1)
    costs.record(5, 0.2)
    assert costs.needs_sample(1)


def test_cheap_rows_draft_long_runs_dear_rows_draft_little_or_none():
    cheap = costs_of({1: 0.10, 2: 0.105, 3: 0.11, 4: 0.115, 5: 0.12})  # repacked-like: 1.2x at 5 rows
    dear = costs_of({1: 0.10, 2: 0.30, 3: 0.40, 4: 0.50, 5: 0.50})  # laid-out-like: 5x at 5 rows
    assert choose_num_drafts(0.8, 4, cheap) == 4
    assert choose_num_drafts(0.3, 4, cheap) >= 1
    assert choose_num_drafts(0.8, 4, dear) == 0  # 1 + .8 + ... + .8^4 = 3.36 tokens for 5x the time
    assert choose_num_drafts(0.0, 4, cheap) == 0  # never accepted: never worth a row
    assert choose_num_drafts(0.9, 4, StepCosts()) == 4  # nothing measured: draft (and measure)


def test_the_margin_and_the_drafters_own_cost_are_paid_for():
    flat = costs_of({1: 0.10, 2: 0.10})
    # one draft at rate r over a step as cheap as plain: pays only past the margin
    assert choose_num_drafts(MARGIN * 0.9, 1, flat) == 0
    assert choose_num_drafts(MARGIN * 1.1, 1, flat) == 1
    # a drafter that costs as much per token as a step: k = 1 at rate 0.9 earns 1.9 tokens in 2 steps' time
    assert choose_num_drafts(0.9, 1, costs_of({1: 0.10, 2: 0.10}, draft=0.10)) == 0
    assert choose_num_drafts(0.9, 1, costs_of({1: 0.10, 2: 0.10}, draft=0.01)) == 1


def test_a_noisy_cheap_median_does_not_make_rejected_drafts_look_free():
    noisy = costs_of({1: 0.10, 2: 0.08, 5: 0.09})  # verification steps measured below the plain one
    assert choose_num_drafts(0.0, 4, noisy) == 0
    assert choose_num_drafts(0.02, 4, noisy) == 0  # 1.02 tokens for (at least) a plain step's time


def test_the_rate_counts_per_position_trials_with_decay():
    tracker = AcceptanceTracker()
    assert tracker.rate == pytest.approx(PRIOR_RATE)
    before_s, before_t = tracker.num_accepted, tracker.num_trials
    tracker.observe(4, 2)  # two accepted, the third rejected: 2 of 3 trials
    assert tracker.num_accepted == pytest.approx(DECAY * before_s + 2)
    assert tracker.num_trials == pytest.approx(DECAY * before_t + 3)
    s, t = tracker.num_accepted, tracker.num_trials
    tracker.observe(3, 3)  # all accepted: 3 of 3
    assert tracker.rate == pytest.approx((DECAY * s + 3) / (DECAY * t + 3))
    tracker.observe(0, 0)  # no drafts: nothing learned
    assert tracker.num_verifications == 2


def test_low_acceptance_pauses_drafting_backs_off_and_recovers():
    costs = costs_of({1: 0.10, 2: 0.11, 5: 0.15})
    tracker = AcceptanceTracker()
    assert tracker.num_drafts(4, costs) > 0  # the prior pays on these costs
    while tracker.num_drafts(4, costs) > 0:  # every draft rejected: k shrinks, then a pause
        tracker.observe(1, 0)
    assert tracker.paused and tracker.num_pauses == 1 and tracker.rate == pytest.approx(PRIOR_RATE)
    assert [tracker.should_draft() for _ in range(FIRST_PAUSE)] == [False] * FIRST_PAUSE
    assert tracker.should_draft() and tracker.pause == 2 * FIRST_PAUSE
    while tracker.num_drafts(4, costs) > 0:
        tracker.observe(1, 0)
    assert tracker.num_pauses == 2 and tracker.num_steps_paused == 2 * FIRST_PAUSE
    tracker.num_steps_paused = 0
    for _ in range(2):  # drafts that pay again: the backoff is reset
        assert tracker.num_drafts(4, costs) > 0
        tracker.observe(4, 4)
    assert tracker.num_drafts(4, costs) == 4 and tracker.pause == FIRST_PAUSE


def test_a_paused_sequence_resumes_when_its_shadow_guesses_are_right():
    never = costs_of({1: 0.10, 2: 1.0, 5: 5.0})  # drafts never pay: every call pauses
    tracker = AcceptanceTracker()
    for _ in range(8):
        assert tracker.num_drafts(4, never) == 0
        tracker.num_steps_paused = 0
    assert tracker.pause == MAX_PAUSE
    tracker.num_drafts(4, never)
    tokens = [1, 2, 3]
    tracker.shadow(len(tokens), [9])
    assert not tracker.should_draft(tokens + [8])  # a wrong guess
    for n in range(SHADOW_HITS):
        tokens.append(5)
        assert tracker.paused
        tracker.shadow(len(tokens), [7, 7])
        tokens.append(7)
        assert tracker.should_draft(tokens) == (n == SHADOW_HITS - 1)
    assert not tracker.paused


def test_in_a_batch_a_draft_pays_for_its_own_row_only():
    """Sixteen decoding rows: where each row costs the same (compute-bound) a draft
    accepted at 0.6 does not pay for its row; where the weights' bytes bound the step
    (rows nearly free) it does; the margin is one sequence's, not the batch's."""
    per_row = costs_of({16: 1.6, 17: 1.7, 20: 2.0})
    flat = costs_of({16: 1.0, 17: 1.01, 20: 1.04})
    assert choose_num_drafts(0.6, 4, per_row, base_rows=16, base_tokens=16) == 0
    assert choose_num_drafts(0.6, 4, flat, base_rows=16, base_tokens=16) == 3  # the 4th adds 0.13 of a token for 1%


def test_a_fresh_record_tries_once_then_is_judged_by_what_it_did():
    """A drafter that costs 0.4 of a step per token: at the prior's rate 4 drafts do not
    pay, at rate 1 they do, so a fresh record tries; all accepted, it keeps drafting; all
    rejected, it pauses. Where even rate 1 cannot pay, it pauses without trying."""
    costs = costs_of({1: 0.10, 5: 0.15}, draft=0.04)
    assert choose_num_drafts(PRIOR_RATE, 4, costs) == 0 and choose_num_drafts(1.0, 4, costs) == 4
    good, bad = AcceptanceTracker(), AcceptanceTracker()
    assert good.num_drafts(4, costs) == 4 and bad.num_drafts(4, costs) == 4
    good.observe(4, 4)
    bad.observe(4, 0)
    assert good.num_drafts(4, costs) >= 3  # its rate is 0.9 now (with the prior's weight)
    assert bad.num_drafts(4, costs) == 0 and bad.paused
    hopeless = costs_of({1: 0.10, 5: 0.15}, draft=0.2)
    assert AcceptanceTracker().num_drafts(4, hopeless) == 0
