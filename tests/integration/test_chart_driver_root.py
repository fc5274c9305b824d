"""The NVIDIA driver root (issue 30 point 3), rendered by the real helm and mounted by the real
kernel: the node pod's driver mounts, made in a private mount namespace exactly as kubelet
makes a hostPath volume (a recursive bind; `rslave` for HostToContainer), must follow a GPU
Operator driver upgrade (the driver container unmounts its root at the driver root and mounts
a new one) and must work with GKE's layout (no `usr` under the driver root). Also: the pod
waits for the driver (`wait-for-driver`), and the GPU Operator's driver manager can evict it
(`nvidia.com/gpu.deploy.client`)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.helm import Chart

pytestmark = pytest.mark.integration

OPERATOR_ROOT = "/run/nvidia/driver"
GKE_ROOT = "/home/kubernetes/bin/nvidia"


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


def _pod(chart: Chart, values: dict[str, Any]) -> dict[str, Any]:
    docs = chart.template(values)
    ds = next(
        d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "fabricdra-node"
    )
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(
        c for c in [*pod["containers"], *pod.get("initContainers", [])] if c["name"] == name
    )


def _driver_mounts(pod: dict[str, Any], container: str) -> list[tuple[str, str, str, str]]:
    """(host path, hostPath type, mount path, propagation) of the container's driver mounts."""
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    out = []
    for m in _container(pod, container)["volumeMounts"]:
        if m["mountPath"].startswith("/driver-root"):
            hp = volumes[m["name"]]
            out.append((hp["path"], hp["type"], m["mountPath"], m.get("mountPropagation", "None")))
    return out


def _library_path(pod: dict[str, Any]) -> list[str]:
    env = {e["name"]: e.get("value") for e in _container(pod, "devices")["env"]}
    return [d for d in env["LD_LIBRARY_PATH"].split(":") if d.startswith("/driver-root")]


def _driver_layout(root: Path, version: str, *, gke: bool) -> Path:
    lib = root / ("lib64" if gke else "usr/lib/x86_64-linux-gnu")
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.1").write_text(version)
    return root


def _upgrade_seen_by(pod: dict[str, Any], tmp: Path, driver_root: str, *, gke: bool) -> str:
    """Mount driver v1 at the host's driver root, make the devices container's mounts as
    kubelet does, replace v1 by v2 as the driver container does at an upgrade, and return the
    NVML the container's LD_LIBRARY_PATH finds then ('' none). In a private mount namespace,
    so nothing leaks to this host. A hostPath of type Directory that is missing fails as
    kubelet fails it (the pod stays in ContainerCreating)."""
    host, ctr = tmp / "host", tmp / "ctr"
    v1 = _driver_layout(tmp / "v1", "v1", gke=gke)
    v2 = _driver_layout(tmp / "v2", "v2", gke=gke)
    q = shlex.quote
    lines = [
        "set -eu",
        f"mkdir -p {q(str(host))} {q(str(ctr))}",
        f"mount -t tmpfs fake-host {q(str(host))}",
        f"mount --make-rshared {q(str(host))}",
        f"mkdir -p {q(str(host) + driver_root)}",
        f"mount --bind {q(str(v1))} {q(str(host) + driver_root)}",  # the driver container
    ]
    for path, kind, mount_path, propagation in _driver_mounts(pod, "devices"):
        src, dst = q(str(host) + path), q(str(ctr) + mount_path)
        if kind == "Directory":
            lines.append(f"[ -d {src} ] || {{ echo 'ContainerCreating: {path} missing'; exit 0; }}")
        else:
            lines.append(f"mkdir -p {src}")
        lines += [f"mkdir -p {dst}", f"mount --rbind {src} {dst}"]
        if propagation == "HostToContainer":
            lines.append(f"mount --make-rslave {dst}")
    lines += [
        f"umount -l {q(str(host) + driver_root)}",  # the old driver container goes
        f"mount --bind {q(str(v2))} {q(str(host) + driver_root)}",  # the new one comes
    ]
    for d in _library_path(pod):
        f = q(f"{ctr}{d}/libnvidia-ml.so.1")
        lines.append(f"if [ -e {f} ]; then cat {f}; exit 0; fi")
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(("root", "gke"), [(OPERATOR_ROOT, False), (GKE_ROOT, True)])
def test_a_driver_upgrade_is_followed_and_gke_layouts_work(
    chart: Chart, tmp_path: Path, root: str, gke: bool
) -> None:
    pod = _pod(chart, {"driverRoot": root})
    assert _upgrade_seen_by(pod, tmp_path, root, gke=gke) == "v2"


def test_the_driver_root_parent_is_mounted_never_the_host_root(chart: Chart) -> None:
    pod = _pod(chart, {"driverRoot": OPERATOR_ROOT + "/"})
    for name in ("devices", "compute-domain", "wait-for-driver"):
        assert _driver_mounts(pod, name) == [
            ("/run/nvidia", "DirectoryOrCreate", "/driver-root-parent", "HostToContainer")
        ], name
    cd = _container(pod, "compute-domain")
    assert "--container-driver-root=/driver-root-parent/driver" in cd["args"]
    assert f"--driver-root={OPERATOR_ROOT}/" in cd["args"]  # host path, for the IMEX daemons
    # A driver installed on the host: only its /usr, never `/` (keys, kubelet credentials).
    host = _pod(chart, {"driverRoot": "/"})
    paths = {v["hostPath"]["path"] for v in host["volumes"] if "hostPath" in v}
    assert "/" not in paths
    assert _driver_mounts(host, "devices") == [("/usr", "Directory", "/driver-root/usr", "None")]
    assert "--container-driver-root=/driver-root" in _container(host, "compute-domain")["args"]


def test_the_pod_waits_for_the_driver(chart: Chart) -> None:
    init = _container(_pod(chart, {"driverRoot": OPERATOR_ROOT}), "wait-for-driver")
    assert init["args"][1:] == [
        "wait-for-driver",
        "--sysfs-root=/host/sys",
        "--driver-root=/driver-root-parent/driver",
        f"--host-driver-root={OPERATOR_ROOT}",
    ]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    off = _pod(chart, {"gpus": {"enabled": False}, "computeDomains": {"enabled": False}})
    assert "initContainers" not in off
    # Recorded NVML answers (tests, demos) load no library: nothing to wait for.
    assert "initContainers" not in _pod(chart, {"nvmlSnapshot": "/var/lib/nvml.json"})


def test_the_gpu_operators_driver_manager_can_evict_the_node_pod(chart: Chart) -> None:
    """GPU Operator 26.7+ labels GPU nodes nvidia.com/gpu.deploy.client=true; its driver
    manager sets paused-for-driver-upgrade (MIG manager: paused-for-mig-change) and waits
    for GPU clients to leave before it unloads the driver; our agent holds NVML open."""
    pause = {
        "key": "nvidia.com/gpu.deploy.client",
        "operator": "NotIn",
        "values": ["paused-for-driver-upgrade", "paused-for-mig-change", "false"],
    }
    for values in ({}, {"node": {"deviceNodeLabels": []}}):
        terms = _pod(chart, values)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms
        assert all(pause in t["matchExpressions"] for t in terms)
    rdma_only = _pod(chart, {"gpus": {"enabled": False}})
    terms = rdma_only["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert not [t for t in terms if pause in t["matchExpressions"]]
