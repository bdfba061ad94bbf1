"""The replica router, prompt-text extraction and metrics merge of inferpath.deploy, alone
(no Ray): prefix affinity, the load bound on it, round-robin, spares, replicas down."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferpath.deploy.metrics_merge import merge_metrics
from inferpath.deploy.prompt_text import routing_text
from inferpath.deploy.routing import Router, chunk_hashes

SYSTEM_A = "You are a careful assistant for gardeners. " * 8
SYSTEM_B = "You answer questions about railway timetables. " * 8


def test_chunk_hashes_are_chained_prefixes():
    a = chunk_hashes(SYSTEM_A + "question one", 64)
    b = chunk_hashes(SYSTEM_A + "another question", 64)
    assert len(a) == len(SYSTEM_A + "question one") // 64
    shared = len(SYSTEM_A) // 64
    assert a[:shared] == b[:shared]
    # a chunk equal in text but after a different prefix hashes differently
    assert chunk_hashes("x" * 64 + "y" * 64, 64)[1] != chunk_hashes("z" * 64 + "y" * 64, 64)[1]


def test_same_prefix_goes_to_the_same_replica():
    router = Router(["r0", "r1"], policy="prefix")
    first_a = router.choose(SYSTEM_A + "q1")
    first_b = router.choose(SYSTEM_B + "q1")
    assert first_a.reason == first_b.reason == "load" and first_a.replica != first_b.replica
    for i in range(6):
        again = router.choose(SYSTEM_A + f"q{i + 2}")
        assert (again.replica, again.reason) == (first_a.replica, "prefix")
        assert again.matched_chars == len(SYSTEM_A) // 64 * 64
        router.release(again.replica)


def test_a_hot_prefix_spills_to_the_less_loaded_replica():
    router = Router(["r0", "r1"], policy="prefix", balance_slack=2)
    home = router.choose(SYSTEM_A + "q0").replica
    reasons = [router.choose(SYSTEM_A + f"q{i}") for i in range(1, 6)]  # never released
    assert [d.reason for d in reasons[:2]] == ["prefix", "prefix"]
    spilled = [d for d in reasons if d.replica != home]
    assert spilled and spilled[0].reason == "load"  # then it holds the prefix too
    assert max(router.inflight.values()) - min(router.inflight.values()) <= 3


def test_round_robin_alternates_and_ignores_prefixes():
    router = Router(["r0", "r1", "r2"], policy="round_robin")
    chosen = [router.choose(SYSTEM_A).replica for _ in range(6)]
    assert chosen == ["r0", "r1", "r2", "r0", "r1", "r2"]


def test_a_continued_response_goes_to_its_owner_while_it_is_healthy():
    router = Router(["r0", "r1"], max_inflight=1)
    decision = router.choose_owner("r1", SYSTEM_A)
    assert (decision.replica, decision.reason) == ("r1", "owner")
    assert router.choose_owner("r1", SYSTEM_A) is None  # full: the caller routes as usual
    router.release("r1")
    router.mark_down("r1")
    assert router.choose_owner("r1", SYSTEM_A) is None  # down: its store is gone with it


def test_full_and_down_replicas_are_skipped():
    router = Router(["r0", "r1"], max_inflight=1)
    router.mark_down("r1")
    assert router.choose(SYSTEM_A).replica == "r0"
    assert router.choose(SYSTEM_A) is None  # r0 full, r1 down: the caller waits
    router.mark_up("r1")
    decision = router.choose(SYSTEM_A)
    assert decision.replica == "r1" and decision.matched_chars == 0  # its set was dropped


def test_spare_replicas_start_only_when_the_queue_is_deep():
    router = Router(["r0", "r1", "r2"], spill_after=1, spill_at=2, policy="prefix")
    assert router.cold == {"r1", "r2"}  # spares start scaled to zero
    assert router.choose("a").replica == "r0" and router.spare_to_wake() is None
    assert router.choose("a").replica == "r0"
    assert router.spare_to_wake() == "r1"  # r0 is 2 deep: start the first spare
    assert router.spare_to_wake() is None  # one at a time: r1 is starting
    assert router.choose("a").replica == "r0"  # nothing waits for the cold start
    router.mark_warm("r1")
    assert router.choose("a").replica == "r1"  # the queue is deep: the running spare takes it
    assert router.spare_to_wake() is None  # r1 is only 1 deep
    assert router.choose("a").replica == "r1"
    assert router.spare_to_wake() == "r2"  # r0 and r1 both deep
    assert router.choose("a").replica in ("r0", "r1")  # r2 still cold


def test_a_running_spare_idles_once_the_queue_is_shallow_and_is_forgotten_when_stopped():
    router = Router(["r0", "r1"], spill_after=1, spill_at=1, policy="prefix")
    router.mark_warm("r1")
    assert router.choose(SYSTEM_A).replica == "r0"
    assert router.choose(SYSTEM_B).replica == "r1"  # r0 is 1 deep
    router.release("r0")
    router.release("r1")
    # shallow again: an idle spare takes nothing, even for the prefix it holds, so it idles
    assert router.num_prefix_chunks("r1") > 0
    assert router.choose(SYSTEM_B).replica == "r0"
    router.release("r0")
    router.mark_cold("r1")  # Serve scaled it to zero
    assert router.num_prefix_chunks("r1") == 0
    router.choose(SYSTEM_A)
    assert router.candidates() == ["r0"]  # deep, but a cold spare is never chosen
    assert router.spare_to_wake() == "r1"
    with pytest.raises(ValueError, match="'r0' is not a spare replica"):
        router.mark_cold("r0")


def test_a_spare_covers_for_a_running_replica_that_is_down():
    router = Router(["r0", "r1"], spill_after=1, spill_at=8)
    router.mark_down("r0")
    assert router.choose(SYSTEM_A) is None  # the caller waits...
    assert router.spare_to_wake() == "r1"  # ...while the spare starts
    router.mark_warm("r1")
    assert router.choose(SYSTEM_A).replica == "r1"


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="round_robin"):
        Router(["r0"], policy="random")


def test_routing_text_reads_each_api_in_template_order():
    chat = json.dumps({"messages": [{"role": "system", "content": "S"},
                                    {"role": "user", "content": [{"type": "text", "text": "U"}]}]})
    assert routing_text("/v1/chat/completions", chat.encode()) == "system:S\x1euser:U"
    assert routing_text("/v1/completions", json.dumps({"prompt": ["P", "Q"]}).encode()) == "P"
    messages = json.dumps({"system": "S", "messages": [{"role": "user", "content": "U"}]})
    assert routing_text("/v1/messages", messages.encode()) == "S\x1euser:U"
    responses = json.dumps({"instructions": "I", "input": "U"})
    assert routing_text("/v1/responses", responses.encode()) == "I\x1eU"
    assert routing_text("/v1/chat/completions", b"{not json") == ""


def _page(value: float) -> str:
    """A replica's page as prometheus_client writes it (server/metrics.py)."""
    registry = CollectorRegistry()
    counter = Counter("inferpath:prefix_cache_hits", "Prompt tokens found.", ["model_name"],
                      registry=registry)
    counter.labels("m").inc(value)
    return generate_latest(registry).decode()


def test_merged_metrics_label_each_replica():
    merged = merge_metrics({"engine-0": _page(5), "engine-1": _page(7)})
    samples = {s.labels["replica"]: s.value for f in text_string_to_metric_families(merged)
               for s in f.samples if s.name.endswith("_total")}
    assert samples == {"engine-0": 5.0, "engine-1": 7.0}
    assert merged.count("# TYPE inferpath:prefix_cache_hits_total counter") == 1


def test_inferpath_and_its_cli_never_import_ray():
    import subprocess
    import sys

    code = ("import sys, inferpath, inferpath.cli, inferpath.cli.serve, inferpath.deploy.routing; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_response_owners_find_the_replica_of_a_response_and_of_its_continuation():
    from inferpath.deploy.owners import ResponseOwners

    owners = ResponseOwners(max_ids=2)
    owners.remember(b'{"id": "resp_1", "object": "response", "output": [{"id": "msg_9"}]}',
                    {"replica": "engine-1"})
    owners.remember(b'data: {"id":"chatcmpl-2","choices":[]}\n\n', {"replica": "engine-0"})
    assert owners.get("resp_1")["replica"] == "engine-1"  # the first id, not an item's
    assert owners.get("chatcmpl-2")["id"] == "chatcmpl-2"
    body = json.dumps({"input": "again", "previous_response_id": "resp_1"}).encode()
    assert owners.owner_of_previous("/v1/responses", body) == "engine-1"
    assert owners.owner_of_previous("/v1/chat/completions", body) is None
    assert owners.owner_of_previous("/v1/responses", b"{not json previous_response_id") is None
    owners.remember(b'{"id": "resp_3"}', {"replica": "engine-0"})
    assert owners.get("resp_1") is None and owners.get("resp_3")  # the oldest went first
