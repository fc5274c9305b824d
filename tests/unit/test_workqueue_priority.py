"""The controller's work queue: keys added on an event go before keys added by a resync
(a claim's admission must not wait behind a sweep over every node), without starving them."""

from __future__ import annotations

import time

from fabricdra.controller.workqueue import WorkQueue

RESYNC_KEYS = 5000


def _drain(q: WorkQueue) -> list[str]:
    out = []
    while (key := q.get(timeout=0)) is not None:
        out.append(key)
        q.done(key)
    return out


def test_an_event_key_added_after_a_resync_sweep_is_processed_first() -> None:
    q = WorkQueue()
    for i in range(RESYNC_KEYS):
        q.add(f"node-{i}", resync=True)
    q.add("claimed-node")
    assert q.depth() == (1, RESYNC_KEYS)
    order = _drain(q)
    assert order[0] == "claimed-node"
    # The sweep itself keeps its order and loses no key.
    assert order[1:] == [f"node-{i}" for i in range(RESYNC_KEYS)]


def test_an_event_promotes_a_key_the_resync_already_queued() -> None:
    q = WorkQueue()
    for i in range(100):
        q.add(f"node-{i}", resync=True)
    q.add("node-99")  # a claim on a node the sweep queued last
    order = _drain(q)
    assert order[0] == "node-99"
    assert len(order) == 100
    assert order.count("node-99") == 1


def test_a_resync_does_not_demote_a_key_an_event_queued() -> None:
    q = WorkQueue()
    q.add("a", resync=True)
    q.add("b")
    q.add("b", resync=True)
    assert q.depth() == (1, 1)
    assert _drain(q) == ["b", "a"]


def test_an_event_while_active_requeues_the_key_ahead_of_resync_keys() -> None:
    q = WorkQueue()
    q.add("busy")
    assert q.get(timeout=0) == "busy"
    for i in range(10):
        q.add(f"node-{i}", resync=True)
    q.add("busy", resync=True)
    q.add("busy")  # the event's mark wins over the resync's
    q.done("busy")
    assert q.get(timeout=0) == "busy"


def test_a_resync_while_active_requeues_the_key_at_resync_priority() -> None:
    q = WorkQueue()
    q.add("busy")
    assert q.get(timeout=0) == "busy"
    q.add("busy", resync=True)
    q.done("busy")
    q.add("event")
    assert _drain(q) == ["event", "busy"]


def test_overdue_resync_keys_alternate_with_events() -> None:
    # resync_max_wait 0: every waiting resync key is overdue at once. They are not starved by
    # events, and events do not wait behind the whole sweep either: one resync key, one event.
    q = WorkQueue(resync_max_wait=0.0)
    for i in range(3):
        q.add(f"r{i}", resync=True)
    for i in range(3):
        q.add(f"e{i}")
    assert _drain(q) == ["r0", "e0", "r1", "e1", "r2", "e2"]


def test_a_fresh_resync_key_waits_while_events_keep_coming() -> None:
    q = WorkQueue(resync_max_wait=3600.0)
    q.add("r0", resync=True)
    for i in range(3):
        q.add(f"e{i}")
    assert _drain(q) == ["e0", "e1", "e2", "r0"]


def test_delayed_keys_come_back_at_event_priority() -> None:
    q = WorkQueue()
    q.add_after("retry", 0.0)
    time.sleep(0.001)  # add_after's due time is strictly in the past now
    for i in range(10):
        q.add(f"node-{i}", resync=True)
    assert q.get(timeout=0) == "retry"
