"""AsyncEngine: one background loop drives ``engine.step``; callers await their streams.

Handlers never step the engine (design.md: one engine loop). They call ``add_request``,
which validates at once (raising RequestError / QueueFullError synchronously) and returns
a RequestStream, an async iterator of RequestOutputs that ends after the finished one.
The loop runs each step in a single worker thread, so the event loop stays responsive
while the model computes, and hands the outputs to the streams.

A request that fails alone (its logits became NaN under its sampling parameters) is no
step failure: its stream ends with a finished output whose ``finish_reason`` is "error"
and whose ``error`` says why, and the other requests go on untouched. The loop never
dies of a bug either: if a step itself raises, every request in flight is aborted (its
blocks freed at the next step) and its stream raises the error; the loop then goes on
with new requests.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from inferpath.engine.llm_engine import LLMEngine
from inferpath.engine.outputs import RequestOutput
from inferpath.sampling.params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine stopped (shutdown) or a step failed while this request was in flight."""


class RequestStream:
    """Async iterator over one request's outputs; ends after the finished output."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._done = False

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item


class AsyncEngine:
    """Wraps an LLMEngine for asyncio callers (see the module docstring)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._streams: dict[str, RequestStream] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferpath-step")
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="inferpath-engine-loop")

    async def shutdown(self) -> None:
        """Stop the loop; streams still open raise EngineDeadError."""
        if self._task is None:
            return
        self._stopping = True
        self._wake()
        await self._task
        self._task = None
        for request_id in list(self._streams):
            self.engine.abort_request(request_id)
        try:
            await self._loop.run_in_executor(self._executor, self.engine.step)  # free the blocks
        except Exception:  # noqa: BLE001 - shutting down anyway
            logger.exception("engine step failed while shutting down")
        self._fail_all(EngineDeadError("the engine was shut down"))

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None) -> RequestStream:
        """Queue a request; raises RequestError or QueueFullError at once."""
        if not self.is_running:
            raise EngineDeadError("the engine loop is not running; call start() first")
        self.engine.add_request(request_id, prompt, params)
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        self._wake()
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request; its blocks are freed and its stream ends at the next step."""
        self.engine.abort_request(request_id)
        self._wake()

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if not self.engine.has_unfinished_requests():
                self._wakeup.clear()
                if not self.engine.has_unfinished_requests():
                    await self._wakeup.wait()
                continue
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as exc:  # noqa: BLE001 - the loop must survive any request
                logger.exception("engine step failed; aborting the requests in flight")
                for request_id in list(self._streams):
                    self.engine.abort_request(request_id)
                self._fail_all(EngineDeadError(f"engine step failed: {exc!r}"))
                continue
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if stream is None:
                    continue
                stream.put(output)
                if output.finished:
                    del self._streams[output.request_id]

    def _fail_all(self, exc: BaseException) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put(exc)

    def _wake(self) -> None:
        if self._wakeup is None or self._loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._wakeup.set()
        else:
            self._loop.call_soon_threadsafe(self._wakeup.set)
