"""LLMEngine: requests in, RequestOutputs out, one step at a time.

    step = schedule -> execute -> update -> process outputs

The scheduler ends requests (EOS, max_tokens, context, abort, a request's own sampling
failure); the output processor turns tokens into text, stop strings and deltas outside
that core. What is decided once (model, kernels, parallelism, cache size) is built by
engine/builder.py, so this module imports neither ``kernels/`` nor ``parallel/``.

``add_request`` and ``abort_request`` may be called from another thread than ``step``
(the AsyncEngine's event loop versus its worker thread): they only validate and queue,
under a lock, and ``step`` takes the queued work at its start. So a new request joins the
running batch at the next step, and an abort frees its blocks at the next step.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque

import torch

from inferpath.cache.blocks import BlockManager
from inferpath.cache.kv import KVCache
from inferpath.config import ConfigError, EngineConfig, ModelConfig
from inferpath.engine.errors import QueueFullError, RequestError
from inferpath.engine.group import RequestGroup
from inferpath.engine.load import weight_format
from inferpath.engine.output_processor import OutputProcessor, SampleText
from inferpath.engine.outputs import EngineStats, RequestOutput
from inferpath.engine.request import Request, RequestStatus
from inferpath.engine.runner import ModelRunner
from inferpath.engine.scheduler import SampleUpdate, Scheduler
from inferpath.model.batch_invariant import make_batch_invariant, make_row_invariant_capable
from inferpath.sampling.params import SamplingParams
from inferpath.sampling.sampler import Sampler
from inferpath.threads import DecodeThreadTuner

logger = logging.getLogger(__name__)

# A model whose decode step reads at least this many weight bytes decodes at the configured
# thread count, untuned: its parallel sections last milliseconds, so waking threads costs
# nothing and the pool's chunk claiming hides a descheduled one. Qwen2.5-Coder-1.5B Q4_K_M
# (980 MB a step) measured 2 threads no slower than 1 at every load seen (2-core VM, load
# 5: 10.1 vs 7.1 tok/s; load 11: 3.2 vs 3.1), while the tuner's six-step trials picked 1
# thread in some runs (6.8 tok/s at load 5): a choice that changed from run to run.
TUNED_MAX_DECODE_BYTES = 256 * 2**20


class LLMEngine:
    """Continuous batching over one model (see the module docstring).

    ``max_model_len`` is ``engine_config.max_model_len`` or else the model's
    ``max_position_embeddings``; the number of KV blocks is ``engine_config.num_kv_blocks``
    or else what ``kv_cache_memory_bytes`` holds. ``kv_cache`` and ``sampler`` come from
    engine/builder.py (asked for here when not given). ``weight_plan``: the builder's
    (engine/weight_plan.py); None for a model built by hand, whose cache then takes the
    model's dtype. With ``speculative_config`` (engine/spec/) drafts are proposed after
    each step; a ``draft_model`` method drafts with ``draft_model`` when given, else loads
    the model the config names.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, model_config: ModelConfig,
                 engine_config: EngineConfig, *, eos_token_ids=(), model_name: str = "",
                 kv_cache: KVCache | None = None, sampler: Sampler | None = None,
                 draft_model: torch.nn.Module | None = None, weight_plan=None):
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.engine_config = engine_config
        self.model_name = model_name or model_config.name
        self.max_model_len = _max_model_len(model_config, engine_config)
        self.weight_plan = weight_plan  # engine/weight_plan.py: how the weights run, decided at load
        self.weight_format = weight_format(model, weight_plan)  # measured: formats, bytes per token
        self.eos_token_ids = frozenset(eos_token_ids) | frozenset(tokenizer.eos_token_ids)
        if kv_cache is None or sampler is None:
            from inferpath.engine import builder

            kv_dtype = weight_plan.kv_dtype if weight_plan else getattr(model, "dtype", torch.float32)
            kv_cache = kv_cache or builder.build_kv_cache(model_config, engine_config, kv_dtype)
            sampler = sampler or builder.build_sampler(engine_config)
        self.kv_cache = kv_cache
        self.block_manager = BlockManager(kv_cache.num_blocks, kv_cache.block_size,
                                          engine_config.enable_prefix_caching,
                                          num_state_slots=getattr(kv_cache, "num_state_slots", 0))
        if self.block_manager.prefix_caching_off_reason:
            logger.info(self.block_manager.prefix_caching_off_reason)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=engine_config.max_num_seqs,
                                   max_num_batched_tokens=engine_config.max_num_batched_tokens,
                                   max_model_len=self.max_model_len)
        if engine_config.batch_invariant:  # after accelerate(): the native linears stay
            make_batch_invariant(model)
        elif engine_config.deterministic_seeded:  # seeded requests' rows only (engine/row_passes.py)
            make_row_invariant_capable(model)
        self.runner = ModelRunner(model, self.kv_cache, self.block_manager, sampler,
                                  self.eos_token_ids, thread_tuner=self._thread_tuner(engine_config))
        self.output_processor = OutputProcessor()
        self.speculator = None  # engine/spec/: proposes drafts after each step
        if engine_config.speculative_config is not None:
            from inferpath.engine.spec.speculator import build_speculator

            self.speculator = build_speculator(engine_config.speculative_config, target_config=model_config,
                                               draft=draft_model, engine_config=engine_config)
        self._rng = random.Random(engine_config.seed)  # seeds of requests without one
        self._groups: dict[str, RequestGroup] = {}
        self._partial: dict[str, RequestGroup] = {}  # n > 1 groups with samples not added
        self._lock = threading.Lock()
        self._new: deque[RequestGroup] = deque()
        self._to_abort: set[str] = set()
        self._num_finished = 0
        self._grammar_compiler = None  # structured output: built on the first request asking
        self.tracer = None  # an engine.trace.StepTracer while a trace is on; None: nothing attached

    def _thread_tuner(self, engine_config: EngineConfig) -> DecodeThreadTuner | None:
        """A tuner of one-sequence decode threads (threads.py) where the thread count is left
        to inferpath and the native kernels run (their results do not depend on it)."""
        threads = torch.get_num_threads()
        if (engine_config.threads is not None or threads < 2 or engine_config.batch_invariant
                or engine_config.tensor_parallel_size > 1 or self.weight_format.kernel_level == "PyTorch"
                or self.weight_format.decode_bytes >= TUNED_MAX_DECODE_BYTES):
            return None
        return DecodeThreadTuner(threads)

    @classmethod
    def from_model(cls, model: str, engine_config: EngineConfig | None = None,
                   progress: bool = False) -> LLMEngine:
        """Load an alias (pulled on first use), a .gguf file or a Hugging Face directory."""
        from inferpath.engine.builder import build_engine

        return build_engine(model, engine_config, progress)

    # ------------------------------------------------------------------ intake
    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None, arrival_time: float | None = None) -> None:
        """Queue a request for the next step. Raises RequestError or QueueFullError."""
        params = params or SamplingParams()
        prompt_ids = self._prompt_token_ids(prompt)
        self.scheduler.check_request(len(prompt_ids), params.max_tokens, params.min_tokens)
        self._check_logit_bias(params)
        arrival_time = time.monotonic() if arrival_time is None else arrival_time
        texts = [SampleText(Request(request_id, prompt_ids, params, index=i,
                                    eos_token_ids=self.eos_token_ids,
                                    generator=self._generator(params, i),
                                    grammar=self._grammar_matcher(params),
                                    arrival_time=arrival_time,
                                    row_invariant=self._row_invariant(params)),
                            self.tokenizer.detokenizer(params.skip_special_tokens))
                 for i in range(params.n)]
        group = RequestGroup(request_id, prompt if isinstance(prompt, str) else None, texts)
        with self._lock:
            if request_id in self._groups:
                raise RequestError(f"request id {request_id!r} is already in use")
            num_waiting = len(self.scheduler.waiting) + len(self._new)
            if num_waiting >= self.engine_config.max_waiting_requests:
                raise QueueFullError(
                    f"the waiting queue is full ({num_waiting} requests, "
                    f"max_waiting_requests={self.engine_config.max_waiting_requests}); retry later")
            self._groups[request_id] = group
            self._new.append(group)

    def abort_request(self, request_id: str) -> None:
        """Abort a request; its blocks are freed and a final "abort" output is returned at
        the next step. Unknown or finished ids are ignored."""
        with self._lock:
            self._to_abort.add(request_id)

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return bool(self._groups)

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        """Schedule, execute, update and process once; returns the requests that advanced."""
        touched = self._take_intake()
        start = time.perf_counter()
        scheduled = self.scheduler.schedule()
        tracer = self.tracer
        executed = tracer.execute(scheduled) if tracer else self.runner.execute(scheduled)
        updates = self.scheduler.update(scheduled, executed)
        self.scheduler.finish_requests(self.output_processor.process(updates))  # stop strings
        if self.speculator is not None:  # drafts for the next step to verify, priced by this step's time
            self.speculator.record_step(scheduled, time.perf_counter() - start)
            self.speculator.propose(self.scheduler.running, self.scheduler.waiting)
        return self._make_outputs(touched, updates)

    def _take_intake(self) -> dict[str, RequestGroup]:
        """Hand queued requests to the scheduler and queued aborts to it."""
        touched: dict[str, RequestGroup] = {}
        with self._lock:
            new, self._new = list(self._new), deque()
            to_abort, self._to_abort = self._to_abort, set()
        for group in new:
            self._add_ready_samples(group)
        for request_id in to_abort:
            group = self._groups.get(request_id)
            if group is None:
                continue
            group.aborted = True
            self.scheduler.abort(s.seq_id for s in group.samples[:group.num_added])
            for sample in group.samples[group.num_added:]:  # never scheduled: end them here
                sample.finish(RequestStatus.FINISHED_ABORTED)
            group.num_added = len(group.samples)
            self._partial.pop(request_id, None)
            touched[request_id] = group
        return touched

    def _make_outputs(self, touched: dict[str, RequestGroup],
                      updates: list[SampleUpdate]) -> list[RequestOutput]:
        for update in updates:
            request_id = update.request.request_id
            touched.setdefault(request_id, self._groups[request_id])
        for group in list(self._partial.values()):  # n > 1: the rest join once the prompt is cached
            self._add_ready_samples(group)
        outputs = []
        for request_id, group in touched.items():
            output = group.make_output()
            if output.finished:
                with self._lock:
                    del self._groups[request_id]
                self.output_processor.remove(group.texts)
                self._num_finished += 1
            outputs.append(output)
        return outputs

    def _add_ready_samples(self, group: RequestGroup) -> None:
        for sample in group.samples_to_add(self.engine_config.enable_prefix_caching):
            self.output_processor.add(group.texts[sample.index])
            self.scheduler.add_request(sample)
        if group.num_added < len(group.samples):
            self._partial[group.request_id] = group
        else:
            self._partial.pop(group.request_id, None)

    # ------------------------------------------------------------------ helpers
    def stats(self) -> EngineStats:
        usage = self.block_manager.usage()
        s = self.scheduler.stats
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting) + len(self._new),
            num_kv_blocks_used=usage.num_used_blocks,
            num_kv_blocks_total=usage.num_total_blocks,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            num_preemptions=s.num_preemptions,
            num_prompt_tokens_computed=s.num_prompt_tokens_computed,
            num_generation_tokens=s.num_generation_tokens,
            num_requests_finished=self._num_finished,
            num_spec_drafts=s.num_spec_drafts,
            num_spec_draft_tokens=s.num_spec_draft_tokens,
            num_spec_accepted_tokens=s.num_spec_accepted_tokens,
            spec_accepted_per_pos=tuple(s.spec_accepted_per_pos),
        )

    def _prompt_token_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            try:
                return self.tokenizer.encode(prompt)
            except UnicodeEncodeError as exc:
                raise RequestError(f"the prompt holds {prompt[exc.start]!r} at character "
                                   f"{exc.start}, a lone surrogate that is not valid "
                                   "Unicode") from None
        vocab_size = self.model_config.vocab_size
        for token_id in prompt:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
                raise RequestError(f"prompt token id {token_id!r} is not in [0, {vocab_size})")
        return list(prompt)

    def _check_logit_bias(self, params: SamplingParams) -> None:
        vocab_size = self.model_config.vocab_size
        for token_id, _ in params.logit_bias:
            if token_id >= vocab_size:
                raise RequestError(f"logit_bias token id {token_id} is not in [0, {vocab_size})",
                                   param="logit_bias")

    def _grammar_matcher(self, params: SamplingParams):
        """A fresh GrammarMatcher when the params ask for structured output (the compiler
        is built on first use: ~0.1-0.4 s for the vocabulary); GrammarError if the spec does
        not compile."""
        if params.structured is None:
            return None
        if self._grammar_compiler is None:
            from inferpath.structured.compiler import GrammarCompiler

            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.model_config.vocab_size,
                                                     self.eos_token_ids)
        return self._grammar_compiler.new_matcher(params.structured)

    def _row_invariant(self, params: SamplingParams) -> bool:
        """Whether the request's rows run batch-invariant on their own: it sets a seed and
        the engine runs with ``deterministic_seeded`` (under ``batch_invariant`` every row
        already does)."""
        config = self.engine_config
        return config.deterministic_seeded and not config.batch_invariant and params.seed is not None

    def _generator(self, params: SamplingParams, index: int) -> torch.Generator | None:
        """The sample's own RNG, kept across preemptions; greedy samples need none."""
        if params.is_greedy:
            return None
        seed = params.seed + index if params.seed is not None else self._rng.getrandbits(63)
        return torch.Generator().manual_seed(seed)


def _max_model_len(model_config: ModelConfig, engine_config: EngineConfig) -> int:
    limit = model_config.max_position_embeddings
    if engine_config.max_model_len is None:
        return limit
    if not 0 < engine_config.max_model_len <= limit:
        raise ConfigError(f"max_model_len must be in 1..{limit} (the model's "
                          f"max_position_embeddings), got {engine_config.max_model_len}")
    return engine_config.max_model_len
