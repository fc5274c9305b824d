"""A device's health reason in its taint, and one Event on the Node per health change, against
a real kube-apiserver (writes counted by the publisher's REST layer and read back)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceInventory
from fabricdra.kubeletplugin.discovery.node import Discovery
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.health import gpu_health
from fabricdra.kubeletplugin.healthevents import COMPONENT
from fabricdra.kubeletplugin.publisher import NodePublisher
from fabricdra.kubeletplugin.resourceslices import ApiFeatures
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.integration.test_publisher import Node
from tests.sysfs.nodes import h100_snapshot, write_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

GPU0 = "gpu-0000-18-00-0"
NIC2 = "rdma-0000-4c-00-0"  # the NIC beside GPU 2 (mlx5_2)


class HealthNode(Node):
    def gpu_faults(self, **fields_by_gpu: dict[str, Any]) -> None:
        """NVML now answers these fields for GPU i (keyword `g<i>`)."""
        snap = h100_snapshot(self.hgx.gpus)
        for key, fields in fields_by_gpu.items():
            snap[self.hgx.gpus[int(key[1:])]].update(fields)
        self.readings = load_snapshot(write_json(self.root / "nvml.json", snap))

    def link(self, up: bool) -> None:
        port = self.sys / "class" / "infiniband" / "mlx5_2" / "ports" / "1"
        (port / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (port / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")

    def inventory(self, d: Discovery) -> DeviceInventory:
        assert d.interfaces is not None
        assert d.accelerators is not None
        return build_devices(d.interfaces, d.accelerators, gpu_health=gpu_health(d.nvml, None))

    def all_events(self) -> list[Any]:
        with self.cp.api_client() as api:
            core = client.CoreV1Api(api)
            selector = f"involvedObject.name={self.name}"
            return list(core.list_namespaced_event("default", field_selector=selector).items)

    def events(self) -> list[Any]:
        """Our Events on this Node. Only ours: the control plane's node-lifecycle controller
        writes its own (`RegisteredNode`) on every new Node whenever its broadcaster gets to
        it, which made a count here fail once in CI (4 Events where we wrote 3)."""
        # in no useful order: timestamps are whole seconds
        return [e for e in self.all_events() if e.reporting_component == COMPONENT]

    def taint(self, device: str) -> str | None:
        for s in self.slices():
            for d in s.spec.devices or []:
                if d.name == device:
                    values = [t.value for t in d.taints or [] if t.key == "fabricdra.io/unhealthy"]
                    return values[0] if values else None
        raise AssertionError(f"{device} not published")


@pytest.fixture
def node(control_plane: ControlPlane, tmp_path: Path) -> Iterator[HealthNode]:
    n = HealthNode(control_plane, tmp_path)
    yield n
    n.api.close()


def _pass(node: HealthNode, previous: Discovery | None = None) -> tuple[Discovery, dict[str, int]]:
    d = node.discover(previous)
    result = node.publisher.sync(d, node.inventory(d))
    assert result.ok, result.errors
    return d, result.writes


def test_a_gpu_fault_is_one_event_per_change_and_its_taint_says_why(
    node: HealthNode, kube_controller_manager: Any
) -> None:
    d, writes = _pass(node)
    assert "Event" not in writes  # a healthy node's first start is quiet
    assert node.events() == []

    node.gpu_faults(g0={"eccUncorrectable": 2})
    d, writes = _pass(node, d)
    assert writes == {"ResourceSlice": 1, "Event": 1}
    assert node.taint(GPU0) == "gpu-ecc"
    (event,) = node.events()
    assert (event.type, event.reason) == ("Warning", "DeviceUnhealthy")
    assert (event.involved_object.kind, event.involved_object.name) == ("Node", node.name)
    assert event.involved_object.uid
    assert GPU0 in event.message
    assert "uncorrectable ECC errors: 2" in event.message
    assert "fabricdra.io/unhealthy=gpu-ecc" in event.message

    # Unchanged: no write, no Event, pass after pass.
    for _ in range(2):
        d, writes = _pass(node, d)
        assert writes == {}
    assert len(node.events()) == 1

    # A second cause on the same GPU is a change: its own Event, and the taint says both.
    node.gpu_faults(g0={"eccUncorrectable": 2, "xidErrors": [79]})
    d, writes = _pass(node, d)
    assert writes == {"ResourceSlice": 1, "Event": 1}
    assert node.taint(GPU0) == "gpu-ecc.xid-79"
    assert sum("Xid errors: 79" in e.message for e in node.events()) == 1

    # Healed: the taint goes and one Normal Event says so.
    node.gpu_faults()
    d, writes = _pass(node, d)
    assert writes == {"ResourceSlice": 1, "Event": 1}
    assert node.taint(GPU0) is None
    events = node.events()
    assert len(events) == 3
    (healed,) = [e for e in events if e.reason == "DeviceHealthy"]
    assert healed.type == "Normal"
    assert "was Unhealthy" in healed.message
    # The race that once failed this count, made certain: the node-lifecycle controller's own
    # Event on this Node is there too, and still only our three are ours.
    wait_for(
        lambda: any(e.reason == "RegisteredNode" for e in node.all_events()),
        timeout=120,
        what="the node-lifecycle controller's RegisteredNode Event",
    )
    assert len(node.events()) == 3


def test_a_restart_reports_only_what_changed_while_the_agent_was_down(node: HealthNode) -> None:
    node.gpu_faults(g0={"xidErrors": [79]})
    _, writes = _pass(node)
    assert writes.get("Event") == 1  # the first the cluster hears of it
    assert len(node.events()) == 1

    node.new_publisher()  # restart over an unchanged node: nothing new to say
    _, writes = _pass(node)
    assert writes == {}
    assert len(node.events()) == 1

    node.new_publisher()  # restart after the GPU healed and a link went down meanwhile
    node.gpu_faults()
    node.link(up=False)
    _, writes = _pass(node)
    assert writes.get("Event") == 2
    assert node.taint(NIC2) == "rdma-link-down"
    reasons = sorted((e.reason, e.message.split(" ")[1]) for e in node.events())
    assert reasons == [
        ("DeviceHealthy", GPU0),
        ("DeviceUnhealthy", GPU0),
        ("DeviceUnhealthy", NIC2),
    ]


def test_the_basic_model_reports_changes_from_its_health_attribute(
    node: HealthNode, control_plane: ControlPlane
) -> None:
    node.publisher = NodePublisher(node.api, node.name, features=ApiFeatures("basic"))
    node.gpu_faults(g0={"rowRemapFailure": True})
    _, writes = _pass(node)
    assert writes.get("Event") == 1
    # A restart reads "Unhealthy" back from the health attribute: no second Event.
    node.new_publisher()
    node.publisher = NodePublisher(node.api, node.name, features=ApiFeatures("basic"))
    _, writes = _pass(node)
    assert writes == {}
    assert len(node.events()) == 1
