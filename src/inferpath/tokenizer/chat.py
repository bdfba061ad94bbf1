"""Chat templates: the model's Jinja template, rendered in a sandbox.

The environment matches what Hugging Face ``transformers`` gives templates, so the rendered
prompt is the same string: ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with loop controls, a ``tojson`` that does not HTML-escape,
``raise_exception``, ``strftime_now``, ``namespace``, and the variables ``messages``,
``add_generation_prompt``, ``tools``, ``documents``, ``bos_token``, ``eos_token``.

Bounded work: a template comes from a model file and may be hostile. Rendering is
limited to ``MAX_LOOP_ITERATIONS`` loop iterations in all (every ``for`` is wrapped in a
counter when the template is compiled), ``MAX_RENDERED_CHARS`` of output, strings and
lists of at most ``MAX_VALUE_LENGTH`` from ``*``, ``+`` and ``%``, and small powers;
macros that recurse without end and ``range`` beyond the sandbox's limit are caught. A
template that tries ``include``, ``import`` or ``extends`` (there are no other files)
is refused when compiled. Every such failure is a ``ChatTemplateError``.

Keeping content from becoming control tokens: before rendering, every added-token string
inside message data is wrapped in two private-use marker characters that occur nowhere else.
After rendering, the markers are removed and the spans they enclosed are returned as
"protected": the tokenizer encodes added tokens there as plain text.
"""

from __future__ import annotations

import functools
import json
import threading
from datetime import datetime
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import regex
from jinja2.sandbox import ImmutableSandboxedEnvironment


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


#: Loop iterations one render may run, over all its loops (a chat of 1,000 messages
#: iterated a few times stays far below).
MAX_LOOP_ITERATIONS = 200_000
#: Characters one render may produce (a 1 MB prompt renders to ~1 M characters).
MAX_RENDERED_CHARS = 16_000_000
#: The longest string or list ``*``, ``+`` or ``%`` may build in a template.
MAX_VALUE_LENGTH = 4_000_000
_MAX_EXPONENT = 1024


class ChatTemplateError(ValueError):
    """A chat template that cannot be compiled or rendered within bounds; the message
    says which rule and limit."""


_render_state = threading.local()  # loop iterations of the render on this thread


def _bounded(iterable):
    """Wraps the iterable of every ``for``: counts iterations against the render's budget."""
    for item in iterable:
        _render_state.num_iterations += 1
        if _render_state.num_iterations > MAX_LOOP_ITERATIONS:
            raise ChatTemplateError(f"the chat template ran more than {MAX_LOOP_ITERATIONS} "
                                    "loop iterations; it is refused as unbounded")
        yield item


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every loop counted and size-growing operators checked."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def _parse(self, source, name, filename):
        tree = super()._parse(source, name, filename)
        for node in tree.find_all((jinja2.nodes.Include, jinja2.nodes.Import,
                                   jinja2.nodes.FromImport, jinja2.nodes.Extends)):
            tag = type(node).__name__.lower().replace("fromimport", "from ... import")
            raise ChatTemplateError(f"chat template uses {{% {tag} %}} (line {node.lineno}); "
                                    "a chat template cannot load other templates")
        for loop in tree.find_all(jinja2.nodes.For):
            loop.iter = jinja2.nodes.Call(jinja2.nodes.Name("__bounded", "load"), [loop.iter],
                                          [], None, None)
        return tree

    def call_binop(self, context, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "**" and isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
            raise ChatTemplateError(f"chat template raises to the power {right}; allowed: "
                                    f"at most {_MAX_EXPONENT}")
        if operator_name == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) \
                        and len(seq) * times > MAX_VALUE_LENGTH:
                    raise ChatTemplateError(
                        f"chat template builds a value of {len(seq) * times} items with '*'; "
                        f"allowed: at most {MAX_VALUE_LENGTH}")
        if operator_name == "%" and isinstance(left, str):
            _check_format_widths(left)
        result = super().call_binop(context, operator_name, left, right)
        if isinstance(result, (str, list, tuple)) and len(result) > MAX_VALUE_LENGTH:
            raise ChatTemplateError(f"chat template built a value of {len(result)} items "
                                    f"with {operator_name!r}; allowed: at most {MAX_VALUE_LENGTH}")
        return result


    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
        _check_size_args(args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):
        """str.format / format_map, checked for huge widths before the sandbox runs it."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        _check_format_widths(value.__self__)
        return wrapped


def _check_size_args(args, kwargs) -> None:
    """Refuse a call or filter given a size beyond MAX_VALUE_LENGTH ("a".ljust(10**9))."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_VALUE_LENGTH:
            raise ChatTemplateError(f"chat template passes {value} to a function or filter; "
                                    f"allowed: sizes up to {MAX_VALUE_LENGTH}")


def _check_format_widths(fmt: str) -> None:
    """Refuse a format string whose widths could build a huge string ("%999999999s")."""
    import re

    for digits in re.findall(r"\d+", fmt):
        if len(digits) > 7 or int(digits) > MAX_VALUE_LENGTH:
            raise ChatTemplateError(f"chat template formats with a width of {digits}; allowed: "
                                    f"at most {MAX_VALUE_LENGTH}")


def _checked_filter(f):
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def checked(*args, **kwargs):
        _check_size_args(args[1:], kwargs)
        return f(*args, **kwargs)

    return checked


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
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _checked_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["__bounded"] = _bounded
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

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not isinstance(messages, (list, tuple)) or not all(
            isinstance(m, dict) for m in messages
        ):
            raise ValueError(
                f"messages must be a list of dicts with 'role' and 'content', got {messages!r}"
            )
        _render_state.num_iterations = 0
        chunks: list[str] = []
        num_chars = 0
        try:
            for chunk in self.template.generate(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                tools=None,
                documents=None,
                **self.template_tokens,
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
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the sorted ``(start, end)`` spans of added-token strings that
        came from the messages (not from the template)."""
        strings = _strings_in(list(messages))
        if added_re is None or not any(added_re.search(s) for s in strings):
            return self.render(messages, add_generation_prompt), []
        start, end = _pick_markers(
            strings + [self.source] + list(self.template_tokens.values())
        )
        marked = self.render(
            _mark(list(messages), added_re, start, end), add_generation_prompt
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
        if text != self.render(messages, add_generation_prompt):
            raise ValueError(
                "chat template output depends on the exact characters of the message content, so "
                "the special-token strings in it cannot be kept apart from the template's own"
            )
        return text, protected
