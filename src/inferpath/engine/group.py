"""RequestGroup: one user request fanned out into its ``n`` sequences, and its outputs.

Each of the n samples is its own Request to the scheduler (seq_id ``(request_id, i)``).
Sample 0 goes first; the others join once its prompt is computed, so that they find the
prompt's full blocks in the prefix cache and share them (ref counts) instead of computing
the prompt n times. With a seed, sample i draws from a generator seeded with seed + i.

Invariant: ``num_added`` samples have been handed to the scheduler; the rest wait here.
``make_output`` copies nothing that grows with the output: deltas, and prefixes of the
samples' append-only lists (see CompletionOutput).
"""

from __future__ import annotations

from inferpath.engine.output_processor import SampleText
from inferpath.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferpath.engine.request import Request


class RequestGroup:
    def __init__(self, request_id: str, prompt: str | None, texts: list[SampleText]):
        self.request_id = request_id
        self.prompt = prompt
        self.texts = texts
        self.samples: list[Request] = [t.request for t in texts]
        self.num_added = 0
        self.aborted = False

    @property
    def first(self) -> Request:
        return self.samples[0]

    @property
    def finished(self) -> bool:
        return self.num_added == len(self.samples) and all(
            s.status.is_finished for s in self.samples)

    def samples_to_add(self, prefix_caching: bool) -> list[Request]:
        """The samples the scheduler should get now (marks them added)."""
        if self.num_added == 0:
            ready = self.samples[:1] if prefix_caching else self.samples
        elif self.num_added < len(self.samples) and (
                self.first.num_computed_tokens >= self.first.num_prompt_tokens
                or self.first.status.is_finished):
            ready = self.samples[self.num_added:]
        else:
            ready = []
        self.num_added += len(ready)
        return ready

    def make_output(self) -> RequestOutput:
        """The group's state now, with deltas since the previous ``make_output``."""
        outputs = []
        for text in self.texts:
            sample = text.request
            delta_text, delta_ids, delta_logprobs = text.take_delta()
            outputs.append(CompletionOutput(
                index=sample.index,
                text=text.streamed_text,
                token_ids=text.token_ids,
                num_tokens=len(text.token_ids),
                delta_text=delta_text,
                delta_token_ids=delta_ids,
                logprobs=text.logprobs,
                delta_logprobs=delta_logprobs,
                finish_reason=sample.finish_reason,
                stop_reason=sample.stop_reason,
                error=sample.error,
            ))
        first_times = [s.first_token_time for s in self.samples if s.first_token_time is not None]
        finished = self.finished
        metrics = RequestMetrics(
            arrival_time=self.first.arrival_time,
            first_token_time=min(first_times) if first_times else None,
            finished_time=max(s.finished_time for s in self.samples) if finished else None,
        )
        return RequestOutput(self.request_id, self.first.prompt_token_ids, outputs, finished,
                             num_cached_tokens=self.first.num_cached_tokens, metrics=metrics,
                             prompt=self.prompt,
                             prompt_logprobs=(list(self.first.prompt_logprobs)
                                              if self.first.prompt_logprobs is not None else None))
