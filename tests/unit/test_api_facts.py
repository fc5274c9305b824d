"""The API facts a discovery pass uses, read off the pass (issue 29 point 4): over a real
HTTP API server on a local port (test_computedomain_driver's: it answers GETs from documents
and holds chosen paths until released)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from e2e.harness.poll import wait_for
from fabricdra.api import labels
from fabricdra.kube.rest import NODES, Rest
from fabricdra.kubeletplugin.apifacts import ApiFacts
from fabricdra.kubeletplugin.kubelet.claims import RestClaimReader
from fabricdra.kubeletplugin.verification.gate import REVERIFY_ANNOTATION
from tests.unit.test_computedomain_driver import NODE, FakeApi


@pytest.fixture
def api() -> Iterator[FakeApi]:
    a = FakeApi()
    yield a
    a.close()


def facts_for(api: FakeApi, wake: threading.Event) -> ApiFacts:
    config = client.Configuration()
    config.host = api.url
    rest = Rest(client.ApiClient(config))
    return ApiFacts(rest, NODE, "exclusive", RestClaimReader(rest), wake.set)


def node(api: FakeApi, mode: str | None = None, reverify: str | None = None) -> None:
    meta: dict[str, object] = {"name": NODE}
    if mode is not None:
        meta["labels"] = {labels.RDMA_MODE: mode}
    if reverify is not None:
        meta["annotations"] = {REVERIFY_ANNOTATION: reverify}
    api.docs[NODES.path(None, NODE)] = {"metadata": meta}


def test_a_relabel_read_on_the_thread_wakes_a_pass_and_an_unchanged_read_does_not(
    api: FakeApi,
) -> None:
    wake = threading.Event()
    facts = facts_for(api, wake)
    node(api)
    assert facts.refresh_node()  # the first read: the mode is known now
    assert facts.current([]).mode == "exclusive"
    facts.start()
    try:
        node(api, mode="shared")
        assert facts.request([])
        wait_for(wake.is_set, what="a pass woken by the new mode")
        assert facts.current([]).mode == "shared"
        wake.clear()
        done = facts.refreshes
        assert facts.request([])
        wait_for(lambda: facts.refreshes > done, what="the next refresh")
        assert not wake.is_set()  # nothing changed: no extra pass
    finally:
        facts.stop()
    assert not facts.request([])  # stopped: a lone pass reads for itself


def test_a_reverify_request_answered_during_a_read_is_not_revived(api: FakeApi) -> None:
    """The run answered the request (the annotation removed) while a read that began before
    the removal was in flight: that read must not bring the request back, or the next pass
    would verify again."""
    facts = facts_for(api, threading.Event())
    node(api, reverify="r1")
    api.hold.add(NODES.path(None, NODE))
    reader = threading.Thread(target=facts.refresh_node)
    reader.start()
    assert api.held.wait(10)
    facts.forget_reverify("r1")
    api.release.set()
    reader.join(30)
    assert facts.current([]).reverify is None
    api.hold.clear()
    node(api, reverify="r2")  # a new request is taken
    assert facts.refresh_node()
    assert facts.current([]).reverify == "r2"


def test_the_device_plugins_on_the_nodes_capacity_come_with_the_node_read(api: FakeApi) -> None:
    """Coexistence's input (issue 30 point 1) is read with the labels, in the one Node read:
    unknown until the Node has been read (never "no device plugin"), the last answer while it
    cannot be read, and a change is a change (it starts a pass)."""
    facts = facts_for(api, threading.Event())

    def unreadable(path: str) -> None:
        raise RuntimeError("the API server drops the connection")

    api.on_read = unreadable
    assert not facts.refresh_node()
    assert facts.current([]).plugins is None  # never read: unknown
    api.on_read = lambda path: None
    node(api)
    doc = api.docs[NODES.path(None, NODE)]
    doc["metadata"]["uid"] = "uid-1"
    doc["status"] = {"capacity": {"cpu": "64", "nvidia.com/gpu": "8"}}
    assert facts.refresh_node()
    now = facts.current([])
    assert [c.group for c in now.plugins or ()] == ["nvidia-gpu"]
    assert now.node is not None
    assert now.node["metadata"] == {"name": NODE, "uid": "uid-1"}
    api.on_read = unreadable
    assert not facts.refresh_node()
    assert facts.current([]).plugins == now.plugins  # unreadable: the last answer
    api.on_read = lambda path: None
    assert not facts.refresh_node()  # read again, nothing changed
    doc["status"] = {"capacity": {"cpu": "64", "nvidia.com/gpu": "0"}}  # the plugin has gone
    assert facts.refresh_node()
    assert facts.current([]).plugins == ()


def test_without_an_api_server_no_node_is_read_and_no_device_plugin_is_seen(
    api: FakeApi,
) -> None:
    config = client.Configuration()
    config.host = api.url
    rest = Rest(client.ApiClient(config))
    facts = ApiFacts(
        rest, NODE, "exclusive", RestClaimReader(rest), threading.Event().set, offline=True
    )
    node(api, mode="shared")
    assert not facts.refresh_node()
    assert api.reads.get(NODES.path(None, NODE)) is None
    assert facts.current([]).plugins == ()
    assert facts.current([]).mode == "exclusive"
