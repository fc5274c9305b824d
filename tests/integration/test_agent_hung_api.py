"""The node agent with an API server that accepts and never answers (issue 29 point 4): a
pass tells kubelet about a GPU that fell off the bus, and hands its taint to the publisher,
before any API read of the pass could have given up.

Everything is real except the API server: the agent's own loop (`Agent.run`) on a
kernel-shaped 8-GPU sysfs tree with recorded NVML answers, its gRPC health stream read by a
kubelet-side client over the unix socket. The API server is `tests.hungapi.HungApi`: while
the agent starts it answers the Node read and nothing else (503, at once: the start is quick;
the Node must have been read once, or no device is offered: an unread Node's capacity might
show a device plugin, coexistence.py), then accepts and never answers. Nothing here is
timed: the API reads the agent makes have 10 s and 30 s timeouts, and the assertions are about
what had happened when health arrived — no API request had been given up on (the listener
sees each client close) — not about how long it took."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from e2e.harness.poll import wait_for
from fabricdra.kubeletplugin.agent import Agent
from fabricdra.kubeletplugin.publisher import NodePublisher
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2 as health_pb2
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from tests.hungapi import HungApi
from tests.integration.kubelethost import build_host
from tests.integration.test_kubelet_agent import agent_config
from tests.sysfs.builder import SysfsBuilder

pytestmark = pytest.mark.integration

NODE = "hung-api-node"


class WatchedPublisher:
    """The real publisher; records how many API requests had been given up on each time the
    agent handed it a pass (the taints go out from here)."""

    def __init__(self, real: NodePublisher, api: HungApi) -> None:
        self.real = real
        self.api = api
        self.entered: list[int] = []

    def sync(self, discovery: Any, devices: Any, verification: Any = None) -> Any:
        self.entered.append(self.api.abandoned())
        return self.real.sync(discovery, devices, verification)

    def __getattr__(self, name: str) -> Any:  # recorded_verification, reverify_request, ...
        return getattr(self.real, name)


class HealthWatch:
    """kubelet's side of the health stream: every message, with the number of API requests
    given up on when it arrived."""

    def __init__(self, socket: Path, api: HungApi) -> None:
        self.api = api
        self.seen: list[tuple[int, dict[str, int]]] = []
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stream = health_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for msg in self.stream:
                abandoned = self.api.abandoned()
                self.seen.append((abandoned, {d.device.device_name: d.health for d in msg.devices}))
        except grpc.RpcError:
            return

    def first(self, device: str, health: int) -> tuple[int, dict[str, int]] | None:
        return next((m for m in list(self.seen) if m[1].get(device) == health), None)

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


@pytest.fixture
def hung() -> Iterator[HungApi]:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "uid": "4f0c2a7e-0000-4000-8000-000000000001"},
        "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
    }
    api = HungApi(answers={f"/api/v1/nodes/{NODE}": node})
    yield api
    api.close()


def test_health_and_taints_never_wait_behind_a_hung_api_server(
    tmp_path: Path, hung: HungApi
) -> None:
    host = build_host(tmp_path / "host", vf_nics=())
    config = agent_config(tmp_path, host, NODE, discovery_interval=3600)
    snapshot = json.loads(host.nvml_snapshot.read_text())
    gone = sorted(snapshot)[0]
    device = "gpu-" + gone.replace(":", "-").replace(".", "-")
    conf = client.Configuration()
    conf.host = hung.url
    api = client.ApiClient(conf)
    publisher = WatchedPublisher(NodePublisher(api, NODE), hung)
    agent = Agent(config, api, publisher=publisher)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    watch: HealthWatch | None = None
    try:
        wait_for(agent.server.paths.registration_socket.exists, what="the registration socket")
        watch = HealthWatch(agent.server.paths.dra_socket, hung)
        wait_for(lambda: watch.first(device, health_pb2.HEALTHY), what="the first health report")
        syncs = len(publisher.entered)

        hung.hang()  # from now on every API request hangs until its client gives up
        SysfsBuilder(config.sysfs_root).remove_pci(gone)  # the GPU fell off the bus
        del snapshot[gone]
        host.nvml_snapshot.write_text(json.dumps(snapshot))
        agent.wake.set()

        abandoned, _ = wait_for(
            lambda: watch.first(device, health_pb2.UNHEALTHY),
            timeout=180,
            what="the lost GPU reported Unhealthy to kubelet",
        )
        # No API read had been given up on: health went out without waiting for any of them.
        assert abandoned == 0, hung.requests
        # The pass handed the taint to the publisher before any API read had given up either.
        wait_for(lambda: len(publisher.entered) > syncs, timeout=180, what="the publish")
        assert publisher.entered[syncs] == 0, hung.requests
        # The API reads do happen (off the pass's path), and they are still blocked.
        wait_for(
            lambda: f"/api/v1/nodes/{NODE}" in hung.paths(),
            timeout=180,
            what="the node's labels read",
        )
    finally:
        hung.close()  # every held request ends at once: the agent stops promptly
        if watch is not None:
            watch.close()
        agent.stop_event_wakes(stop)
        thread.join(timeout=120)
    assert not thread.is_alive()
