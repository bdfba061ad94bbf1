"""Errors the engine raises at ``add_request`` time, before anything is scheduled."""

from __future__ import annotations


class RequestError(ValueError):
    """A request that can never run: its prompt is too long, empty, or cannot fit in the
    KV cache, or it asks for more tokens than the context leaves. The message names the
    value and the limit; ``param`` names the request field at fault (None: the prompt)."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


class QueueFullError(RuntimeError):
    """The waiting queue holds ``max_waiting_requests`` requests already; retry later."""
