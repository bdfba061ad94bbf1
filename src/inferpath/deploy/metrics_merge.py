"""One Prometheus page for N replicas: each replica's samples with a ``replica`` label, and
the router's own counters. Imports no Ray.

Every replica exports the same families (server/metrics.py); the merged page keeps one
HELP/TYPE header per family and every replica's samples under it, so a query sums over
replicas (``sum by (model_name)``) or picks one (``{replica="engine-1"}``).
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

ROUTER_PREFIX = "inferpath:router_"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + "n").replace(chr(34), chr(92) + chr(34))}"'
               for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


def merge_metrics(texts: dict[str, str]) -> str:
    """Merge ``{replica name: Prometheus text}`` into one page, each sample labelled."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in texts.items():
        for family in text_string_to_metric_families(text):
            _, _, lines = families.setdefault(family.name, (family.documentation, family.type, []))
            for sample in family.samples:
                labels = {**sample.labels, "replica": replica}
                lines.append(f"{sample.name}{_labels(labels)} {floatToGoString(sample.value)}")
    out: list[str] = []
    for family_name, (doc, kind, lines) in families.items():
        exposed = family_name + ("_total" if kind == "counter" else "")
        out.append(f"# HELP {exposed} {doc}")
        out.append(f"# TYPE {exposed} {kind}")
        out.extend(lines)
    return "\n".join(out) + ("\n" if out else "")


def router_metrics(router: Any, up: dict[str, bool], retried: dict[str, int] | None = None) -> str:
    """The router's counters: requests routed by replica and reason, in flight, up, and
    the requests each replica failed before their first byte (retried on another)."""
    lines = [f"# HELP {ROUTER_PREFIX}requests_total Requests routed, by replica and reason "
             "(prefix: affinity to a cached prefix; load: the least loaded; round_robin).",
             f"# TYPE {ROUTER_PREFIX}requests_total counter"]
    for (replica, reason), count in router.num_routed.items():
        lines.append(f"{ROUTER_PREFIX}requests_total{_labels({'replica': replica, 'reason': reason})} {count}")
    lines += [f"# HELP {ROUTER_PREFIX}requests_inflight Requests the ingress has in flight at a replica.",
              f"# TYPE {ROUTER_PREFIX}requests_inflight gauge"]
    for replica, count in router.inflight.items():
        lines.append(f"{ROUTER_PREFIX}requests_inflight{_labels({'replica': replica})} {count}")
    lines += [f"# HELP {ROUTER_PREFIX}replica_up 1 when the replica answers and is routed to.",
              f"# TYPE {ROUTER_PREFIX}replica_up gauge"]
    for replica, is_up in up.items():
        lines.append(f"{ROUTER_PREFIX}replica_up{_labels({'replica': replica})} {int(is_up)}")
    lines += [f"# HELP {ROUTER_PREFIX}retries_total Requests a replica failed before their first "
              "byte, sent to another replica.", f"# TYPE {ROUTER_PREFIX}retries_total counter"]
    for replica, count in (retried or {}).items():
        lines.append(f"{ROUTER_PREFIX}retries_total{_labels({'replica': replica})} {count}")
    return "\n".join(lines) + "\n"
