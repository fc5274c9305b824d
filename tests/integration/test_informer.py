"""The controller's informer against a real kube-apiserver."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane
from fabricdra.kube.informer import Informer
from fabricdra.kube.rest import LEASES, Rest

pytestmark = pytest.mark.integration


def test_stop_ends_the_open_watch_at_once(control_plane: ControlPlane) -> None:
    """A stopped informer (an IMEX daemon leaving, a controller losing its lease) must not keep
    its watch open until the watch's timeout, minutes later: that holds a connection and a
    watch in the API server for nothing. Its thread ends as soon as it is stopped."""
    rest = Rest(control_plane.api_client())
    ns = f"informer-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    informer = Informer(rest, LEASES, namespace=ns, resync=300)
    seen = threading.Event()
    informer.on_event(lambda event, old, new: event == "ADDED" and seen.set())
    informer.start()
    assert informer.wait_synced(30)
    # An object made after the list reaches the informer through its watch: the watch is open.
    rest.create(LEASES, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "x"}}, ns)
    assert seen.wait(30)
    informer.stop()
    assert informer._thread is not None
    informer._thread.join(timeout=20)  # far below the 300 s the watch would otherwise last
    assert not informer._thread.is_alive()


def test_the_first_list_is_read_in_pages(control_plane: ControlPlane) -> None:
    """The first LIST comes in pages (`limit`, `continue`), each trimmed by the transform
    before the next is read: at 5,000 nodes the whole list parsed at once was the controller's
    peak memory. Every object arrives, and the watch starts from the list's version (an object
    made afterwards is seen)."""
    rest = Rest(control_plane.api_client())
    ns = f"informer-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    for i in range(5):
        rest.create(LEASES, {"metadata": {"name": f"l{i}"}, "spec": {"holderIdentity": "x"}}, ns)
    informer = Informer(
        rest,
        LEASES,
        namespace=ns,
        page_size=2,
        transform=lambda o: {**o, "spec": {}},  # what a page keeps
    )
    seen = threading.Event()

    def late(event: str, old: object, new: dict[str, Any] | None) -> None:
        if event == "ADDED" and new is not None and new["metadata"]["name"] == "late":
            seen.set()

    informer.on_event(late)
    informer.start()
    try:
        assert informer.wait_synced(30)
        assert sorted(o["metadata"]["name"] for o in informer.items()) == [
            f"l{i}" for i in range(5)
        ]
        assert all(o["spec"] == {} for o in informer.items())
        pages = [
            e
            for e in control_plane.audit_events(verbs=["list"])
            if f"/namespaces/{ns}/leases" in e.get("requestURI", "")
        ]
        assert len(pages) == 3  # 2 + 2 + 1
        rest.create(LEASES, {"metadata": {"name": "late"}, "spec": {"holderIdentity": "x"}}, ns)
        assert seen.wait(30)
    finally:
        informer.stop()
