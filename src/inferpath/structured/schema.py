"""JSON Schema defaults for generation: objects are closed unless the schema opens them.

JSON Schema lets an object without ``additionalProperties`` hold any other key; a model
decoding under such a schema may then add keys until ``max_tokens``. OpenAI's strict mode
requires ``additionalProperties: false``, and vLLM's default grammar backend (xgrammar,
strict mode) assumes it. We do the same: every object schema with ``properties`` and no
``additionalProperties`` / ``patternProperties`` / ``unevaluatedProperties`` is closed.
A schema that wants extra keys says ``additionalProperties: true``.
"""

from __future__ import annotations

from typing import Any

_OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` with its object schemas closed (see the module docstring)."""
    if isinstance(schema, list):
        return [close_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: close_objects(value) for key, value in schema.items()}
    if "properties" in closed and not any(key in closed for key in _OPENERS):
        closed["additionalProperties"] = False
    return closed
