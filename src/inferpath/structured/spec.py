"""StructuredOutput: what a request's output must match. Imports no torch, no grammar engine.

Kinds (named after the OpenAI / vLLM fields they come from):

- ``json_schema``: ``value`` is a JSON Schema (as JSON text); the output is one JSON value
  valid against it.
- ``json_object``: any JSON object (``value`` unused).
- ``regex``: the whole output matches the regular expression ``value`` (Rust regex syntax).
- ``choice``: ``value`` is a JSON list of strings; the output is exactly one of them.
- ``grammar``: ``value`` is a Lark grammar or a llama.cpp GBNF grammar.

``param`` is the request field the spec came from (``response_format``, ``guided_json``,
``tool_choice``...): errors name it. It is not part of the cache key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


class GrammarError(ValueError):
    """A structured-output spec the grammar engine cannot compile; ``param`` is the request
    field it came from, the message says what is wrong."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class StructuredOutput:
    """One structured-output constraint; validated at construction, then frozen."""

    kind: str
    value: str = ""
    param: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"structured output kind must be one of {KINDS}, got {self.kind!r}",
                               self.param)
        if not isinstance(self.value, str):
            raise GrammarError(f"structured output value must be a string, got {type(self.value).__name__}",
                               self.param)
        if self.kind == "choice":
            try:
                choices = json.loads(self.value)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"choice list is not JSON: {exc}", self.param) from None
            if (not isinstance(choices, list) or not choices
                    or not all(isinstance(c, str) for c in choices)):
                raise GrammarError("the choices must be a non-empty list of strings", self.param)
        if self.kind in ("regex", "grammar") and not self.value:
            raise GrammarError(f"the {self.kind} must not be empty", self.param)

    @classmethod
    def json_schema(cls, schema: dict | bool, param: str | None = None) -> "StructuredOutput":
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}", param)
        return cls("json_schema", json.dumps(schema), param)  # key order kept: it is the output order

    @classmethod
    def choice(cls, choices: list[str], param: str | None = None) -> "StructuredOutput":
        return cls("choice", json.dumps(list(choices)), param)
