"""Llama 4's tool calls: a Python list of calls, ``[get_weather(city="Paris"), f(n=2)]``.

Llama 4 (and Llama 3.2's pythonic templates) answer a call as a list of function calls
with keyword arguments whose values are Python literals, optionally between
``<|python_start|>`` and ``<|python_end|>``; the JSON form ``{"name": ..., "parameters":
...}`` is read by the llama3_json parser. The text is parsed with ``ast`` (never
evaluated): anything that is not a list of ``name(key=literal, ...)`` calls is not a call
and stays content, as the other parsers leave a malformed call.
"""

from __future__ import annotations

import ast
import json

from inferpath.server.tools import ToolCall

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"


def parse_pythonic(text: str) -> tuple[str, list[ToolCall]] | None:
    """("", calls) when the whole answer is a pythonic call list, else None."""
    body = text.strip()
    if body.startswith(PYTHON_START):
        body = body[len(PYTHON_START):].removesuffix(PYTHON_END).strip()
    if not body.startswith("["):
        return None
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:  # **kwargs
                return None
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
                return None
        try:
            encoded = json.dumps(arguments, ensure_ascii=False)
        except (TypeError, ValueError):  # a set, bytes, a complex number: not JSON
            return None
        calls.append(ToolCall(ast.unparse(node.func), encoded))
    return "", calls


def starts_pythonic(text: str) -> bool:
    """Whether an answer so far may be a pythonic call list (streamed: held back)."""
    stripped = text.lstrip()
    return stripped.startswith("[") or stripped.startswith(PYTHON_START) \
        or (bool(stripped) and PYTHON_START.startswith(stripped))
