"""Stored responses (``store: true``) for ``previous_response_id`` and GET / DELETE.

A bounded, in-memory, least-recently-stored store: at most ``max_responses`` entries and
``max_bytes`` of their JSON; storing past either bound evicts the oldest. Each entry holds
the response object, its input items (``GET /v1/responses/{id}/input_items``) and the
conversation as chat messages up to and including the response's own output, without the
request's ``instructions`` (OpenAI does not carry instructions over to the next turn).

Invariant: an id that was stored and then evicted or deleted is remembered (the last
``max_forgotten`` such ids), so that a lookup says which happened instead of a bare
"not found".
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

#: Defaults: a long agent session stores one response per turn, each with its whole history.
DEFAULT_MAX_RESPONSES = 1000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    messages: list[dict[str, Any]]  # chat messages: history + this input + this output
    num_bytes: int = 0


class ResponseNotFound(KeyError):
    """Lookup of an id the store does not hold; ``str()`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ResponseStore:
    """Bounded by count and bytes (see the module docstring)."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_forgotten: int = 10_000) -> None:
        if max_responses < 1 or max_bytes < 1:
            raise ValueError(f"a response store needs room: max_responses={max_responses}, "
                             f"max_bytes={max_bytes}; both must be at least 1")
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.max_forgotten = max_forgotten
        self.num_bytes = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._forgotten: OrderedDict[str, str] = OrderedDict()  # id -> "evicted" | "deleted"

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> bool:
        """Store ``entry`` under its response's id, evicting the oldest as needed; False
        (nothing stored) if the entry alone is larger than ``max_bytes``."""
        entry.num_bytes = len(json.dumps([entry.response, entry.input_items, entry.messages],
                                         ensure_ascii=False).encode("utf-8"))
        if entry.num_bytes > self.max_bytes:
            return False
        response_id = entry.response["id"]
        while self._entries and (len(self._entries) >= self.max_responses
                                 or self.num_bytes + entry.num_bytes > self.max_bytes):
            oldest_id, oldest = self._entries.popitem(last=False)
            self.num_bytes -= oldest.num_bytes
            self._forget(oldest_id, "evicted")
        self._entries[response_id] = entry
        self.num_bytes += entry.num_bytes
        return True

    def get(self, response_id: str) -> StoredResponse:
        entry = self._entries.get(response_id)
        if entry is not None:
            return entry
        why = self._forgotten.get(response_id)
        if why == "evicted":
            raise ResponseNotFound(
                f"response {response_id!r} was evicted from this server's response store (it "
                f"keeps the latest {self.max_responses} responses and at most "
                f"{self.max_bytes // 2**20} MiB); send the whole conversation as input instead")
        if why == "deleted":
            raise ResponseNotFound(f"response {response_id!r} was deleted")
        raise ResponseNotFound(f"response {response_id!r} not found: it was never stored "
                               "here (a response is stored unless the request says store: false)")

    def delete(self, response_id: str) -> None:
        entry = self.get(response_id)
        del self._entries[response_id]
        self.num_bytes -= entry.num_bytes
        self._forget(response_id, "deleted")

    def _forget(self, response_id: str, why: str) -> None:
        self._forgotten[response_id] = why
        while len(self._forgotten) > self.max_forgotten:
            self._forgotten.popitem(last=False)
