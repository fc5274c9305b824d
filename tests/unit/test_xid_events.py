"""Xid critical errors arrive as NVML events: the node agent holds one event set, drains it
each pass, and the critical Xids it saw make the GPU Unhealthy (tainted) — across a plugin
restart, not across a reboot. Off hardware the events are replayed from the recorded NVML
snapshot (`ReplayedXidEvents`), through the same consumer (`XidWatch`) the live set feeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from fabricdra.kubeletplugin.agent import Agent, AgentConfig
from fabricdra.kubeletplugin.devices import DeviceInventory
from fabricdra.kubeletplugin.discovery.node import Discovery
from fabricdra.kubeletplugin.discovery.nvml import (
    NvmlReadings,
    ReplayedXidEvents,
    XidEvent,
    XidEventsError,
    load_snapshot,
    record_xid_events,
)
from fabricdra.kubeletplugin.kinds.nvidia.xids import XidWatch
from fabricdra.kubeletplugin.resourceslices import TAINT_KEY, build_slices
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100

GPU0 = "gpu-0000-18-00-0"


class Captured:
    """The agent's publisher seam: keeps what each pass would publish."""

    def __init__(self) -> None:
        self.inventories: list[DeviceInventory] = []

    def sync(self, discovery: Discovery, devices: DeviceInventory, verification: Any = None) -> Any:
        self.inventories.append(devices)
        return None


class Node:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        hgx = hgx_h100(SysfsBuilder(tmp / "sys"), vf_nics=(), vfs_per_nic=0)
        self.gpus = hgx.gpus
        self.snapshot_path = tmp / "nvml.json"
        self.doc = h100_snapshot(hgx.gpus)
        for entry in self.doc.values():
            entry["xidEventsSupported"] = True
            entry["xidEvents"] = []
        self.write()

    def write(self) -> None:
        self.snapshot_path.write_text(json.dumps(self.doc))

    def xid(self, gpu: int, xid: int) -> None:
        """An Xid event arrives on GPU `gpu` (appended to the recording)."""
        self.doc[self.gpus[gpu]]["xidEvents"].append({"xid": xid})
        self.write()

    def restarted(self) -> None:
        """A new process: NVML delivers only events that arrive from now on."""
        for entry in self.doc.values():
            entry["xidEvents"] = []
        self.write()

    def agent(self, boot: str = "boot-1") -> tuple[Agent, Captured]:
        captured = Captured()
        (self.tmp / "boot_id").write_text(boot + "\n")
        config = AgentConfig(
            node_name="n1",
            sysfs_root=self.tmp / "sys",
            nvml_snapshot=self.snapshot_path,
            cdi_dir=self.tmp / "cdi",
            toolkit_cdi_dirs=(),
            plugin_dir=self.tmp / "plugin",
            registry_dir=self.tmp / "registry",
            state_dir=self.tmp / "state",
            verification_gate=False,
            boot_id_file=self.tmp / "boot_id",
        )
        return Agent(config, None, publisher=captured), captured


def taints(inventory: DeviceInventory, name: str) -> list[dict[str, Any]]:
    for s in build_slices(inventory, "n1").slices:
        for d in s["spec"]["devices"]:
            if d["name"] == name:
                return list(d.get("taints", []))
    raise AssertionError(f"{name} not published")


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_a_replayed_critical_xid_taints_the_gpu(node: Node) -> None:
    agent, _ = node.agent()
    before = agent.pass_once()
    assert before.get(GPU0).health == "Healthy"  # type: ignore[union-attr]
    node.xid(0, 79)  # fallen off the bus
    after = agent.pass_once()
    gpu = after.get(GPU0)
    assert gpu is not None
    assert gpu.health == "Unhealthy"
    assert gpu.health_reason == "critical Xid errors: 79"
    assert [t["key"] for t in taints(after, GPU0)] == [TAINT_KEY]
    # the other GPUs are untouched, and the event is not counted twice
    assert after.get("gpu-0000-3a-00-0").health == "Healthy"  # type: ignore[union-attr]
    assert agent.pass_once().get(GPU0).health == "Unhealthy"  # type: ignore[union-attr]


def test_an_application_xid_informs_and_blocks_nothing(node: Node) -> None:
    """Issue 32 point 3: an application's Xid is not the GPU's fault (Healthy, no blocking
    taint) but is published as an informative taint (effect None), for the rest of the boot."""
    agent, _ = node.agent()
    agent.pass_once()
    for xid in (13, 31, 43, 45, 68, 109):
        node.xid(0, xid)
    inventory = agent.pass_once()
    assert inventory.get(GPU0).health == "Healthy"  # type: ignore[union-attr]
    informs = {
        "key": "fabricdra.io/xid",
        "value": "gpu-xid-13.xid-31.xid-43.xid-45.xid-68.xid-109",
        "effect": "None",
    }
    assert taints(inventory, GPU0) == [informs]
    agent.families.nvidia.xids.close()
    node.restarted()
    restarted, _ = node.agent()
    assert taints(restarted.pass_once(), GPU0) == [informs]


def test_a_gpu_that_cannot_register_for_xid_events_is_unknown_not_healthy(node: Node) -> None:
    entry = node.doc[node.gpus[0]]
    entry["xidEventsSupported"] = False
    entry["xidEventsReason"] = "Xid event registration not supported (GPU or driver too old)"
    node.write()
    agent, _ = node.agent()
    gpu = agent.pass_once().get(GPU0)
    assert gpu is not None
    assert gpu.health == "Unknown"
    assert gpu.health_reason == "Xid event registration not supported (GPU or driver too old)"


def test_critical_xids_survive_a_plugin_restart_but_not_a_reboot(node: Node) -> None:
    agent, _ = node.agent("boot-1")
    agent.pass_once()
    node.xid(3, 48)  # double-bit ECC
    assert agent.pass_once().get("gpu-0000-5c-00-0").health == "Unhealthy"  # type: ignore[union-attr]
    agent.families.nvidia.xids.close()
    node.restarted()  # NVML will not deliver that event again

    restarted, _ = node.agent("boot-1")
    gpu = restarted.pass_once().get("gpu-0000-5c-00-0")
    assert gpu is not None
    assert (gpu.health, gpu.health_reason) == ("Unhealthy", "critical Xid errors: 48")

    rebooted, _ = node.agent("boot-2")  # a reboot resets the GPUs
    assert rebooted.pass_once().get("gpu-0000-5c-00-0").health == "Healthy"  # type: ignore[union-attr]


def test_an_event_set_that_fails_makes_health_unknown_for_that_pass(node: Node) -> None:
    agent, _ = node.agent()
    assert agent.pass_once().get(GPU0).health == "Healthy"  # type: ignore[union-attr]

    class Broken(ReplayedXidEvents):
        """What NVML answers when the set cannot be waited on (the driver went away)."""

        def drain(self) -> list[XidEvent]:
            raise XidEventsError("nvmlEventSetWait: Unknown Error")

    agent.families.nvidia.xids.source = Broken(node.snapshot_path)
    gpu = agent.pass_once().get(GPU0)
    assert gpu is not None
    assert gpu.health == "Unknown"
    assert gpu.health_reason == "Xid events unreadable: nvmlEventSetWait: Unknown Error"


def test_an_event_without_a_gpu_counts_for_every_registered_gpu(tmp_path: Path) -> None:
    readings = load_snapshot(_write(tmp_path, {"0000:1b:00.0": True, "0000:2b:00.0": False}))

    class Unattributed(ReplayedXidEvents):
        def drain(self) -> list[XidEvent]:
            return [XidEvent(None, 79)]

    watch = XidWatch(Unattributed(tmp_path / "nvml.json"))
    out = watch.apply(readings)
    assert out is not None
    assert out.gpus["0000:1b:00.0"].xidErrors == [79]
    # the GPU that could not register says so (its Xids are not known)
    assert out.gpus["0000:2b:00.0"].xidEventsSupported is False
    assert out.gpus["0000:2b:00.0"].xidErrors == []


def test_nvml_snapshot_records_what_the_replay_plays_back(tmp_path: Path) -> None:
    """`fabricdra nvml-snapshot` records support and events through a source; the replay of
    the written file gives the same answers."""
    path = _write(tmp_path, {"0000:1b:00.0": True, "0000:2b:00.0": False})
    doc = json.loads(path.read_text())
    doc["0000:1b:00.0"]["xidEvents"] = [{"xid": 79}, {"xid": 31, "gpuInstanceId": 1}]
    path.write_text(json.dumps(doc))
    recorded = record_xid_events(
        NvmlReadings("library", True, gpus=load_snapshot(path).gpus), 0.0, ReplayedXidEvents(path)
    )
    gpu = recorded.gpus["0000:1b:00.0"]
    assert gpu.xidEventsSupported is True
    assert [(e.xid, e.gpuInstanceId) for e in gpu.xidEvents or []] == [(79, None), (31, 1)]
    assert recorded.gpus["0000:2b:00.0"].xidEventsSupported is False


def _write(tmp: Path, support: dict[str, bool]) -> Path:
    doc = {}
    for i, (bus, ok) in enumerate(support.items()):
        doc[bus] = {
            "uuid": f"GPU-{i}",
            "name": "NVIDIA H100 80GB HBM3",
            "memoryTotalMiB": 81559,
            "migMode": False,
            "xidEventsSupported": ok,
        }
    path = tmp / "nvml.json"
    path.write_text(json.dumps(doc))
    return path


def test_an_event_set_that_stays_unreadable_is_warned_of_once_not_every_pass(
    tmp_path: Path,
) -> None:
    # A driver without event support (or a set that keeps failing) fails every 2 s pass: one
    # warning when it starts (and when the cause changes), one line when it reads again, not a
    # warning per pass drowning the agent's log. Health stays Unknown on every such pass.
    readings = load_snapshot(_write(tmp_path, {"0000:1b:00.0": True}))
    failures = ["nvmlEventSetCreate: Function Not Found"] * 3 + ["nvmlEventSetWait: Unknown"]

    class Flaky(ReplayedXidEvents):
        def drain(self) -> list[XidEvent]:
            if failures:
                raise XidEventsError(failures.pop(0))
            return []

    watch = XidWatch(Flaky(tmp_path / "nvml.json"))
    with structlog.testing.capture_logs() as logs:
        states = []
        for _ in range(6):
            out = watch.apply(readings)
            assert out is not None
            states.append(out.gpus["0000:1b:00.0"].xidEventsSupported)
    assert states == [False, False, False, False, True, True]
    said = [(e["log_level"], e["event"], e.get("error")) for e in logs if "Xid" in e["event"]]
    assert said == [
        ("warning", "Xid events unreadable", "nvmlEventSetCreate: Function Not Found"),
        ("warning", "Xid events unreadable", "nvmlEventSetWait: Unknown"),
        ("info", "Xid events readable again", None),
    ]
