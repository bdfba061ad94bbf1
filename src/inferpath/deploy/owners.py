"""Which replica made each response the ingress relayed (no Ray, no torch).

A response's trace and a stored Response (``/v1/trace/{id}``, ``/v1/responses/{id}``, a
continuation's ``previous_response_id``) live in the replica that made it, so the ingress
notes the id of every response it relays: the first ``"id"`` of a body or of a stream's
first event is the response's, in every API. Bounded: the oldest of ``max_ids`` go first.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

_FIRST_ID = re.compile(rb'"id"\s*:\s*"([^"]+)"')


class ResponseOwners:
    """Routing records (``replica``, ``reason``, ...) by response id, least recent evicted."""

    def __init__(self, max_ids: int = 4096) -> None:
        self.max_ids = max_ids
        self._records: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, response_id: str) -> dict[str, Any] | None:
        return self._records.get(response_id)

    def remember(self, first_bytes: bytes, record: dict[str, Any]) -> None:
        """Note ``record`` (gaining an ``id``) for the response whose id opens ``first_bytes``."""
        found = _FIRST_ID.search(first_bytes[:4096])
        if found:
            record["id"] = found.group(1).decode("utf-8", "replace")
            self._records[record["id"]] = record
            while len(self._records) > self.max_ids:
                self._records.popitem(last=False)

    def owner_of_previous(self, path: str, body: bytes) -> str | None:
        """The replica holding the stored response a Responses request continues
        (``previous_response_id``), if this ingress relayed it; else None (routed by text:
        a replica that does not hold the id answers a clear 404)."""
        if path != "/v1/responses" or b"previous_response_id" not in body:
            return None
        try:
            previous = json.loads(body).get("previous_response_id")
        except (ValueError, UnicodeDecodeError, AttributeError):
            return None
        record = self._records.get(previous) if isinstance(previous, str) else None
        return record["replica"] if record else None
