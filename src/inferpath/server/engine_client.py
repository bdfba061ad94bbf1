"""How the HTTP handlers talk to the AsyncEngine: submit, follow, abort.

Handlers never step the engine; they enqueue requests and await their streams. One HTTP
request may carry several prompts (completions accept a list); each becomes one engine
request (its ``n`` samples share the prompt's KV blocks inside the engine), and their
streams are merged here.

Invariant: every engine request submitted through a ``Submission`` is either followed
to its finished output or aborted (``Submission.abort_unfinished``), so a client that
goes away never leaves KV blocks behind.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, TypeVar

from fastapi import Request

from inferpath.engine import QueueFullError, RequestError
from inferpath.sampling.params import SamplingParams
from inferpath.structured import GrammarError
from inferpath.server.errors import APIError
from inferpath.server.generation_defaults import with_defaults
from inferpath.server.metrics import ServerMetrics

#: How often a non-streaming handler checks whether its client is still connected.
DISCONNECT_POLL_SECONDS = 0.25
#: OpenAI's limit on choices per request; ``build_app(max_n=...)`` / ``--max-n`` change it.
DEFAULT_MAX_N = 128

T = TypeVar("T")


@dataclass
class ServingContext:
    """What every handler needs: the engine, its tokenizer, the served name, metrics."""

    async_engine: Any
    tokenizer: Any
    model_name: str
    max_model_len: int
    metrics: ServerMetrics
    api_key: str | None = None
    max_n: int = DEFAULT_MAX_N
    other_names: tuple[str, ...] = ()  # further ids the model answers to (vLLM: several names)
    reasoning_parser: str = "none"  # server/reasoning.py: how answers' thinking is split off
    format_stop_token_ids: tuple[int, ...] = ()  # stops the answer format needs beyond EOS
    # what a request that leaves a sampling field out gets (server/generation_defaults.py)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    # CPU work on request input (tokenizing, chat templates) runs here, never on the
    # event loop: /health and every stream stay responsive during a 1 MB prompt
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=2, thread_name_prefix="inferpath-input"))
    # the engine's StepTracer where this server may trace (server/trace_routes.py), else None
    tracer: Any = None

    def release(self) -> None:
        """Let go of the engine once the server has stopped (build_app's lifespan). The
        handlers, which reach the engine only through this context, outlive their app in
        FastAPI's caches of endpoint callables (4,096 of each kind, process-wide): holding the
        engine there kept every stopped server's engine, its KV cache and weights, alive."""
        self.async_engine = None
        self.tracer = None
        self.metrics.release()

    async def run_off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the input thread pool, awaited."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    def sampling(self, params: SamplingParams, body: Any) -> SamplingParams:
        """``params`` of ``body`` with the server's defaults for the fields it left out."""
        return with_defaults(params, body, self.sampling_defaults)

    def check_n(self, n: int) -> None:
        if n > self.max_n:
            raise APIError(400, f"n is {n}, but this server allows at most {self.max_n} "
                           "choices per request (inferpath serve --max-n)", param="n",
                           code="invalid_value")

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name and model not in self.other_names:
            raise APIError(404, f"model {model!r} does not exist; this server serves "
                           f"{self.model_name!r}", param="model", code="model_not_found")


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class Submission:
    """The engine requests of one HTTP request, in prompt order."""

    context: ServingContext
    id: str  # the HTTP response's id; engine requests are id, or id-0, id-1... per prompt
    request_ids: list[str]
    streams: list[Any]
    num_choices_per_prompt: int = 1
    created: int = field(default_factory=lambda: int(time.time()))
    finished: set[int] = field(default_factory=set)
    latest: dict[int, Any] = field(default_factory=dict)  # prompt index -> last RequestOutput

    def abort_unfinished(self) -> None:
        for i, request_id in enumerate(self.request_ids):
            if i not in self.finished:
                self.context.async_engine.abort(request_id)
                self.context.metrics.record_aborted(self.num_choices_per_prompt)
                self.finished.add(i)

    async def outputs(self) -> AsyncIterator[tuple[int, Any]]:
        """(prompt index, RequestOutput) as the engine produces them, all prompts merged.

        Finished outputs are recorded in the metrics. If the consumer stops early or is
        cancelled, unfinished requests are aborted. A request that failed alone (its
        sampling: NaN logits) raises a 400 APIError naming why; the others are aborted.
        """
        queue: asyncio.Queue[tuple[int, Any] | BaseException | None] = asyncio.Queue()

        async def pump(index: int, stream: Any) -> None:
            try:
                async for output in stream:
                    await queue.put((index, output))
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                await queue.put(exc)
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        num_open = len(tasks)
        try:
            while num_open:
                item = await queue.get()
                if item is None:
                    num_open -= 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                index, output = item
                self.latest[index] = output
                if output.error is not None:  # this request alone failed (its sampling)
                    if output.finished and index not in self.finished:
                        self.finished.add(index)
                        self.context.metrics.record_finished(output)
                    raise APIError(400, output.error, code="sampling_failed")
                if output.finished and index not in self.finished:
                    self.finished.add(index)
                    self.context.metrics.record_finished(output)
                yield index, output
        finally:
            for task in tasks:
                task.cancel()
            self.abort_unfinished()

    async def final_outputs(self, request: Request) -> list[Any]:
        """The finished RequestOutput of each prompt. Aborts everything (and raises a 499
        APIError) if the client disconnects first."""
        finals: list[Any] = [None] * len(self.streams)

        async def drain() -> None:
            async for index, output in self.outputs():
                finals[index] = output

        task = asyncio.create_task(drain())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
                if not task.done() and await request.is_disconnected():
                    task.cancel()
                    self.abort_unfinished()
                    # nobody reads this response; the status shows in the error counts
                    raise APIError(499, "client closed the connection; request aborted",
                                   code="client_disconnected")
            task.result()
        finally:
            if not task.done():
                task.cancel()
            self.abort_unfinished()
        return finals


def check_text(text: str, param: str) -> None:
    """400 naming ``param`` for text that is not valid Unicode (a lone surrogate such as
    ``\\ud800``, which JSON can carry but UTF-8 cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(400, f"{param} holds {text[exc.start]!r} at character {exc.start}, a "
                       "lone surrogate that is not valid Unicode; send UTF-8 text",
                       param=param, code="invalid_text") from None


def encode_prompt(context: ServingContext, prompt: str, param: str,
                  add_bos: bool | None = None) -> list[int]:
    """Token ids of a text prompt (run in the input pool: see ``run_off_loop``)."""
    check_text(prompt, param)
    return context.tokenizer.encode(prompt, add_bos=add_bos)


async def submit(context: ServingContext, prefix: str, prompts: list[str | list[int]],
                 params: SamplingParams, prompt_param: str,
                 renames: dict[str, str] | None = None) -> Submission:
    """Add one engine request per prompt; all or none (earlier ones are aborted if a later
    one is refused). Text prompts are tokenized off the event loop first. Engine
    refusals become 400 (naming ``prompt_param``: too long, token ids out of range; or
    the field at fault, as the client spelled it through ``renames``) or 429 (queue
    full); a stopped engine 503."""
    context.check_n(params.n)
    prompts = [await context.run_off_loop(encode_prompt, context, p, prompt_param)
               if isinstance(p, str) else p for p in prompts]
    base_id = new_request_id(prefix)
    submission = Submission(context, base_id, [], [], params.n)
    for i, prompt in enumerate(prompts):
        request_id = base_id if len(prompts) == 1 else f"{base_id}-{i}"
        try:
            stream = context.async_engine.add_request(request_id, prompt, params)
        except QueueFullError as exc:
            submission.abort_unfinished()
            raise APIError(429, str(exc), code="queue_full") from None
        except GrammarError as exc:
            submission.abort_unfinished()
            raise APIError(400, str(exc), param=exc.param, code="invalid_grammar") from None
        except RequestError as exc:
            submission.abort_unfinished()
            if exc.param is None:
                raise APIError(400, str(exc), param=prompt_param, code="invalid_prompt") from None
            param = (renames or {}).get(exc.param, exc.param)
            raise APIError(400, str(exc).replace(exc.param, param), param=param,
                           code="invalid_value") from None
        except RuntimeError as exc:  # EngineDeadError: the loop is not running
            submission.abort_unfinished()
            raise APIError(503, f"the engine is not running: {exc}",
                           code="engine_unavailable") from None
        submission.request_ids.append(request_id)
        submission.streams.append(stream)
    return submission


async def with_usage_so_far(chunks: AsyncIterator[dict[str, Any]],
                            submission: Submission) -> AsyncIterator[dict[str, Any]]:
    """``chunks`` each with the usage so far (vLLM's ``continuous_usage_stats``); chunks
    sent before the engine's first output (the role openers) carry none: the prompt's
    token count is not known yet."""
    async for chunk in chunks:
        if "usage" not in chunk and submission.latest:
            chunk["usage"] = usage([submission.latest[i] for i in sorted(submission.latest)])
        yield chunk


def usage(finals: list[Any]) -> dict[str, Any]:
    """OpenAI's usage object over all prompts and choices of one HTTP request."""
    prompt_tokens = sum(len(f.prompt_token_ids) for f in finals)
    completion_tokens = sum(len(c.token_ids) for f in finals for c in f.outputs)
    cached = sum(f.num_cached_tokens or 0 for f in finals)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
