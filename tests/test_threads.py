"""Thread choice (threads.py): the decode thread tuner picks the count whose steps measured
faster, and switching counts mid-generation changes no token."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import build
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams
from inferpath.threads import INLINE_SAMPLING_VALUES, DecodeThreadTuner, physical_cores, sampling_threads, threads_phrase


def run_steps(tuner: DecodeThreadTuner, seconds_at: dict[int, float], steps: int) -> list[int]:
    """Drive ``tuner`` for ``steps`` decode steps whose time depends on the count only."""
    counts = []
    for _ in range(steps):
        count = tuner.next_count()
        counts.append(count)
        tuner.observe(seconds_at[count])
    return counts


def test_the_summary_line_says_one_thread_in_the_singular():
    assert [threads_phrase(n) for n in (1, 2, 16)] == ["1 thread", "2 threads", "16 threads"]


def test_tuner_keeps_the_faster_count_then_measures_again():
    tuner = DecodeThreadTuner(2)
    assert tuner.describe() == "2 threads (one-sequence decode: trying 2 and 1)"
    trial = (DecodeThreadTuner.TRIAL_STEPS + 1) * 2  # each count: one uncounted switch step + the counted ones
    counts = run_steps(tuner, {2: 0.020, 1: 0.012}, trial)
    assert counts == [2] * (trial // 2) + [1] * (trial // 2)
    assert tuner.chosen == 1 and tuner.describe() == "2 threads (one-sequence decode: 1, measured faster)"
    assert run_steps(tuner, {2: 0.020, 1: 0.012}, DecodeThreadTuner.EXPLOIT_STEPS) == [1] * DecodeThreadTuner.EXPLOIT_STEPS
    # the machine quietens: the next trial finds two threads faster again
    run_steps(tuner, {2: 0.010, 1: 0.012}, trial)
    assert tuner.chosen == 2


def test_tuner_judges_by_the_median_not_one_outlier():
    tuner = DecodeThreadTuner(2)
    times = iter([9.0] + [0.010] * 6 + [0.5] + [0.030] * 5 + [0.001])  # switch steps are not counted
    for _ in range((DecodeThreadTuner.TRIAL_STEPS + 1) * 2):
        tuner.next_count()
        tuner.observe(next(times))
    assert tuner.chosen == 2


def test_tuner_keeps_the_configured_count_where_one_thread_is_barely_faster():
    """A median within MARGIN is noise: the choice stays put, trial after trial."""
    tuner = DecodeThreadTuner(2)
    trial = (DecodeThreadTuner.TRIAL_STEPS + 1) * 2
    for _ in range(3):
        run_steps(tuner, {2: 0.020, 1: 0.020 * (1 - DecodeThreadTuner.MARGIN / 2)}, trial)
        assert tuner.chosen == 2
        run_steps(tuner, {2: 0.020, 1: 0.019}, DecodeThreadTuner.EXPLOIT_STEPS)
    run_steps(tuner, {2: 0.020, 1: 0.020 * (1 - 2 * DecodeThreadTuner.MARGIN)}, trial)
    assert tuner.chosen == 1


def test_tuner_stops_trying_one_thread_that_lost_every_step():
    """Two counted one-thread steps both slower than the configured count's median end the
    trial: 3 one-thread steps (the uncounted switch and the two), then the configured count."""
    tuner = DecodeThreadTuner(2)
    half = DecodeThreadTuner.TRIAL_STEPS + 1
    counts = run_steps(tuner, {2: 0.020, 1: 0.026}, half + 1 + DecodeThreadTuner.EARLY_STOP_STEPS + 5)
    assert counts == [2] * half + [1] * (1 + DecodeThreadTuner.EARLY_STOP_STEPS) + [2] * 5
    assert tuner.chosen == 2 and tuner.num_trials == 1
    # one fast one-thread step among them keeps the trial going
    tuner = DecodeThreadTuner(2)
    times = iter([0.020] * half + [0.026, 0.019] + [0.026] * 10)
    counts = []
    for _ in range(2 * half):
        counts.append(tuner.next_count())
        tuner.observe(next(times))
    assert counts == [2] * half + [1] * half


def test_a_model_reading_many_bytes_a_step_decodes_untuned(monkeypatch):
    """Past TUNED_MAX_DECODE_BYTES a step, the configured count serves every step."""
    from inferpath.engine import llm_engine

    path = resolve_model("smollm2-135m-instruct")
    config = EngineConfig(kv_cache_memory_bytes=16 * 2**20)
    tuned = LLMEngine.from_model(path, config)
    if tuned.runner.thread_tuner is None:
        pytest.skip("no tuner here (one core, or no native kernels)")
    monkeypatch.setattr(llm_engine, "TUNED_MAX_DECODE_BYTES", tuned.weight_format.decode_bytes)
    assert LLMEngine.from_model(path, config).runner.thread_tuner is None


def test_tuner_needs_two_threads_to_choose_from():
    with pytest.raises(ValueError, match="at least 2 threads"):
        DecodeThreadTuner(1)


@pytest.mark.skipif(build.native_quant_matmul() is None or physical_cores() < 2,
                    reason=f"needs the native kernels and 2 threads: {build.kernel_status()}")
def test_engine_switching_decode_threads_changes_no_token():
    """SmolLM2 Q4_1 with the thread count left to inferpath: the tuner runs decode steps at
    2 and at 1 thread (and prompts at 2); the greedy tokens equal those of a fixed 2."""
    path = resolve_model("smollm2-135m-instruct")
    params = SamplingParams(max_tokens=2 * (DecodeThreadTuner.TRIAL_STEPS + 1) + 6, temperature=0, ignore_eos=True)
    fixed = LLMEngine.from_model(path, EngineConfig(threads=2, kv_cache_memory_bytes=16 * 2**20))
    assert fixed.runner.thread_tuner is None

    def greedy(engine: LLMEngine, seen: list[int]) -> list[int]:
        engine.add_request("0", "The lighthouse keeper found a bottle", params)
        done = []
        while engine.has_unfinished_requests():
            done += [o for o in engine.step() if o.finished]
            seen.append(torch.get_num_threads())
        return list(done[0].outputs[0].token_ids)

    fixed_counts: list[int] = []
    expected_tokens = greedy(fixed, fixed_counts)
    tuned = LLMEngine.from_model(path, EngineConfig(threads=None, kv_cache_memory_bytes=16 * 2**20))
    assert isinstance(tuned.runner.thread_tuner, DecodeThreadTuner)
    tuned_counts: list[int] = []
    try:
        assert greedy(tuned, tuned_counts) == expected_tokens
    finally:
        torch.set_num_threads(tuned.runner.thread_tuner.configured)
    assert set(fixed_counts) == {2} and {1, 2} <= set(tuned_counts)


def test_sampling_threads_is_one_for_few_logits_and_restores_the_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with sampling_threads(INLINE_SAMPLING_VALUES):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with sampling_threads(INLINE_SAMPLING_VALUES + 1):
            assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), sampling_threads(10):
            raise RuntimeError("a sampler error")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


class _CountingSampler:
    """The engine's sampler, noting PyTorch's thread count and the logits' size at each call."""

    def __init__(self, sampler) -> None:
        self.sampler, self.calls = sampler, []

    def __call__(self, logits, rows):
        self.calls.append((logits.numel(), torch.get_num_threads()))
        return self.sampler(logits, rows)

    def __getattr__(self, name):
        return getattr(self.sampler, name)


def test_a_step_samples_few_logits_on_the_calling_thread():
    """A decode step's sampling (SmolLM2: 49,152 logits a row) runs at one thread, so that no
    PyTorch op opens an OpenMP region beside the decode pool (threads.py); a step sampling
    more than INLINE_SAMPLING_VALUES logits keeps the configured count; every step after
    runs at the configured count again."""
    path = resolve_model("smollm2-135m-instruct")
    engine = LLMEngine.from_model(path, EngineConfig(threads=2, kv_cache_memory_bytes=64 * 2**20))
    counting = engine.runner.sampler = _CountingSampler(engine.runner.sampler)
    vocab = engine.runner.model.config.vocab_size
    many = INLINE_SAMPLING_VALUES // vocab + 1  # prompts whose first tokens, sampled in one step, pass the bound
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    after_steps = []
    for batch in ([str(i) for i in range(many)], ["alone"]):
        for request_id in batch:
            engine.add_request(request_id, f"Tell me about {request_id}", params)
        while engine.has_unfinished_requests():
            engine.step()
            after_steps.append(torch.get_num_threads())
    assert set(after_steps) == {2}
    assert counting.calls[0] == (many * vocab, 2)  # the batch's steps: more logits than the bound
    assert counting.calls[-3:] == [(vocab, 1)] * 3  # the request alone: its prompt's step and two decode steps


def _first_line(source: list[str], pattern: str) -> int | None:
    return next((i for i, line in enumerate(source) if re.match(pattern, line)), None)


def test_every_benchmark_imports_inferpath_before_torch():
    """torch's OpenMP threads spin between parallel sections unless OMP_WAIT_POLICY is set
    before torch loads libgomp; importing inferpath sets it (threads.py). A script that
    imports torch first measures another engine: on the 1.5B file a verification step of 8
    rows took 303 ms instead of 119, torch's SiLU over (8, 8960) values going parallel
    while the decode pool's workers waited for the cores its threads held."""
    benchmarks = Path(__file__).parents[1] / "benchmarks"
    for script in sorted(benchmarks.glob("*.py")):
        source = script.read_text().splitlines()
        torch_at = _first_line(source, r"(import torch|from torch)\b")
        inferpath_at = _first_line(source, r"(import inferpath|from inferpath)\b")
        if torch_at is None:
            continue
        assert inferpath_at is not None and inferpath_at < torch_at, (
            f"{script.name} imports torch (line {torch_at + 1}) before inferpath: its figures would "
            "be taken with OpenMP threads spinning")
