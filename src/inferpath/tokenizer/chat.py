"""Chat templates: the model's Jinja template, rendered in a sandbox.

The environment matches what Hugging Face ``transformers`` gives templates, so the rendered
prompt is the same string: ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with loop controls, a ``tojson`` that does not HTML-escape,
``raise_exception``, ``strftime_now``, ``namespace``, and the variables ``messages``,
``add_generation_prompt``, ``tools``, ``documents``, ``bos_token``, ``eos_token``.

Bounded work (template_limits.py): every ``for`` counted against a budget, sizes
checked, ``include``/``import``/``extends`` refused; failures are ``ChatTemplateError``.

Keeping content from becoming control tokens: before rendering, every added-token string
inside message data is wrapped in two private-use marker characters that occur nowhere else.
After rendering, the markers are removed and the spans they enclosed are returned as
"protected": the tokenizer encodes added tokens there as plain text.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import regex

from inferpath.tokenizer.template_limits import (
    MAX_RENDERED_CHARS,
    BoundedEnvironment,
    ChatTemplateError,
    bounded_iterable,
    checked_filter,
    start_render,
)


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body unchanged (transformers uses
    it to find assistant tokens; a template that has it must still render here)."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(
            self.call_method("_render_body"), [], [], body
        ).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value, ensure_ascii=False, indent=None, separators=None, sort_keys=False
) -> str:
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the sandbox; ValueError with the line on a syntax error."""
    env = BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: checked_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["__bounded"] = bounded_iterable
    if not isinstance(source, str):
        raise ChatTemplateError(f"chat template is a {type(source).__name__}, not a string")
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template does not compile: {exc.message} (line {exc.lineno})"
        ) from None
    except RecursionError:
        raise ChatTemplateError("chat template is nested too deeply to compile") from None


_RESERVED_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


def check_template_kwargs(template_kwargs: dict[str, Any] | None, template_tokens: dict[str, str]) -> dict[str, Any]:
    """The extra template variables, or ValueError naming the one that is not a plain name
    or would replace a variable the renderer sets itself (messages, tools, bos_token...)."""
    if template_kwargs is None:
        return {}
    if not isinstance(template_kwargs, dict):
        raise ValueError(f"chat template kwargs must be a dict of names to values, got a "
                         f"{type(template_kwargs).__name__}")
    for name in template_kwargs:
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"chat template kwarg {name!r} is not a variable name a template can read")
        if name in _RESERVED_VARIABLES or name in template_tokens:
            raise ValueError(f"chat template kwarg {name!r} would replace the renderer's own "
                             f"{name!r}; pass it by its own argument")
    return dict(template_kwargs)


def _strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings_in(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings_in(v)]
    return []


def _mark(value: Any, added_re: regex.Pattern, start: str, end: str) -> Any:
    """A copy of ``value`` with each added-token string in it wrapped in the markers."""
    if isinstance(value, str):
        return added_re.sub(lambda m: start + m.group() + end, value)
    if isinstance(value, dict):
        return {k: _mark(v, added_re, start, end) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark(v, added_re, start, end) for v in value]
    return value


def _pick_markers(texts: list[str]) -> tuple[str, str]:
    """Two private-use characters that occur in none of ``texts``."""
    used = set("".join(texts))
    free = (chr(c) for c in range(0xE000, 0xF900) if chr(c) not in used)
    return next(free), next(free)


class ChatRenderer:
    """One compiled chat template plus the special-token strings it is given.

    Invariant: ``render_with_spans(...)[0] == render(...)`` for the same arguments.
    """

    def __init__(self, source: str, template_tokens: dict[str, str]):
        self.source = source
        self.template = compile_template(source)
        self.template_tokens = dict(template_tokens)

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, *, template_kwargs: dict[str, Any] | None = None) -> str:
        """The template's text for ``messages``; ``template_kwargs`` are more variables the
        template reads (transformers' ``apply_chat_template(**kwargs)``, vLLM's
        ``chat_template_kwargs``: Qwen3's ``enable_thinking``)."""
        extra = check_template_kwargs(template_kwargs, self.template_tokens)
        if not isinstance(messages, (list, tuple)) or not all(
            isinstance(m, dict) for m in messages
        ):
            raise ValueError(
                f"messages must be a list of dicts with 'role' and 'content', got {messages!r}"
            )
        start_render()
        chunks: list[str] = []
        num_chars = 0
        try:
            for chunk in self.template.generate(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                documents=None,
                **self.template_tokens,
                **extra,
            ):
                num_chars += len(chunk)
                if num_chars > MAX_RENDERED_CHARS:
                    raise ChatTemplateError(f"chat template rendered more than "
                                            f"{MAX_RENDERED_CHARS} characters")
                chunks.append(chunk)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed on these messages: {exc}") from None
        except RecursionError:
            raise ChatTemplateError("chat template recursed without end") from None
        except (OverflowError, MemoryError, TypeError, ValueError, ArithmeticError,
                LookupError, AttributeError) as exc:  # the template's own errors, sandboxed
            raise ChatTemplateError(f"chat template failed on these messages: "
                                    f"{type(exc).__name__}: {exc}") from None
        return "".join(chunks)

    def render_with_spans(
        self,
        messages: list[dict],
        add_generation_prompt: bool,
        added_re: regex.Pattern | None,
        tools: list[dict] | None = None,
        *,
        template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the sorted ``(start, end)`` spans of added-token strings that
        came from the messages or the ``template_kwargs`` (not from the template)."""
        strings = _strings_in(list(messages)) + _strings_in(tools or []) + _strings_in(template_kwargs or {})
        if added_re is None or not any(added_re.search(s) for s in strings):
            return self.render(messages, add_generation_prompt, tools, template_kwargs=template_kwargs), []
        start, end = _pick_markers(
            strings + [self.source] + list(self.template_tokens.values())
        )
        marked = self.render(
            _mark(list(messages), added_re, start, end), add_generation_prompt,
            _mark(tools, added_re, start, end) if tools else tools,
            template_kwargs=_mark(template_kwargs, added_re, start, end) if template_kwargs else template_kwargs,
        )
        text_parts: list[str] = []
        protected: list[tuple[int, int]] = []
        position = 0
        open_at = None
        for part in regex.split(f"([{start}{end}])", marked):
            if part == start:
                open_at = position
            elif part == end:
                if open_at is not None:
                    protected.append((open_at, position))
                open_at = None
            else:
                text_parts.append(part)
                position += len(part)
        text = "".join(text_parts)
        if text != self.render(messages, add_generation_prompt, tools, template_kwargs=template_kwargs):
            raise ValueError(
                "chat template output depends on the exact characters of the message content, so "
                "the special-token strings in it cannot be kept apart from the template's own"
            )
        return text, protected
