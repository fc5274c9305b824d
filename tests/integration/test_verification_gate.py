"""The verification gate against the real control plane: the node agent runs the probes over a
kernel-shaped sysfs tree and recorded NVML answers, and publishes the gate. Each transition of
docs/verification.md: new node -> unverified; pass -> offered; failed probe -> tainted;
repair -> unverified again; manual override (recorded as such) — and the real kube-scheduler
refuses a gated node's devices until the gate opens."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import generate_latest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.kube.rest import NODES, Rest
from fabricdra.kubeletplugin import metrics as agent_metrics
from fabricdra.kubeletplugin.agent import Agent, AgentConfig
from fabricdra.kubeletplugin.kubelet.checkpoint import ClaimEntry
from fabricdra.kubeletplugin.publisher import NodePublisher
from fabricdra.kubeletplugin.resourceslices import ApiFeatures
from fabricdra.kubeletplugin.verification import GateInput, Tools, VerificationRun
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.integration.kubelethost import Host, build_host

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

UNVERIFIED = "fabricdra.io/unverified"
LABEL = "fabricdra.io/verified"


@dataclass
class GatedNode:
    name: str
    host: Host
    agent: Agent
    api: Any
    cp: ControlPlane

    def snapshot(self) -> dict[str, Any]:
        return dict(json.loads(self.host.nvml_snapshot.read_text()))

    def write_snapshot(self, doc: dict[str, Any]) -> None:
        self.host.nvml_snapshot.write_text(json.dumps(doc))

    def sysfs(self, rel: str, value: str) -> None:
        path = self.host.root / "sys" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")

    def devices(self) -> dict[str, Any]:
        slices = (
            client.ResourceV1Api(self.api)
            .list_resource_slice(field_selector=f"spec.nodeName={self.name}")
            .items
        )
        return {d.name: d for s in slices for d in s.spec.devices or []}

    def gate_taints(self) -> dict[str, str | None]:
        """device -> the value of its unverified taint (None: no such taint)."""
        return {
            name: next((t.value for t in d.taints or [] if t.key == UNVERIFIED), None)
            for name, d in self.devices().items()
        }

    def label(self) -> str | None:
        labels = client.CoreV1Api(self.api).read_node(self.name).metadata.labels or {}
        return labels.get(LABEL)

    def verification(self) -> dict[str, Any]:
        nd = client.CustomObjectsApi(self.api).get_cluster_custom_object(
            "fabricdra.io", "v1alpha1", "nodedevices", self.name
        )
        return dict(nd.get("status", {}).get("verification", {}))


@pytest.fixture
def gated(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., GatedNode]]:
    apis: list[Any] = []

    def make(
        *,
        nvlinks: bool = True,
        tools: Tools | None = None,
        broken_nic: bool = True,
        gate: bool = True,
    ) -> GatedNode:
        name = f"gate-{uuid.uuid4().hex[:8]}"
        control_plane.create_node(name, labels={"kubernetes.io/hostname": name})
        base = tmp_path / name
        # NIC 2's link is down (a Skipped device) unless asked otherwise.
        host = build_host(base / "host", vf_nics=(), broken_nics=(2,) if broken_nic else ())
        if not nvlinks:  # NVML that does not report NVLink state: the probe cannot run
            doc = json.loads(host.nvml_snapshot.read_text())
            for gpu in doc.values():
                gpu.pop("nvlinks")
            host.nvml_snapshot.write_text(json.dumps(doc))
        config = AgentConfig(
            node_name=name,
            sysfs_root=host.root / "sys",
            nvml_snapshot=host.nvml_snapshot,
            cdi_dir=base / "cdi",
            toolkit_cdi_dirs=(),
            plugin_dir=base / "plugin",
            registry_dir=base / "registry",
            state_dir=base / "state",
            dev_root=host.layout.dev_root,
            proc_root=host.layout.proc_root,
            # The active probes off unless a test runs the stand-in tools.
            verify_tools=tools or Tools(run_bandwidth=False),
            verification_gate=gate,
        )
        api = control_plane.api_client()
        apis.append(api)
        return GatedNode(name, host, Agent(config, api), api, control_plane)

    yield make
    for api in apis:
        api.close()


def test_a_new_node_is_unverified_until_a_run_passes(gated: Callable[..., GatedNode]) -> None:
    node = gated(nvlinks=False)
    node.agent.pass_once()
    # new node -> unverified: every device tainted, no label, the reason recorded
    taints = node.gate_taints()
    assert taints
    assert set(taints.values()) == {"unverified"}
    assert node.label() is None
    v = node.verification()
    assert v["state"] == "Unverified"
    assert v["passed"] is False
    assert v["reason"].startswith("required probes did not run: nvlink on 0000:18:00.0")
    assert {p["outcome"] for p in v["probes"] if p["probe"] == "nvlink"} == {"NotRun"}

    # NVML now answers (e.g. the driver came up); a rerun passes -> offered
    doc = node.snapshot()
    for gpu in doc.values():
        gpu["nvlinks"] = [{"link": k, "active": True} for k in range(18)]
    node.write_snapshot(doc)
    node.agent.request_verification()
    node.agent.pass_once()
    assert set(node.gate_taints().values()) == {None}
    assert node.label() == "true"
    v = node.verification()
    assert v["state"] == "Verified"
    assert v["passed"] is True
    nvlink = [p for p in v["probes"] if p["probe"] == "nvlink"]
    assert len(nvlink) == 8
    assert {(p["outcome"], p["measured"], p["expected"]) for p in nvlink} == {
        ("Passed", "18 of 18 links active", "at least 18 active links")
    }
    # An unchanged node: the next pass writes nothing (no rerun before the schedule).
    rv = client.CustomObjectsApi(node.api).get_cluster_custom_object(
        "fabricdra.io", "v1alpha1", "nodedevices", node.name
    )["metadata"]["resourceVersion"]
    node.agent.pass_once()
    again = client.CustomObjectsApi(node.api).get_cluster_custom_object(
        "fabricdra.io", "v1alpha1", "nodedevices", node.name
    )
    assert again["metadata"]["resourceVersion"] == rv


def test_a_restarted_agent_reruns_without_retainting(gated: Callable[..., GatedNode]) -> None:
    # No failed link: a restarted agent re-stamps a failure's first-seen time (health, not
    # verification), which would rewrite the slices for a reason of its own.
    node = gated(broken_nic=False)
    node.agent.pass_once()
    before = node.verification()
    assert before["state"] == "Verified"
    versions = {
        s.metadata.name: s.metadata.resource_version
        for s in client.ResourceV1Api(node.api)
        .list_resource_slice(field_selector=f"spec.nodeName={node.name}")
        .items
    }
    restarted = Agent(node.agent.config, node.api)
    restarted.pass_once()
    # A restart reruns (the old verdict is not kept as is), but the recorded one holds the
    # gate meanwhile: no re-taint, the slices are untouched.
    assert restarted.verification.runs == 1
    assert restarted.verification.last_run is not None
    assert restarted.verification.last_run.passed
    assert restarted.verification.last_run.fingerprint == before["fingerprint"]
    assert node.verification()["state"] == "Verified"
    assert {
        s.metadata.name: s.metadata.resource_version
        for s in client.ResourceV1Api(node.api)
        .list_resource_slice(field_selector=f"spec.nodeName={node.name}")
        .items
    } == versions


def test_a_failed_node_is_retried_not_held_and_reverify_reruns_at_once(
    gated: Callable[..., GatedNode],
) -> None:
    node = gated()
    nic = node.host.hgx.nics[0]
    node.sysfs(f"bus/pci/devices/{nic}/current_link_speed", "8.0 GT/s PCIe")
    node.agent.pass_once()
    assert node.verification()["state"] == "Failed"
    # Retried after a backoff, not after the day-long schedule.
    assert node.agent.verification.retry_after() == 60
    node.agent.pass_once()  # within the backoff: no rerun
    assert node.agent.verification.runs == 1

    # The repair (the NIC reseated), then the operator asks for a run.
    node.sysfs(f"bus/pci/devices/{nic}/current_link_speed", "32.0 GT/s PCIe")
    kubeconfig = str(node.cp.kubeconfig)
    done = _fabricdra("verify", "--node", node.name, "--kubeconfig", kubeconfig)
    assert done.returncode == 0, done.stderr
    annotations = Rest(node.api).get(NODES, node.name)["metadata"]["annotations"]
    assert json.loads(annotations["fabricdra.io/reverify"])["by"]
    node.agent.pass_once()
    assert node.agent.verification.runs == 2
    assert node.verification()["state"] == "Verified"
    assert set(node.gate_taints().values()) == {None}
    annotations = Rest(node.api).get(NODES, node.name)["metadata"].get("annotations") or {}
    assert "fabricdra.io/reverify" not in annotations  # answered: removed by the agent
    node.agent.pass_once()
    assert node.agent.verification.runs == 2  # and not asked again


def test_with_the_gate_off_discovery_is_trusted(gated: Callable[..., GatedNode]) -> None:
    node = gated(nvlinks=False, gate=False)  # would be Unverified with the gate on
    node.agent.pass_once()
    assert set(node.gate_taints().values()) == {None}
    assert node.label() is None
    assert node.verification() == {}


def test_the_agent_serves_the_gate_state_as_metrics(gated: Callable[..., GatedNode]) -> None:
    node = gated(nvlinks=False)
    node.agent.pass_once()
    text = generate_latest(agent_metrics.REGISTRY).decode()
    assert 'fabricdra_verification_state{state="Unverified"} 1.0' in text
    assert 'fabricdra_verification_state{state="Verified"} 0.0' in text
    assert 'fabricdra_verification_probe_results{outcome="NotRun",probe="nvlink"} 8.0' in text
    assert 'fabricdra_verification_probe_results{outcome="Passed",probe="pcie-link"} 15.0' in text
    # No DMI model with a profile on this host: said so, not failed.
    assert 'fabricdra_verification_probe_results{outcome="NotRun",probe="inventory"} 1.0' in text


def test_a_failed_probe_taints_every_device(gated: Callable[..., GatedNode]) -> None:
    node = gated()
    node.agent.pass_once()
    assert node.verification()["state"] == "Verified"
    assert node.label() == "true"

    gpu = node.host.hgx.gpus[5]
    node.sysfs(f"bus/pci/devices/{gpu}/current_link_width", "8")
    node.agent.request_verification()
    node.agent.pass_once()
    assert set(node.gate_taints().values()) == {"failed"}
    assert node.label() is None
    v = node.verification()
    assert v["state"] == "Failed"
    [failed] = [p for p in v["probes"] if p["outcome"] == "Failed"]
    assert failed["probe"] == "pcie-link"
    assert failed["device"] == gpu
    assert failed["measured"] == "x8 32.0 GT/s PCIe (max x16 32.0 GT/s PCIe)"
    assert v["reason"] == f"failed: pcie-link on {gpu}"


STANDINS = Path(__file__).resolve().parents[1] / "standins"


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in tools' folder (their call log, events, the loopback's unix sockets)."""
    d = tmp_path / "standin"
    d.mkdir()
    monkeypatch.setenv("STANDIN_DIR", str(d))
    for var in ("STANDIN_HANG", "STANDIN_AWAIT", "STANDIN_VALUE", "STANDIN_LATE_SERVER"):
        monkeypatch.delenv(var, raising=False)
    return d


def _probe_outcomes(v: dict[str, Any], probe: str) -> set[str]:
    return {p["outcome"] for p in v["probes"] if p["probe"] == probe}


def test_a_repair_makes_the_node_unverified_until_the_new_run_passes(
    gated: Callable[..., GatedNode], standin: Path
) -> None:
    node = gated(tools=Tools(path=str(STANDINS), timeout_seconds=120))
    node.sysfs("module/nvidia/version", "570.86.15")
    node.agent.pass_once()  # published unverified; the tools run off the pass thread
    assert node.verification()["state"] == "Unverified"
    assert node.agent.join_verification(timeout=300)
    node.agent.pass_once()  # the finished run is recorded
    first = node.verification()
    assert first["state"] == "Verified", first["reason"]
    for probe in ("gpu-bandwidth", "host-bandwidth", "nccl-allreduce"):
        assert _probe_outcomes(first, probe) == {"Passed"}, probe
    # NIC 2's link is down: Skipped, the others measured
    assert _probe_outcomes(first, "nic-bandwidth") == {"Passed", "Skipped"}

    # The repair: GPU 3 swapped for another board (a new UUID) and the driver upgraded.
    doc = node.snapshot()
    doc[node.host.hgx.gpus[3]]["uuid"] = "GPU-00000003-aaaa-4c1a-9f3e-bbbbbbbbbbbb"
    node.write_snapshot(doc)
    node.sysfs("module/nvidia/version", "580.65.06")
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Unverified"
    assert "changed since the last run" in v["reason"]
    assert v["fingerprint"] == first["fingerprint"]  # the old run, no longer speaking
    assert set(node.gate_taints().values()) == {"unverified"}
    assert node.label() is None
    assert node.agent.join_verification(timeout=300)
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Verified"
    assert v["fingerprint"] != first["fingerprint"]
    assert set(node.gate_taints().values()) == {None}
    assert node.label() == "true"


def test_a_hung_tool_holds_neither_the_pass_nor_the_other_probes(
    gated: Callable[..., GatedNode], standin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvbandwidth hangs: passes go on (the run is on its own thread), the loopbacks run
    beside it, and the hung tool fails the node once its own timeout ends it."""
    monkeypatch.setenv("STANDIN_HANG", "nvbandwidth")
    node = gated(tools=Tools(path=str(STANDINS), timeout_seconds=20))
    node.agent.pass_once()
    node.agent.pass_once()  # a second pass while the tool hangs: returns, publishes as it was
    assert node.verification()["state"] == "Unverified"
    assert node.agent.join_verification(timeout=300)
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Failed"
    [gpu] = [p for p in v["probes"] if p["probe"] == "gpu-bandwidth"]
    assert gpu["reason"] == "nvbandwidth ran past 20 s"
    assert _probe_outcomes(v, "nccl-allreduce") == {"Skipped"}
    assert _probe_outcomes(v, "nic-bandwidth") == {"Passed", "Skipped"}  # NIC 2 is down


def test_the_tools_do_not_run_on_a_node_with_prepared_claims(
    gated: Callable[..., GatedNode], standin: Path
) -> None:
    node = gated(tools=Tools(path=str(STANDINS), timeout_seconds=120))
    node.agent.pass_once()
    assert node.agent.join_verification(timeout=300)
    node.agent.pass_once()
    first = node.verification()
    assert first["state"] == "Verified", first["reason"]
    calls = (standin / "calls").read_text()
    # A claim prepared on the node, then a re-verification asked for.
    node.agent.driver.checkpoint.put(ClaimEntry("uid-1", "team-a", "train-0", ()))
    node.agent.request_verification()
    node.agent.pass_once()
    assert node.agent.join_verification(timeout=300)
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Verified", v["reason"]
    assert (standin / "calls").read_text() == calls  # no tool ran while the node was busy
    [nccl] = [p for p in v["probes"] if p["probe"] == "nccl-allreduce"]
    assert nccl["outcome"] == "Passed"
    assert "node busy: 1 claim(s) prepared on it" in nccl["reason"]


def _fabricdra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricdra.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_a_manual_override_opens_the_gate_and_is_recorded(
    gated: Callable[..., GatedNode],
) -> None:
    node = gated()
    node.sysfs(f"bus/pci/devices/{node.host.hgx.nics[0]}/current_link_speed", "8.0 GT/s PCIe")
    node.agent.pass_once()
    assert node.verification()["state"] == "Failed"

    kubeconfig = str(node.cp.kubeconfig)
    done = _fabricdra(
        "verify", "--override", node.name, "--reason", "RMA-4411 vendor", "--kubeconfig", kubeconfig
    )
    assert done.returncode == 0, done.stderr
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Overridden"
    assert v["override"]["reason"] == "RMA-4411 vendor"
    assert v["override"]["by"]
    assert v["reason"] == "marked verified by hand: RMA-4411 vendor"
    assert v["passed"] is False  # the failed run stays on record next to the override
    assert set(node.gate_taints().values()) == {None}
    assert node.label() == "true"

    assert _fabricdra("verify", "--clear-override", node.name, "--kubeconfig", kubeconfig)
    node.agent.pass_once()
    assert node.verification()["state"] == "Failed"
    assert "override" not in node.verification()
    assert set(node.gate_taints().values()) == {"failed"}
    assert node.label() is None
    annotations = Rest(node.api).get(NODES, node.name)["metadata"].get("annotations") or {}
    assert "fabricdra.io/verification-override" not in annotations


def test_an_override_ends_with_the_hardware_it_was_given_for(
    gated: Callable[..., GatedNode],
) -> None:
    node = gated()
    node.sysfs(f"bus/pci/devices/{node.host.hgx.nics[0]}/current_link_speed", "8.0 GT/s PCIe")
    node.agent.pass_once()
    assert node.verification()["state"] == "Failed"
    kubeconfig = str(node.cp.kubeconfig)
    done = _fabricdra(
        "verify", "--override", node.name, "--reason", "RMA-9", "--expires-in", "2h",
        "--kubeconfig", kubeconfig,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Overridden"
    given_for = v["currentFingerprint"]
    assert v["override"]["fingerprint"] == given_for
    expires = datetime.fromisoformat(v["override"]["expires"])
    assert timedelta(hours=1) < expires - datetime.now(UTC) <= timedelta(hours=2)

    # a repair: GPU 3 swapped. The override spoke for the old hardware only.
    doc = node.snapshot()
    doc[node.host.hgx.gpus[3]]["uuid"] = "GPU-00000003-aaaa-4c1a-9f3e-bbbbbbbbbbbb"
    node.write_snapshot(doc)
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Failed"  # the new hardware's own run (the NIC is still slow)
    assert v["currentFingerprint"] != given_for
    assert "override" not in v
    assert f"given for hardware {given_for}" in v["overrideIgnored"]
    assert set(node.gate_taints().values()) == {"failed"}
    assert node.label() is None


def test_an_expired_override_is_ignored_and_recorded(gated: Callable[..., GatedNode]) -> None:
    node = gated()
    node.sysfs(f"bus/pci/devices/{node.host.hgx.nics[0]}/current_link_speed", "8.0 GT/s PCIe")
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Failed"
    # as the CLI writes it, for this hardware, but already past its expiry
    value = json.dumps(
        {
            "reason": "burn-in",
            "fingerprint": v["currentFingerprint"],
            "expires": "2026-01-01T00:00:00Z",
        }
    )
    patch = {"metadata": {"annotations": {"fabricdra.io/verification-override": value}}}
    client.CoreV1Api(node.api).patch_node(node.name, patch)
    node.agent.pass_once()
    v = node.verification()
    assert v["state"] == "Failed"
    assert "override" not in v
    assert v["overrideIgnored"] == "override expired at 2026-01-01T00:00:00Z: not applied"
    assert set(node.gate_taints().values()) == {"failed"}


def _request_one_gpu(api: Any, cp: ControlPlane, node: str) -> Callable[[], str | None]:
    """A claim for one GPU and a pod pinned to `node`; returns the scheduler's answer probe:
    the node it bound to, or its Unschedulable message (None while undecided)."""
    ns = f"gate-{uuid.uuid4().hex[:6]}"
    cp.create_namespace(ns)
    claim = {
        "metadata": {"name": "one-gpu"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.fabricdra.io"}}]
            }
        },
    }
    pod = {
        "metadata": {"name": "workload"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    client.ResourceV1Api(api).create_namespaced_resource_claim(ns, claim)
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, pod)

    def decided() -> str | None:
        p = core.read_namespaced_pod("workload", ns)
        if p.spec.node_name:
            return f"bound to {p.spec.node_name}"
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.reason == "Unschedulable":
                return f"unschedulable: {c.message}"
        return None

    return decided


def _bound(answer: Callable[[], str | None]) -> Callable[[], str | None]:
    """Waits past an earlier Unschedulable answer for the binding."""

    def check() -> str | None:
        a = answer()
        return a if a is not None and a.startswith("bound") else None

    return check


def test_the_basic_model_gates_through_the_deviceclasses(
    control_plane: ControlPlane, kube_scheduler: Any, tmp_path: Path
) -> None:
    """1.34/1.35: no device taints; `verified: false` and the DeviceClasses' selector."""
    name = f"gate-basic-{uuid.uuid4().hex[:6]}"
    control_plane.create_node(name, labels={"kubernetes.io/hostname": name})
    host = build_host(tmp_path / "host", vf_nics=())
    d = host.discovery
    with control_plane.api_client() as api:
        publisher = NodePublisher(api, name, features=ApiFeatures("basic"))
        inventory = host.inventory()
        assert publisher.sync(d, inventory, GateInput(None, "fp")).ok
        devices = {
            dev.name: dev
            for sl in client.ResourceV1Api(api)
            .list_resource_slice(field_selector=f"spec.nodeName={name}")
            .items
            for dev in sl.spec.devices or []
        }
        assert {dev.attributes["verified"].bool for dev in devices.values()} == {False}
        assert all(not dev.taints for dev in devices.values())
        answer = _request_one_gpu(api, control_plane, name)
        assert wait_for(answer, what="the scheduler's answer").startswith("unschedulable")

        run = VerificationRun(datetime.now(UTC), "fp", [], True, "passed")
        assert publisher.sync(d, inventory, GateInput(run, "fp")).ok
        assert wait_for(_bound(answer), what="the pod scheduled") == f"bound to {name}"


def test_the_scheduler_offers_a_gated_nodes_devices_only_once_verified(
    gated: Callable[..., GatedNode], kube_scheduler: Any
) -> None:
    node = gated(nvlinks=False)
    node.agent.pass_once()
    assert node.verification()["state"] == "Unverified"
    decided = _request_one_gpu(node.api, node.cp, node.name)
    answer = wait_for(decided, what="the scheduler's answer for the unverified node")
    assert answer.startswith("unschedulable"), answer

    done = _fabricdra(
        "verify", "--override", node.name, "--reason", "burn-in passed offline",
        "--kubeconfig", str(node.cp.kubeconfig),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    node.agent.pass_once()
    assert wait_for(_bound(decided), what="the pod scheduled") == f"bound to {node.name}"


def test_the_basic_model_keeps_an_unhealthy_device_out_through_the_deviceclasses(
    control_plane: ControlPlane, kube_scheduler: Any
) -> None:
    """1.34/1.35: no device taints; the `health` attribute the basic publisher writes and the
    DeviceClasses' selector keep an Unhealthy GPU from being allocated (issue 18)."""
    from fabricdra.kube.rest import SLICES

    name = f"health-basic-{uuid.uuid4().hex[:6]}"
    control_plane.create_node(name, labels={"kubernetes.io/hostname": name})

    def gpu_slice(health: str, generation: int) -> dict[str, Any]:
        attrs = {"type": {"string": "gpu"}, "health": {"string": health},
                 "verified": {"bool": True}}  # fmt: skip
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-devices.fabricdra.io-{generation}"},
            "spec": {
                "driver": "devices.fabricdra.io",
                "nodeName": name,
                "pool": {"name": name, "generation": generation, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": attrs}],
            },
        }

    with control_plane.api_client() as api:
        rest = Rest(api)
        rest.create(SLICES, gpu_slice("Unhealthy", 0))
        answer = _request_one_gpu(api, control_plane, name)
        assert wait_for(answer, what="the scheduler's answer").startswith("unschedulable")
        # Healthy again (a new generation replaces the old slice, as the publisher does).
        rest.create(SLICES, gpu_slice("Healthy", 1))
        rest.delete(SLICES, f"{name}-devices.fabricdra.io-0")
        assert wait_for(_bound(answer), what="the pod scheduled") == f"bound to {name}"
