"""The controller's informer against a real kube-apiserver."""

from __future__ import annotations

import threading
import uuid

import pytest

from e2e.harness.controlplane import ControlPlane
from fabricdra.api.informer import Informer
from fabricdra.api.rest import LEASES, Rest

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
