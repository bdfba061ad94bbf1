"""Request fields beyond plain sampling: structured output, logit_bias, tools.

Every field here is implemented; a field the server does not know is refused with a 400
naming it (the request models forbid extra fields: see ``protocol.py``). The structured-
output fields of OpenAI (``response_format``) and vLLM (``guided_json``, ``guided_regex``,
``guided_choice``, ``guided_grammar``, or the newer ``structured_outputs`` object) all map
onto one ``inferpath.structured.StructuredOutput``; at most one of them may be set.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferpath.structured import GrammarError, StructuredOutput


#: Every request model's config: unknown fields refused (400 naming them), no coercion
#: between types.
STRICT = ConfigDict(extra="forbid", strict=True)


class ParamError(ValueError):
    """A request parameter is out of range; ``param`` is the name the client used."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None  # always strict here: the grammar enforces the schema


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` object: exactly one of its fields."""

    model_config = STRICT
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class StructuredFields(BaseModel):
    """Structured output and logit_bias, shared by completions and chat completions."""

    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    logit_bias: dict[str, float] | None = None

    def structured_output(self) -> StructuredOutput | None:
        """The one structured-output constraint the request sets, or None; ParamError when
        several are set or one is malformed."""
        specs = [spec for spec in self._structured_specs() if spec is not None]
        if len(specs) > 1:
            names = ", ".join(spec.param or "?" for spec in specs)
            raise ParamError(f"set at most one structured-output field, got {names}", specs[1].param)
        return specs[0] if specs else None

    def _structured_specs(self) -> list[StructuredOutput | None]:
        try:
            specs = [_from_response_format(self.response_format),
                     _json_spec(self.guided_json, "guided_json"),
                     _maybe("regex", self.guided_regex, "guided_regex"),
                     _choice_spec(self.guided_choice, "guided_choice"),
                     _maybe("grammar", self.guided_grammar, "guided_grammar")]
            so = self.structured_outputs
            if so is not None:
                set_fields = [name for name in ("json_", "regex", "choice", "grammar", "json_object")
                              if getattr(so, name) not in (None, False)]
                if len(set_fields) != 1:
                    raise ParamError("structured_outputs must set exactly one of json, regex, "
                                     f"choice, grammar, json_object; got {len(set_fields)}",
                                     "structured_outputs")
                param = "structured_outputs"
                specs += [_json_spec(so.json_, param), _maybe("regex", so.regex, param),
                          _choice_spec(so.choice, param), _maybe("grammar", so.grammar, param),
                          StructuredOutput("json_object", param=param) if so.json_object else None]
            return specs
        except GrammarError as exc:
            raise ParamError(str(exc), exc.param) from None


def _maybe(kind: str, value: str | None, param: str) -> StructuredOutput | None:
    return None if value is None else StructuredOutput(kind, value, param)


def _choice_spec(choices: list[str] | None, param: str) -> StructuredOutput | None:
    return None if choices is None else StructuredOutput.choice(choices, param)


def _json_spec(schema: dict[str, Any] | str | None, param: str) -> StructuredOutput | None:
    if schema is None:
        return None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ParamError(f"{param} is not valid JSON: {exc}", param) from None
    return StructuredOutput.json_schema(schema, param)


def _from_response_format(response_format: ResponseFormat | None) -> StructuredOutput | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return StructuredOutput("json_object", param="response_format")
    spec = response_format.json_schema
    if spec is None or spec.json_schema is None:
        raise ParamError("response_format of type json_schema needs json_schema.schema",
                         "response_format.json_schema")
    return StructuredOutput.json_schema(spec.json_schema, "response_format")


def logit_bias_pairs(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI sends token ids as JSON object keys (strings); ParamError on a non-id key."""
    if logit_bias is None:
        return None
    pairs = {}
    for key, value in logit_bias.items():
        try:
            pairs[int(key)] = value
        except ValueError:
            raise ParamError(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
    return pairs
