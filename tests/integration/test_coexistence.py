"""Never hand out a device twice (issue 30 point 1), against the real API server: a Node whose
capacity shows a device plugin's resource gets none of that group's devices in its
ResourceSlices, with a log line and one Warning event `DevicesWithheld` on the Node; the
devices come back once the plugin has gone (count 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import ControlPlane
from fabricdra.kubeletplugin.agent import Agent
from fabricdra.kubeletplugin.publisher import NodePublisher
from tests.integration.kubelethost import build_host
from tests.integration.test_kubelet_agent import agent_config, crds, node, slice_devices

pytestmark = pytest.mark.integration
__all__ = ["crds", "node"]  # fixtures, shared with the agent's own tests


def _capacity(api: Any, name: str, extra: dict[str, str]) -> None:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **extra}
    client.CoreV1Api(api).patch_node_status(
        name, {"status": {"capacity": resources, "allocatable": resources}}
    )


def _events(api: Any, name: str) -> list[Any]:
    selector = f"involvedObject.name={name},reason=DevicesWithheld"
    return list(
        client.CoreV1Api(api).list_namespaced_event("default", field_selector=selector).items
    )


class CountingPublisher:
    """The real publisher; records how many DevicesWithheld events the Node had each time a
    pass handed it the devices (the event is written only after the pass has published)."""

    def __init__(self, real: NodePublisher, api: Any, node: str) -> None:
        self.real, self.api, self.node = real, api, node
        self.events_at_sync: list[int] = []

    def sync(self, discovery: Any, devices: Any, verification: Any = None) -> Any:
        self.events_at_sync.append(len(_events(self.api, self.node)))
        return self.real.sync(discovery, devices, verification)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_device_plugins_gpus_are_not_offered_again(
    tmp_path: Path,
    control_plane: ControlPlane,
    crds: None,
    node: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    host = build_host(tmp_path / "host", vf_nics=())
    config = agent_config(tmp_path, host, node, discovery_interval=3600, verification_gate=False)
    with control_plane.api_client() as api:
        _capacity(api, node, {"nvidia.com/gpu": "8"})  # NVIDIA's device plugin serves here
        publisher = CountingPublisher(NodePublisher(api, node), api, node)
        agent = Agent(config, api, publisher=publisher)
        try:
            capfd.readouterr()
            agent.pass_once()
            assert publisher.events_at_sync == [0]  # the event came after the publish
            published = slice_devices(api, node)
            assert not [d for d in published if d.startswith("gpu-")], published
            assert [d for d in published if d.startswith("rdma-")]  # the NICs are ours
            logged = capfd.readouterr()
            assert "devices withheld: another advertiser hands them out" in logged.out + logged.err
            events = _events(api, node)
            assert len(events) == 1
            assert events[0].involved_object.kind == "Node"
            assert events[0].type == "Warning"
            assert "nvidia-gpu device(s) not offered" in events[0].message
            assert "nvidia.com/gpu=8" in events[0].message
            agent.pass_once()
            assert len(_events(api, node)) == 1  # once per change, not once per pass

            _capacity(api, node, {"nvidia.com/gpu": "0"})  # the plugin has gone
            agent.pass_once()
            assert [d for d in slice_devices(api, node) if d.startswith("gpu-")]
            assert agent.withheld == {}

            _capacity(api, node, {"rdma/rdma_shared_device_a": "1000"})
            agent.pass_once()
            published = slice_devices(api, node)
            assert not [d for d in published if d.startswith("rdma-")], published
            assert [d for d in published if d.startswith("gpu-")]
            assert len(_events(api, node)) == 2
        finally:
            agent.families.nvidia.xids.close()
