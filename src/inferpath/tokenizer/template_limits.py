"""Bounds on the work of a chat template, which comes from a model file and may be hostile.

Jinja's sandbox stops a template from reaching Python, not from running forever or
building a gigabyte string. ``BoundedEnvironment`` adds: every ``for`` loop is wrapped
(when the template is compiled) in a counter of iterations per render, at most
``MAX_LOOP_ITERATIONS``; ``*``, ``+`` and ``%`` may build strings and lists of at most
``MAX_VALUE_LENGTH``, powers are small, calls and filters take no size beyond
``MAX_VALUE_LENGTH`` ("a".ljust(10**9)), format widths are checked before formatting;
``include``, ``import`` and ``extends`` are refused (there are no other files). Jinja's
globals that make work from a number (``range``, ``lipsum``) charge it to the same budget
as loops (``bounded_globals``); ``cycler``, ``joiner``, ``namespace`` and ``dict`` make
one small object per call, and every call is already checked for huge sizes. The
renderer caps its output at ``MAX_RENDERED_CHARS`` and calls ``start_render`` first.
Every failure is a ``ChatTemplateError`` naming the rule and the limit.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

import jinja2
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

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


def start_render() -> None:
    """Reset this thread's loop budget (renders run on any thread of the input pool)."""
    _render_state.num_iterations = 0


def charge_iterations(num_iterations: int, what: str = "loop iterations") -> None:
    """Count ``num_iterations`` units of work against this render's budget."""
    _render_state.num_iterations = getattr(_render_state, "num_iterations", 0) + num_iterations
    if _render_state.num_iterations > MAX_LOOP_ITERATIONS:
        raise ChatTemplateError(f"the chat template ran more than {MAX_LOOP_ITERATIONS} "
                                f"loop iterations (counting {what}); it is refused as unbounded")


def bounded_iterable(iterable):
    """Wraps the iterable of every ``for``: counts iterations against the render's budget."""
    for item in iterable:
        charge_iterations(1)
        yield item


def _bounded_range(*args):
    """The sandbox's ``range``, its length charged to the budget when it is made (a
    ``range(n)|list`` or ``|join`` builds n items without a ``for``)."""
    if not all(isinstance(a, int) for a in args):
        raise ChatTemplateError(f"chat template calls range{args!r}; range takes integers")
    made = safe_range(*args)  # the sandbox's own: at most MAX_RANGE items
    charge_iterations(len(made), f"{len(made)} items of range{args!r}")
    return made


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """Jinja's ``lipsum``, its words (n paragraphs of up to ``max`` words) charged to the
    budget before any is made."""
    from jinja2.utils import generate_lorem_ipsum

    for name, value in (("n", n), ("min", min), ("max", max)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ChatTemplateError(f"chat template calls lipsum with {name}={value!r}; "
                                    "it takes counts (integers >= 0)")
    charge_iterations(n * (max if max > min else min), f"lipsum({n}) words")
    return generate_lorem_ipsum(n, html, min, max)


def bounded_globals() -> dict[str, Any]:
    """The template globals that make work from a number, bounded (see the module doc)."""
    return {"range": _bounded_range, "lipsum": _bounded_lipsum}


class BoundedEnvironment(ImmutableSandboxedEnvironment):
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

    def call(self, context, obj, /, *args, **kwargs):
        _check_size_args(args, kwargs)
        return super().call(context, obj, *args, **kwargs)

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
    for digits in re.findall(r"\d+", fmt):
        if len(digits) > 7 or int(digits) > MAX_VALUE_LENGTH:
            raise ChatTemplateError(f"chat template formats with a width of {digits}; allowed: "
                                    f"at most {MAX_VALUE_LENGTH}")


def checked_filter(f):
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def checked(*args, **kwargs):
        _check_size_args(args[1:], kwargs)
        return f(*args, **kwargs)

    return checked
