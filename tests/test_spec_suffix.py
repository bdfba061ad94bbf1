"""Suffix decoding's drafter alone (engine/spec/suffix.py): what it proposes from the
request's own tokens and from earlier requests' outputs, and how its limits cut a draft.
The engine-level tests (greedy with drafts equal to greedy without) are in
tests/test_speculative.py."""

from inferpath.engine.request import Request
from inferpath.engine.spec.suffix import CANDIDATES, SuffixProposer, _pair
from inferpath.sampling.params import SamplingParams


def finished(proposer: SuffixProposer, *outputs: list[int]) -> None:
    """Requests that ran and finished with these outputs (cached when they leave)."""
    for i, output in enumerate(outputs):
        request = Request(f"done-{len(proposer.cache.outputs)}-{i}", [1, 2], SamplingParams(max_tokens=64))
        for token in output:
            request.output_token_ids.append(token)
        proposer.observe([request])
    proposer.release(set())


def test_the_requests_own_tokens_are_matched_and_the_draft_grows_with_the_match():
    proposer = SuffixProposer()
    tokens = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 99, 10, 11, 12]
    assert proposer.lookup("a", tokens, 8) == [13, 14, 15]  # a match of 3: at most 3 (factor 1.0)
    assert SuffixProposer(max_spec_factor=2.0).lookup("a", tokens, 8) == [13, 14, 15, 16, 17, 18]
    assert proposer.lookup("b", tokens, 2) == [13, 14]  # k
    assert proposer.lookup("c", [10, 11, 12, 13], 8) == []  # nothing earlier


def test_the_tree_depth_bounds_match_and_draft_together():
    run = list(range(100, 130))
    tokens = run + [7] + run[:20]
    # D = 12: a match of m proposes at most D - m; the best is the balanced m = 6 (6 tokens)
    assert SuffixProposer(max_tree_depth=12).lookup("a", tokens, 16) == run[20:26]
    # D = 8, factor 4: a match of 7 leaves 1 token, one of 2 leaves 6 (m + draft <= D)
    assert SuffixProposer(max_tree_depth=8, max_spec_factor=4.0).lookup("a", tokens, 16) == run[20:26]


def test_earlier_outputs_draft_by_frequency_down_to_the_minimum_probability():
    proposer = SuffixProposer(max_spec_factor=4.0)
    finished(proposer, [200, 201, 300, 301, 302], [200, 201, 300, 301, 303], [200, 201, 400, 401, 402])
    # two of three continued 300 301 (p = 2/3), then 302 and 303 split (p = 1/3 each): a tie
    # goes to the more recent output
    assert proposer.lookup("q1", [5, 200, 201], 8) == [300, 301, 303]
    strict = SuffixProposer(max_spec_factor=4.0, min_token_prob=0.5)
    finished(strict, [200, 201, 300, 301, 302], [200, 201, 300, 301, 303], [200, 201, 400, 401, 402])
    assert strict.lookup("q2", [5, 200, 201], 8) == [300, 301]
    none = SuffixProposer(max_cached_requests=0)
    finished(none, [200, 201, 300, 301, 302])
    assert none.cache.num_tokens == 0 and none.lookup("q3", [5, 200, 201], 8) == []


def test_the_cache_keeps_the_last_requests_and_forgets_the_oldest_entirely():
    proposer = SuffixProposer(max_cached_requests=2)
    finished(proposer, [1, 2, 3, 4, 5])
    finished(proposer, [6, 7, 8, 9])
    finished(proposer, [10, 11, 12, 13])
    assert len(proposer.cache.outputs) == 2 and proposer.cache.num_tokens == 8
    assert proposer.lookup("q4", [0, 1, 2], 4) == []  # the first output is gone, index and all
    assert _pair(1, 2) not in proposer.cache.ends
    assert proposer.lookup("q5", [0, 6, 7], 4) == [8, 9]
    assert proposer.lookup("q6", [0, 10, 11], 4) == [12, 13]


def test_running_outputs_draft_for_other_requests_and_stay_when_they_leave():
    proposer = SuffixProposer(max_cached_requests=1)
    running = Request("live", [1, 2], SamplingParams(max_tokens=8))
    running.output_token_ids.extend([50, 51, 52])
    proposer.observe([running])
    assert proposer.lookup("other", [9, 50, 51], 4) == [52]  # a concurrent sample's tokens so far
    running.output_token_ids.append(53)
    proposer.observe([running])
    proposer.release({running.seq_id})  # still live: still running, not finished
    assert proposer.cache.outputs == [] and proposer.lookup("other2", [9, 50, 51], 4) == [52, 53]
    proposer.release(set())
    assert [list(o) for o in proposer.cache.outputs] == [[50, 51, 52, 53]]
    finished(proposer, [60, 61, 62])  # one finished output kept: the older one goes
    assert proposer.cache.num_tokens == 3 and proposer.lookup("other3", [9, 50, 51], 4) == []


def test_a_proposal_reads_a_bounded_window_of_occurrences():
    proposer = SuffixProposer(max_spec_factor=4.0)
    finished(proposer, *([[300, 301, 1, 2]] * (CANDIDATES + 10) + [[300, 301, 3, 4]] * 5))
    # 74 old outputs continue 1 2, the 5 newest 3 4: within the window of 64 the old ones still
    # lead (59 of 64), so the draft is 1 2; the window is the most recent occurrences
    assert proposer.lookup("q7", [0, 300, 301], 4) == [1, 2]
    finished(proposer, *([[300, 301, 3, 4]] * CANDIDATES))
    assert proposer.lookup("q8", [0, 300, 301], 4) == [3, 4]
