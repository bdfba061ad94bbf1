"""Reasoning separated from the answer: which parser a model gets, and the ``<think>`` one.

A reasoning model writes its thinking before the answer, in a syntax its family was
trained on. The server splits the answer text into pieces, ``("reasoning", text)`` and
``("content", text)`` (and, for harmony, ``("call", ToolCall)``), so the thinking goes to
``message.reasoning_content`` / ``message.reasoning`` and never into ``content``.

The parsers, by vLLM's names (``inferpath serve --reasoning-parser NAME``):

- ``qwen3``: ``<think>…</think>`` at the start of the answer (Qwen3, QwQ, SmolLM3). With no
  ``<think>`` the whole answer is content, unless the prompt itself ended inside an open
  think block (templates that write ``<think>`` into the generation prompt): then the
  answer starts as reasoning and ``</think>`` ends it.
- ``deepseek_r1``: the same tags, but the answer always starts inside the reasoning
  (DeepSeek-R1's template opens it in the prompt): text before ``</think>`` is reasoning.
- ``gpt_oss``: the harmony format's channels (reasoning_harmony.py).
- ``none``: no separation.

Chosen from the model (``choose_reasoning_parser``) unless the flag names one. Every parser
is incremental: ``add(text)`` returns the pieces that are certain, holding back a tail that
could still be the start of a tag, so a tag split across tokens never leaks into content;
``finish()`` returns the rest. Invariant (tested with hypothesis): any split of a text
into ``add`` calls gives the same concatenated reasoning, content and calls.
"""

from __future__ import annotations

from typing import Any, Protocol

#: The parser names ``--reasoning-parser`` accepts.
REASONING_PARSERS = ("qwen3", "deepseek_r1", "gpt_oss", "none")
THINK_START, THINK_END = "<think>", "</think>"

Piece = tuple[str, Any]  # ("reasoning" | "content", str) or ("call", ToolCall)


class ReasoningParser(Protocol):
    def add(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


def choose_reasoning_parser(architecture: str, chat_template: str | None,
                            override: str | None = None) -> str:
    """The parser for a model: ``override`` if given (one of REASONING_PARSERS), else
    ``gpt_oss`` for gpt-oss or a template that writes harmony channels, ``deepseek_r1``
    for DeepSeek families whose template thinks, ``qwen3`` for any other template that
    writes ``<think>``, else ``none``."""
    if override is not None:
        if override not in REASONING_PARSERS:
            raise ValueError(f"reasoning parser {override!r} is not one of "
                             f"{', '.join(REASONING_PARSERS)}")
        return override
    template = chat_template or ""
    if architecture == "gpt_oss" or "<|channel|>" in template:
        return "gpt_oss"
    if THINK_START not in template and THINK_END not in template:
        return "none"
    if architecture.startswith("deepseek"):
        return "deepseek_r1"
    return "qwen3"


#: End-of-answer tokens each format needs, by text: gpt-oss ends an answer with
#: ``<|return|>`` and a tool call with ``<|call|>``. A Hugging Face directory lists both in
#: generation_config.json; a GGUF file names one EOS id, so the other is added here.
FORMAT_STOP_TOKENS = {"gpt_oss": ("<|return|>", "<|call|>")}


def format_stop_token_ids(parser: str, tokenizer: Any, eos_token_ids: frozenset[int]) -> tuple[int, ...]:
    """Ids of the parser's stop tokens (FORMAT_STOP_TOKENS) that the model's own EOS ids
    lack and its vocabulary has."""
    ids = []
    for text in FORMAT_STOP_TOKENS.get(parser, ()):
        encoded = tokenizer.encode(text, allow_special=True, add_bos=False)
        if len(encoded) == 1 and encoded[0] not in eos_token_ids:
            ids.append(encoded[0])
    return tuple(ids)


def prompt_opens_think(prompt_tail: str) -> bool:
    """True when a rendered prompt ends inside an open ``<think>`` block (the answer
    starts as reasoning); ``prompt_tail`` is the end of the prompt's text."""
    start = prompt_tail.rfind(THINK_START)
    return start >= 0 and THINK_END not in prompt_tail[start:] \
        and not prompt_tail[start + len(THINK_START):].strip()


def new_reasoning_parser(name: str, starts_inside: bool = False) -> ReasoningParser | None:
    """A fresh parser for one answer (None for ``none``)."""
    if name == "none":
        return None
    if name == "gpt_oss":
        from inferpath.server.reasoning_harmony import HarmonyParser
        return HarmonyParser()
    return ThinkParser(starts_inside=starts_inside or name == "deepseek_r1")


def split_reasoning(parser: ReasoningParser | None, text: str) -> tuple[str | None, str, list[Any]]:
    """(reasoning or None if there was none, content, harmony calls) of a whole answer."""
    if parser is None:
        return None, text, []
    return join_pieces(parser.add(text) + parser.finish())


def join_pieces(pieces: list[Piece]) -> tuple[str | None, str, list[Any]]:
    reasoning = [p for kind, p in pieces if kind == "reasoning"]
    content = "".join(p for kind, p in pieces if kind == "content")
    calls = [p for kind, p in pieces if kind == "call"]
    return ("".join(reasoning) if reasoning else None), content, calls


def possible_prefix_len(text: str, tags: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could be the start of one of ``tags``."""
    longest = max(len(tag) for tag in tags) - 1
    for n in range(min(longest, len(text)), 0, -1):
        tail = text[-n:]
        if any(tag.startswith(tail) for tag in tags):
            return n
    return 0


class ThinkParser:
    """``<think>reasoning</think>content`` (see the module docstring).

    The reasoning is stripped of the whitespace around it, the content of the whitespace
    that follows ``</think>``: held back until something else follows, dropped at the end.
    An answer that reasoned yields at least one reasoning piece (``""`` for an empty think
    block), so "reasoned about nothing" and "did not reason" stay apart.
    """

    def __init__(self, starts_inside: bool = False) -> None:
        self.state = "start"  # start -> reasoning -> after_think -> content
        self.starts_inside = starts_inside
        self.held = ""  # text not yet certain
        self.num_reasoning = 0  # reasoning characters sent (leading whitespace is dropped)

    def add(self, text: str) -> list[Piece]:
        self.held += text
        return self._advance(final=False)

    def finish(self) -> list[Piece]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        if self.state == "start":
            stripped = self.held.lstrip()
            if stripped.startswith(THINK_START):
                self.held, self.state = stripped[len(THINK_START):], "reasoning"
            elif THINK_START.startswith(stripped) and not final:
                return pieces  # nothing yet, or the start of the tag
            else:
                self.state = "reasoning" if self.starts_inside else "content"
            if self.state == "reasoning":
                pieces.append(("reasoning", ""))
        if self.state == "reasoning":
            end = self.held.find(THINK_END)
            if end < 0 and not final:
                hold = possible_prefix_len(self.held, (THINK_END,))
                certain = self.held[:len(self.held) - hold].rstrip()  # trailing space: held
                pieces += self._reasoning(certain)
                self.held = self.held[len(certain):]
                return pieces
            body = self.held[:end] if end >= 0 else self.held
            pieces += self._reasoning(body.rstrip())
            self.held = self.held[end + len(THINK_END):] if end >= 0 else ""
            self.state = "after_think"
        if self.state == "after_think":
            stripped = self.held.lstrip()
            if not stripped and not final:
                return pieces
            self.held, self.state = stripped, "content"
        if self.state == "content" and self.held:
            pieces.append(("content", self.held))
            self.held = ""
        return pieces

    def _reasoning(self, text: str) -> list[Piece]:
        if self.num_reasoning == 0:
            text = text.lstrip()
        if not text:
            return []
        self.num_reasoning += len(text)
        return [("reasoning", text)]


def template_variables(chat_template: str | None, chat_template_kwargs: dict[str, Any] | None,
                       reasoning_effort: str | None, effort_param: str = "reasoning_effort",
                       kwargs_param: str = "chat_template_kwargs") -> dict[str, Any]:
    """The extra variables a request gives the chat template: its ``chat_template_kwargs``
    and ``reasoning_effort`` (gpt-oss's template reads it). A variable the template never
    names would change nothing, so it is refused (ValueError naming the field) rather
    than ignored."""
    from inferpath.server.protocol_extras import ParamError

    template = chat_template or ""
    variables = dict(chat_template_kwargs or {})
    for name in variables:
        if not isinstance(name, str) or name not in template:
            raise ParamError(f"{kwargs_param} sets {name!r}, which this model's chat template "
                             "does not read", kwargs_param)
    if reasoning_effort is not None:
        if "reasoning_effort" not in template:
            raise ParamError(f"{effort_param} is {reasoning_effort!r}, but this model's chat "
                             "template takes no reasoning effort; leave it out", effort_param)
        variables.setdefault("reasoning_effort", reasoning_effort)
    return variables


def history_reasoning(messages: list[dict[str, Any]], chat_template: str | None) -> list[dict[str, Any]]:
    """Messages whose earlier reasoning (``reasoning_content``) is under the key the
    template reads: ``reasoning_content`` (Qwen3), ``thinking`` (gpt-oss), or dropped for a
    template that shows no earlier reasoning."""
    template = chat_template or ""
    key = "reasoning_content" if "reasoning_content" in template else \
        "thinking" if "thinking" in template else None
    rendered = []
    for message in messages:
        if "reasoning_content" in message:
            message = dict(message)
            reasoning = message.pop("reasoning_content")
            if key is not None and reasoning:
                message[key] = reasoning
        rendered.append(message)
    return rendered
