"""Per-request batch invariance (``EngineConfig(deterministic_seeded=True)``,
engine/row_passes.py): a request that sets a seed gives bitwise the same token ids and
logprobs alone, among 15 other requests, with its prompt in chunks and after a forced
preemption, while the unseeded requests of the same steps keep the fast kernels.

The model is the default one as it runs by default (SmolLM2, Q4_1 + Q8_0 blocks through
the fused int8 kernels, which block rows into wide tiles or GEMM panels unless each row
must stand alone). The reference is the seeded request alone in the same engine. Which
kernel ran for which rows is read from the runner's passes and ``ops.recording_dispatch``.
"""

from __future__ import annotations

import random

import pytest
import torch

from inferpath import LLM
from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import ops
from inferpath.sampling.params import SamplingParams

SEEDED = SamplingParams(n=3, seed=1234, temperature=0.9, top_k=40, top_p=0.95, max_tokens=6, logprobs=2,
                        ignore_eos=True)
PROMPT = "Write one sentence about a small red boat."


def others(count: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Unseeded neighbours: prompts of 5 to 40 random tokens, greedy or sampled with
    other truncations (so that the batched sampler holds other top-k / top-p rows)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = [rng.randrange(1000, 40_000) for _ in range(rng.randint(5, 40))]
        params = (SamplingParams(max_tokens=rng.randint(2, 8), temperature=0) if i % 3 == 0 else
                  SamplingParams(max_tokens=rng.randint(2, 8), temperature=1.0, top_k=rng.choice([0, 5, 200]),
                                 top_p=rng.choice([1.0, 0.8]), logprobs=1))
        out.append((prompt, params))
    return out


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m-instruct", deterministic_seeded=True, max_num_seqs=32)


def sibling_engine(llm, **overrides) -> LLMEngine:
    """Another engine over the same loaded model (its own cache and scheduler)."""
    e = llm.engine
    config = EngineConfig(**(dict(deterministic_seeded=True, max_num_seqs=32) | overrides))
    return LLMEngine(e.runner.model, e.tokenizer, e.model_config, config, eos_token_ids=e.eos_token_ids,
                     weight_plan=e.weight_plan)


def run(engine: LLMEngine, requests: list, seeded_at: int | None = 0, on_step=None) -> dict:
    """Submit ``requests`` ((prompt, params) pairs) with the seeded request at index
    ``seeded_at`` (None: not at all); step to the end. -> request id -> its samples as
    [(token ids, logprobs as a tensor (tokens, 3): chosen + top 2)]."""
    items = list(requests)
    if seeded_at is not None:
        items.insert(seeded_at, (PROMPT, SEEDED))
    for i, (prompt, params) in enumerate(items):
        engine.add_request("seeded" if i == seeded_at else f"r{i}", prompt, params)
    finished = {}
    while engine.has_unfinished_requests():
        outputs = engine.step()
        if on_step is not None:
            on_step(engine)
        for output in outputs:
            if output.finished:
                finished[output.request_id] = [(c.token_ids, _logprob_table(c)) for c in output.outputs]
    return finished


def _logprob_table(completion) -> torch.Tensor:
    """(tokens, 5): the chosen token's logprob, then the top 2 as (id, logprob) pairs."""
    if completion.logprobs is None:  # a greedy neighbour that did not ask
        return None
    rows = [[lp.logprob] + [v for pair in lp.top for v in pair] for lp in completion.logprobs]
    return torch.tensor(rows, dtype=torch.float64)


def assert_same(samples, reference) -> None:
    assert len(samples) == len(reference) == SEEDED.n
    for (ids, logprobs), (ref_ids, ref_logprobs) in zip(samples, reference):
        assert ids == ref_ids
        assert torch.equal(logprobs, ref_logprobs)


def test_seeded_request_is_bitwise_the_same_alone_in_a_batch_chunked_and_preempted(llm):
    engine = llm.engine
    alone = run(engine, [])["seeded"]
    assert all(len(ids) == SEEDED.max_tokens for ids, _ in alone)
    assert len({tuple(ids) for ids, _ in alone}) > 1  # three samples, really drawn

    crowd = others(15, seed=1)
    assert_same(run(engine, crowd, 7)["seeded"], alone)  # in the middle of the step's chunks

    chunked = sibling_engine(llm, max_num_batched_tokens=7)  # every prompt in chunks of <= 7
    assert_same(run(chunked, crowd[:4], 2)["seeded"], alone)

    preempted: list[int] = []

    def watch(e):
        preempted.extend(r.num_preemptions for r in list(e.scheduler.running) + list(e.scheduler.waiting)
                         if r.request_id == "seeded")

    tiny = sibling_engine(llm, num_kv_blocks=20, block_size=4)  # 80 slots for 18 sequences
    assert_same(run(tiny, crowd, 15, on_step=watch)["seeded"], alone)
    assert max(preempted) > 0  # the seeded samples (newest) were preempted and recomputed


def test_seeded_request_never_reads_blocks_the_fast_path_computed(llm):
    """An unseeded request with the same prompt fills the prefix cache first (its K/V from
    the fast kernels); the seeded one computes its own and still matches itself alone."""
    engine = sibling_engine(llm)
    alone = run(engine, [])["seeded"]
    fresh = sibling_engine(llm)
    prompt_ids = fresh.tokenizer.encode(PROMPT)
    run(fresh, [(PROMPT, SamplingParams(max_tokens=2, temperature=0))], seeded_at=None)
    hits = fresh.stats().prefix_cache_hits
    assert_same(run(fresh, [])["seeded"], alone)
    # no hit for sample 0 across namespaces; samples 1 and 2 hit sample 0's own blocks
    block = fresh.engine_config.block_size
    assert fresh.stats().prefix_cache_hits - hits == 2 * ((len(prompt_ids) - 1) // block * block)


def record_native_layer_calls(engine: LLMEngine, monkeypatch) -> list[tuple[int, int]]:
    """(rows, rows alone?) of each native all-layers call (kernels/decode_stack.py) the
    engine's model makes from now on (the call reads its flag before the stage-time buffer)."""
    plan = engine.runner.model.model._native_plan()
    assert not plan.reason, plan.reason
    calls, native = [], plan.decode_fn

    def recording(*args):
        calls.append((args[4], int(args[-2])))
        return native(*args)

    monkeypatch.setattr(plan, "decode_fn", recording)
    return calls


def test_unseeded_rows_keep_the_fast_kernels_in_the_same_step(llm, monkeypatch):
    engine = sibling_engine(llm)
    crowd = others(4, seed=2)
    for prompt, params in crowd:
        engine.add_request(f"u{len(prompt)}", prompt, params)
    engine.add_request("seeded", PROMPT, SEEDED)
    native_calls = record_native_layer_calls(engine, monkeypatch)
    with ops.recording_dispatch() as log:
        engine.step()  # every prompt in one step
    passes = engine.runner.last_passes
    assert [p.invariant for p in passes] == [False, True]
    assert {s[0] for s in passes[0].seq_ids} == {f"u{len(p)}" for p, _ in crowd}
    assert {s[0] for s in passes[1].seq_ids} == {"seeded"}
    fast_rows = sum(len(p) for p, _ in crowd)
    seeded_rows = len(engine.tokenizer.encode(PROMPT))  # sample 0 only: 1 and 2 wait for its blocks
    fast = {(c.kernel, c.rows) for c in log if not c.invariant}
    invariant = {(c.kernel, c.rows) for c in log if c.invariant}
    # the unseeded prompts' linears ran as one batch through the kernels free to block rows
    assert ("quant-fused", fast_rows) in fast and all(k in ("quant-fused", "quant-tiled") for k, _ in fast)
    assert {rows for _, rows in fast} == {fast_rows, len(crowd)}  # the layers', then the LM head's
    # the seeded prompt's rows as one-token queries through the native layer call, each row
    # alone (its quantized matmuls told so), then its sampled row's LM head the same way
    assert native_calls == [(seeded_rows, 1)]
    assert invariant == {("quant-rows", 1)}

    # the same unseeded step without the seeded request runs the same kernels for them
    control = sibling_engine(llm)
    for prompt, params in crowd:
        control.add_request(f"u{len(prompt)}", prompt, params)
    with ops.recording_dispatch() as control_log:
        control.step()
    assert [p.invariant for p in control.runner.last_passes] == [False]
    assert {(c.kernel, c.rows) for c in control_log} == fast
    assert native_calls == [(seeded_rows, 1)]  # no native call for the prompts' batch


def test_seeded_requests_run_the_default_path_without_the_flag(llm):
    engine = sibling_engine(llm, deterministic_seeded=False)
    engine.add_request("seeded", PROMPT, SEEDED)
    engine.add_request("u", [1000 + i for i in range(40)], SamplingParams(max_tokens=2, temperature=0))
    with ops.recording_dispatch() as log:
        engine.step()
    assert [p.invariant for p in engine.runner.last_passes] == [False]
    assert not any(c.invariant for c in log)


def test_deterministic_seeded_refuses_tensor_parallelism():
    with pytest.raises(ValueError, match="deterministic_seeded"):
        EngineConfig(deterministic_seeded=True, tensor_parallel_size=2)


def test_deterministic_seeded_refuses_speculative_decoding():
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(deterministic_seeded=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2})


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_bf16_float_model_seeded_rows_through_both_linear_paths(cpu_kernels):
    """A small random bf16 Llama (where a batch's GEMM changes bits most): the native GEMV
    path, and plain PyTorch linears (``RowwiseWhenAskedLinear``, row by row only inside
    the invariant pass)."""
    from test_batch_invariant import CONFIG, random_prompts

    from inferpath.kernels import accelerate
    from inferpath.model import Transformer
    from inferpath.model.batch_invariant import RowwiseWhenAskedLinear
    from inferpath.models import resolve_model
    from inferpath.tokenizer import load_tokenizer

    model = Transformer(CONFIG, dtype=torch.bfloat16)
    model.init_random_weights(seed=0, std=0.08)
    if cpu_kernels:
        accelerate(model)
    tokenizer = load_tokenizer(resolve_model("smollm2-135m-instruct"))

    def engine(**overrides):
        config = dict(dtype="bfloat16", block_size=4, num_kv_blocks=512, deterministic_seeded=True) | overrides
        return LLMEngine(model, tokenizer, CONFIG, EngineConfig(**config), eos_token_ids=[])

    params = SamplingParams(n=2, seed=7, temperature=0.8, max_tokens=5, logprobs=0)
    prompt = random_prompts(1, seed=99, lengths=(13, 13))[0]

    def seeded_run(e, neighbours):
        for i, other in enumerate(neighbours):
            e.add_request(f"r{i}", other, SamplingParams(max_tokens=3, temperature=0))
        e.add_request("seeded", prompt, params)
        out = {}
        while e.has_unfinished_requests():
            for o in e.step():
                if o.finished and o.request_id == "seeded":
                    out = [(c.token_ids, torch.tensor([lp.logprob for lp in c.logprobs])) for c in o.outputs]
        return out

    alone = seeded_run(engine(), [])
    if not cpu_kernels:
        assert any(type(m) is RowwiseWhenAskedLinear for m in model.modules())
    crowded = seeded_run(engine(), random_prompts(7, seed=3, lengths=(14, 40)))
    chunked = seeded_run(engine(max_num_batched_tokens=5), random_prompts(2, seed=4, lengths=(5, 9)))
    for result in (crowded, chunked):
        assert [ids for ids, _ in result] == [ids for ids, _ in alone]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(result, alone))
