"""Dynamic MIG in the cluster (issue 20 point 2): the chart installed with `dynamicMIG: true`
and no `nvmlSnapshot`, so the node agent asks NVML live, through the chart's own path to the
host's driver: `driverRoot` names a driver root whose usr/lib/x86_64-linux-gnu/ holds
libnvidia-ml.so.1, here the C stand-in of tests/nvmlfake (one H100 80GB HBM3 in MIG mode with
the H100's real placement rules), which the agent loads through the chart's LD_LIBRARY_PATH.

The node: a sysfs tree (tests/sysfs) with that GPU at the stand-in's bus id, the driver's
/proc files (`Device Minor`, the MIG access capabilities of GPU instances 1-7, compute instance
0) and real device nodes (mknod) for the GPU and the capabilities. The stand-in keeps its GPU
instances in a file (FAKE_NVML_STATE, through the chart's `extraEnv`) in the agent's state
folder on the host, as a GPU keeps them across agent restarts: the test seeds an instance
there before the agent starts (an administrator's static MIG) and reads it back as
`nvidia-smi mig -lgi` would; the stand-in also logs every create/destroy NVML was asked for.

Through the real scheduler and kubelet: the static 2g.20gb instance (memory slices 0-1) is
adopted, and the whole GPU and the placements over it are not offered; a pod whose claim is the
docs example `mig-3g-40gb.yaml` gets the placement at memory slice 4, its instance is created
(journal, NVML, the slice listing it with its UUID) and the container sees exactly the GPU's and
that instance's device nodes and NVIDIA_VISIBLE_DEVICES=void; a second such claim does not fit
(its other placement overlaps the static instance) and its pod stays Pending; with the first
pod and claim deleted the instance is destroyed (journal empty) and the second pod runs on a
new instance at the same placement. The static instance is never destroyed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.harness.controlplane import wait_for
from tests.e2e.installkit import (
    DRIVER,
    EXAMPLES,
    NAMESPACE,
    Installed,
    namespace,
    own_slices,
    run_pod,
    wait_running,
)
from tests.integration.kubelethost import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR, mknod
from tests.nvmlfake import standin
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import rdma_node

pytestmark = pytest.mark.e2e

MODEL = "h100"
BUS = "0000:20:00.0"  # rdma_node's GPU
STEM = "0000-20-00-0"
MINOR = 0
STATIC = ("2g.20gb", 0)  # GPU instance 1: memory slices 0-1, 2 compute slices
PLACEMENT = f"mig-{STEM}-3g-40gb-m4"
PROBE = (
    "echo env NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; "
    "for f in /dev/nvidia*; do echo dev $f; done; "
    "ls -l /dev/nvidia-caps | sed 's/^/caps /'; sleep 3600"
)


def cap_minor(gi: int, ci: int | None = None) -> int:
    """The capability's device minor on this made-up node: a block per GPU instance (its own
    access, then one per compute instance), after the config and monitor capabilities, in the
    manner of the driver's /proc/driver/nvidia-caps/mig-minors. The agent never assumes a
    numbering: it reads each minor from the capability's `access` file (DeviceFileMinor)."""
    return 3 + 9 * gi + (0 if ci is None else 1 + ci)


@dataclass
class MigNode:
    sys: Path
    dev: Path
    proc: Path
    driver_root: Path


def build_mig_node(root: Path) -> MigNode:
    sys_root, dev, proc = root / "sys", root / "dev", root / "proc"
    node = rdma_node(SysfsBuilder(sys_root), [], gpu=True)
    assert node.gpus == [BUS]
    info = proc / "driver" / "nvidia" / "gpus" / BUS / "information"
    info.parent.mkdir(parents=True)
    info.write_text(
        f"Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t {BUS}\nDevice Minor: \t {MINOR}\n"
    )
    mknod(dev / f"nvidia{MINOR}", NVIDIA_MAJOR, MINOR)
    mknod(dev / "nvidiactl", NVIDIA_MAJOR, 255)
    mknod(dev / "nvidia-uvm", UVM_MAJOR, 0)
    # The H100 holds at most 7 GPU instances (ids 1-7), each with compute instance 0 here.
    caps = proc / "driver" / "nvidia" / "capabilities" / f"gpu{MINOR}" / "mig"
    for gi in range(1, 8):
        for rel, minor in (
            (f"gi{gi}/access", cap_minor(gi)),
            (f"gi{gi}/ci0/access", cap_minor(gi, 0)),
        ):
            (caps / rel).parent.mkdir(parents=True, exist_ok=True)
            (caps / rel).write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
            mknod(dev / "nvidia-caps" / f"nvidia-cap{minor}", CAPS_MAJOR, minor)
    driver_root = root / "driver"
    standin.build(driver_root / "usr" / "lib" / "x86_64-linux-gnu", MODEL, bus=f"0000{BUS}")
    return MigNode(sys_root, dev, proc, driver_root)


def mig_values(installation: Installed, node: MigNode, nvml_state: Path) -> dict[str, Any]:
    values = copy.deepcopy(installation.values)
    values.pop("nvmlSnapshot")  # NVML asked live: the library under driverRoot
    values.update(
        sysfsRoot=str(node.sys),
        devRoot=str(node.dev),
        procRoot=str(node.proc),
        driverRoot=str(node.driver_root),
        dynamicMIG=True,
        computeDomains={"enabled": False},
    )
    values["extraEnv"] = [
        *values["extraEnv"],
        {"name": "FAKE_NVML_STATE", "value": str(nvml_state)},
    ]
    return values


def mig_claim(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((EXAMPLES / "mig-3g-40gb.yaml").read_text())
    obj["metadata"]["name"] = name
    return obj


def allocated(api: client.ApiClient, ns: str, name: str) -> list[str]:
    obj = client.ResourceV1Api(api).read_namespaced_resource_claim(name, ns)
    if obj.status is None or obj.status.allocation is None:
        return []
    return [str(r.device) for r in obj.status.allocation.devices.results]


def unschedulable(api: client.ApiClient, ns: str, pod: str) -> bool:
    status = client.CoreV1Api(api).read_namespaced_pod(pod, ns).status
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in status.conditions or []
    )


def gpu_devices(api: client.ApiClient, node: str) -> dict[str, Any]:
    """The node's GPU and MIG devices by name, once every one is offered untainted."""
    devices = {
        d.name: d
        for s in own_slices(api, node)
        for d in s.spec.devices or []
        if d.attributes.get("type") and d.attributes["type"].string in ("gpu", "mig")
    }
    # An informative taint (effect None: health Unknown) blocks nothing.
    if not devices or any(t.effect != "None" for d in devices.values() for t in d.taints or []):
        return {}
    return devices


def journal(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records: list[dict[str, Any]] = json.loads(path.read_text())["records"]
    return records


def seen(api: client.ApiClient, ns: str, pod: str) -> tuple[set[str], set[str], dict[str, Any]]:
    """What the container printed: its environment line(s), its /dev/nvidia* entries and its
    /dev/nvidia-caps nodes (name -> (major, minor))."""
    log = wait_for(
        lambda: (
            text
            if "caps " in (text := client.CoreV1Api(api).read_namespaced_pod_log(pod, ns) or "")
            else None
        ),
        what=f"the output of {pod}",
    )
    env, dev, caps = set(), set(), {}
    for line in str(log).splitlines():
        if line.startswith("env "):
            env.add(line[4:])
        elif line.startswith("dev "):
            dev.add(line[4:])
        elif m := re.match(r"caps c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(\S+)$", line):
            caps[m.group(3)] = (int(m.group(1)), int(m.group(2)))
    return env, dev, caps


def agent_log(installation: Installed) -> str:
    """The node agent's (devices container's) log."""
    with installation.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        pods = core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/component=node"
        ).items
        return "".join(
            str(core.read_namespaced_pod_log(p.metadata.name, NAMESPACE, container="devices"))
            for p in pods
        )


def test_pod_gets_a_dynamically_created_mig_instance_beside_a_static_one(
    installation: Installed, tmp_path: Path
) -> None:
    if installation.present:
        installation.uninstall()
    cluster, node_name = installation.cluster, installation.cluster.node_name
    node = build_mig_node(tmp_path / "node")
    state_dir = cluster.plugins_dir / DRIVER  # the agent's state folder on the host
    state_dir.mkdir(parents=True, exist_ok=True)
    nvml_state = state_dir / "fake-nvml-gpu.state"
    nvml_log = Path(f"{nvml_state}.log")
    mig_journal = state_dir / "dynamic-mig.json"
    for leftover in (nvml_state, nvml_log, mig_journal):
        leftover.unlink(missing_ok=True)
    standin.seed(nvml_state, MODEL, [STATIC])
    static = standin.GpuInstance(1, *STATIC, 0)
    try:
        installation.chart.install(
            cluster.kubeconfig,
            NAMESPACE,
            values=mig_values(installation, node, nvml_state),
            timeout="3m",
        )
        installation.present = True
        with namespace(installation, "dynmig") as (api, ns):
            resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
            offered = wait_for(
                lambda: gpu_devices(api, node_name) or None,
                timeout=180,
                what="the MIG GPU's devices offered untainted",
            )
            # The static instance is adopted; nothing it overlaps is offered.
            adopted = offered[f"mig-{STEM}-gi1-ci0"]
            assert adopted.attributes["migProfile"].string == "2g.20gb"
            assert f"gpu-{STEM}" not in offered
            assert f"mig-{STEM}-3g-40gb-m0" not in offered
            assert PLACEMENT in offered
            assert "uuid" not in offered[PLACEMENT].attributes  # not created yet

            resource.create_namespaced_resource_claim(ns, mig_claim("a"))
            run_pod(api, ns, "a", "a", command=PROBE)
            wait_running(core, ns, "a")
            assert allocated(api, ns, "a") == [PLACEMENT]
            claim_a = resource.read_namespaced_resource_claim("a", ns).metadata.uid
            env, dev, caps = seen(api, ns, "a")
            made = standin.instances(nvml_state, MODEL)
            records = journal(mig_journal)
            listed = wait_for(
                lambda: (
                    d
                    if (d := gpu_devices(api, node_name).get(PLACEMENT)) and "uuid" in d.attributes
                    else None
                ),
                timeout=120,
                what="the created instance listed in the slice",
            )

            # A second 3g.40gb: m4 is taken, m0 overlaps the static instance.
            resource.create_namespaced_resource_claim(ns, mig_claim("b"))
            run_pod(api, ns, "b", "b", command=PROBE)
            wait_for(lambda: unschedulable(api, ns, "b"), timeout=120, what="b unschedulable")
            b_before = allocated(api, ns, "b")
            b_node = core.read_namespaced_pod("b", ns).spec.node_name

            # Deleted gracefully (a forced delete removes the pod object before kubelet has
            # unprepared it: b could be allocated first, its prepare refused while a still
            # holds the device, and retried after kubelet's back-off).
            core.delete_namespaced_pod("a", ns, grace_period_seconds=1)
            # (b may be prepared as soon as a's claim is free: only a's record is waited for)
            wait_for(
                lambda: all(r["claim"] != claim_a for r in journal(mig_journal)) or None,
                timeout=120,
                what="a's instance destroyed (its record dropped)",
            )
            after_a = nvml_log.read_text().splitlines()[:2]
            wait_for(
                lambda: "a" not in {p.metadata.name for p in core.list_namespaced_pod(ns).items},
                timeout=120,
                what="pod a gone",
            )
            resource.delete_namespaced_resource_claim("a", ns)

            # (kubelet may have tried b's prepare while a still held the device: its retry
            # comes after a back-off)
            wait_for(
                lambda: core.read_namespaced_pod("b", ns).status.phase == "Running" or None,
                timeout=240,
                what="pod b to run",
            )
            assert allocated(api, ns, "b") == [PLACEMENT]
            claim_b = resource.read_namespaced_resource_claim("b", ns).metadata.uid
            b_env, b_dev, b_caps = seen(api, ns, "b")
            made_b = standin.instances(nvml_state, MODEL)
            records_b = journal(mig_journal)
            core.delete_namespaced_pod("b", ns, grace_period_seconds=1)
            wait_for(
                lambda: not core.list_namespaced_pod(ns).items or None,
                timeout=120,
                what="pod b gone",
            )
            resource.delete_namespaced_resource_claim("b", ns)
            wait_for(
                lambda: not journal(mig_journal) or None,
                timeout=120,
                what="b's instance destroyed (journal empty)",
            )
            end = standin.instances(nvml_state, MODEL)
            back = wait_for(
                lambda: (
                    d
                    if (d := gpu_devices(api, node_name).get(PLACEMENT))
                    and "uuid" not in d.attributes
                    else None
                ),
                timeout=120,
                what="the placement offered again, not created",
            )
        changes = nvml_log.read_text().splitlines()
    finally:
        with contextlib.suppress(Exception):  # shown by pytest when the test fails
            print(agent_log(installation))
        with contextlib.suppress(Exception):
            if installation.present:
                installation.uninstall()
        for made_here in (nvml_state, nvml_log, mig_journal):
            made_here.unlink(missing_ok=True)

    # pod a: the placement's instance made (GPU instance 2, beside the static 1) ...
    assert made == [static, standin.GpuInstance(2, "3g.40gb", 4, 0)]
    assert [(r["claim"], r["device"], r["profile"], r["start"]) for r in records] == [
        (claim_a, PLACEMENT, "3g.40gb", 4)
    ]
    assert records[0]["created"]["gpu_instance"] == 2
    assert listed.attributes["uuid"].string == records[0]["created"]["uuid"]
    # ... and its container sees the GPU's nodes and exactly that instance's capabilities
    assert env == {"NVIDIA_VISIBLE_DEVICES=void"}
    assert dev == {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps"}
    assert caps == {
        f"nvidia-cap{cap_minor(2)}": (CAPS_MAJOR, cap_minor(2)),
        f"nvidia-cap{cap_minor(2, 0)}": (CAPS_MAJOR, cap_minor(2, 0)),
    }
    # b did not fit next to a: the scheduler's counters, not the agent, kept it out
    assert b_before == []
    assert b_node is None
    # a gone: its instance destroyed (before b's could be made at the same placement)
    assert after_a == ["create-gpu-instance 2 4", "destroy-gpu-instance 2 4"]
    # b on a new instance at the same placement (the id 2 free again)
    assert made_b == [static, standin.GpuInstance(2, "3g.40gb", 4, 0)]
    assert [(r["claim"], r["device"]) for r in records_b] == [(claim_b, PLACEMENT)]
    assert b_env == env
    assert b_dev == dev
    assert b_caps == caps
    # the static instance survived it all: NVML was asked to create and destroy only ours
    assert end == [static]
    assert back.attributes["migPlacementStart"].int == 4
    assert changes == [
        "create-gpu-instance 2 4",
        "destroy-gpu-instance 2 4",
        "create-gpu-instance 2 4",
        "destroy-gpu-instance 2 4",
    ]
