"""LLM: the offline API. Prompts in, finished outputs (or a text stream) out.

    llm = LLM("smollm2-135m-instruct")
    llm.generate(["The capital of France is", "1, 2, 3,"], SamplingParams(max_tokens=8))
    llm.chat([{"role": "user", "content": "What is a quadratic equation?"}])
    for text in llm.stream("Once upon a time"): print(text, end="")

All prompts of one call are submitted together and batched by the same scheduler the
server uses; each gets its own KV blocks. A prompt whose sampling fails alone (NaN
logits) comes back with ``finish_reason`` "error" and ``error`` set; the others are
unaffected.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.engine.outputs import RequestOutput
from inferpath.sampling.params import SamplingParams

Message = dict[str, str]


class LLM:
    """An LLMEngine driven to completion on the caller's thread.

    ``engine_config_kwargs`` are EngineConfig fields (dtype, max_model_len, num_kv_blocks,
    max_num_seqs, ...).
    """

    def __init__(self, model: str = "smollm2-135m-instruct", *, engine: LLMEngine | None = None,
                 **engine_config_kwargs):
        self.engine = engine or LLMEngine.from_model(model, EngineConfig(**engine_config_kwargs))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | list[int] | Sequence[str | list[int]],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        """Finished outputs, in prompt order. A single prompt may be passed bare."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run_all(list(prompts), params)

    def chat(self, messages: list[Message] | Sequence[list[Message]],
             params: SamplingParams | None = None) -> list[RequestOutput]:
        """One conversation (a list of messages) or several; the chat template is applied
        and the assistant's turn is prompted."""
        conversations = _conversations(messages)
        prompts = [self.tokenizer.encode_chat(conv) for conv in conversations]
        return self._run_all(prompts, params)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Text deltas of one prompt's first sample as they are produced (stop strings
        never appear). Closing the iterator early aborts the request."""
        request_id = self._submit(prompt, params)
        finished = False
        try:
            while not finished:
                for output in self.engine.step():
                    if output.request_id != request_id:
                        continue
                    finished = output.finished
                    if output.outputs[0].delta_text:
                        yield output.outputs[0].delta_text
        finally:
            if not finished:
                self.engine.abort_request(request_id)
                while self.engine.has_unfinished_requests():
                    self.engine.step()

    # ------------------------------------------------------------------ helpers
    def _submit(self, prompt: str | list[int], params: SamplingParams | None) -> str:
        request_id = f"llm-{next(self._ids)}"
        self.engine.add_request(request_id, prompt, params)
        return request_id

    def _run_all(self, prompts: list[str | list[int]], params: SamplingParams | None) -> list[RequestOutput]:
        ids = []
        try:
            for prompt in prompts:
                ids.append(self._submit(prompt, params))
        except Exception:
            for request_id in ids:
                self.engine.abort_request(request_id)
            while self.engine.has_unfinished_requests():
                self.engine.step()
            raise
        finals: dict[str, RequestOutput] = {}
        while len(finals) < len(ids):
            for output in self.engine.step():
                if output.finished:
                    finals[output.request_id] = output
        return [finals[request_id] for request_id in ids]


def _conversations(messages: Any) -> list[list[Message]]:
    """``messages`` as a list of conversations: one (a list of message dicts) or several (a
    list of such lists); ValueError saying which shape was expected otherwise."""
    from inferpath.tokenizer.chat import check_messages

    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("LLM.chat takes a conversation (a non-empty list of message dicts "
                         "with 'role' and 'content') or a list of them, got "
                         f"{type(messages).__name__} {messages!r:.60}")
    if not isinstance(messages[0], (dict, list, tuple)):
        raise ValueError(f"messages[0] must be a dict (a message) or a list (a conversation), "
                         f"got {type(messages[0]).__name__} {messages[0]!r:.60}")
    conversations = [messages] if isinstance(messages[0], dict) else list(messages)
    for conversation in conversations:
        check_messages(conversation)
    return conversations

