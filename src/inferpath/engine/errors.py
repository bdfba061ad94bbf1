"""Errors the engine raises at ``add_request`` time, before anything is scheduled."""

from __future__ import annotations


class RequestError(ValueError):
    """A request that can never run: its prompt is too long, empty, or cannot fit in the
    KV cache. The message names the value and the limit."""


class QueueFullError(RuntimeError):
    """The waiting queue holds ``max_waiting_requests`` requests already; retry later."""
