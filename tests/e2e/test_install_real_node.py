"""The chart with a real node's mounts (issue 19 points 2 and 3): host `/dev` itself (the chart's
default `devRoot`), not the made-up node's folder the other scenarios use.

- Beside NVIDIA's GPU DRA driver (`gpus.enabled=false computeDomains.enabled=false`), with a
  stand-in for that driver's own GPU ResourceSlice: the node pod starts (runc must be able to
  make every mountpoint with host /dev mounted read-only at /dev), offers only NICs, and leaves
  NVIDIA's slice alone.
- With GPUs on: NVML's device nodes, made on this host with NVIDIA's numbers (nvidiactl 195:255,
  nvidia0 195:0, nvidia-uvm), open from inside the devices container as far as the kernel: ENXIO,
  no driver behind them, not EPERM from the container's device cgroup.

The open runs in the real container through containerd (`ctr tasks exec`), as NVML would.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness import binaries
from e2e.harness.controlplane import wait_for
from tests.e2e.installkit import NAMESPACE, Installed, own_slices
from tests.integration.kubelethost import NVIDIA_MAJOR, UVM_MAJOR

pytestmark = pytest.mark.e2e

NODE_PODS = "app.kubernetes.io/component=node"
NVIDIA_DRIVER = "gpu.nvidia.com"
# NVML's device nodes, with the NVIDIA driver's numbers (nvidia-uvm's major is dynamic; the
# made-up node's is used).
NVML_NODES = {"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia0": (NVIDIA_MAJOR, 0)}
NVML_NODES["nvidia-uvm"] = (UVM_MAJOR, 0)
OPEN_ALL = (
    "import errno, json, os\n"
    "out = {}\n"
    "for name in NAMES:\n"
    "    try:\n"
    "        os.close(os.open('/dev/' + name, os.O_RDWR))\n"
    "        out[name] = 'opened'\n"
    "    except OSError as e:\n"
    "        out[name] = errno.errorcode[e.errno]\n"
    "print(json.dumps(out))\n"
)


@pytest.fixture
def host_nvml_nodes() -> Iterator[list[str]]:
    """NVML's device nodes in this host's /dev (the node's), removed again afterwards; nodes
    already there (a real GPU host) are left alone and not tested."""
    made = []
    for name, (major, minor) in NVML_NODES.items():
        path = Path("/dev") / name
        if path.exists():
            continue
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
        made.append(name)
    try:
        yield made
    finally:
        for name in made:
            with contextlib.suppress(FileNotFoundError):
                (Path("/dev") / name).unlink()


def _nvidia_slice(node: str) -> dict[str, Any]:
    """What NVIDIA's GPU DRA driver publishes for a node, in miniature."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-{uuid.uuid4().hex[:5]}"},
        "spec": {
            "driver": NVIDIA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": "GPU-00000000-1111-2222-3333-444444444444"},
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                }
            ],
        },
    }


def _real_dev_values(installation: Installed, **switches: bool) -> dict[str, Any]:
    values = copy.deepcopy(installation.values)
    values.pop("devRoot")  # the chart's default: host /dev
    values["gpus"] = {"enabled": switches["gpus"]}
    values["computeDomains"] = {"enabled": switches["compute_domains"]}
    return values


def _node_pod(api: client.ApiClient) -> Any:
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=NODE_PODS).items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def _wait_rolled(installation: Installed) -> Any:
    """One node pod, of the DaemonSet's current template, Ready."""
    with installation.cluster.api_client() as api:
        apps = client.AppsV1Api(api)

        def rolled() -> Any:
            ds = apps.read_namespaced_daemon_set("fabricdra-node", NAMESPACE)
            st = ds.status
            pods = (
                client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=NODE_PODS).items
            )
            done = (
                st.observed_generation == ds.metadata.generation
                and st.updated_number_scheduled == 1
                and st.number_ready == 1
                and len(pods) == 1
            )
            return pods[0] if done else None

        return wait_for(rolled, timeout=240, what="the node DaemonSet to roll")


def _exec_in(installation: Installed, container_id: str, code: str) -> str:
    cluster = installation.cluster
    done = subprocess.run(
        [
            str(binaries.bin_dir() / "ctr"),
            f"--address={cluster.containerd_socket}",
            "--namespace=k8s.io",
            "tasks",
            "exec",
            f"--exec-id=nvml-open-{uuid.uuid4().hex[:6]}",
            container_id,
            "python3",
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_beside_nvidia_and_with_gpus_on_host_dev(
    installation: Installed, host_nvml_nodes: list[str]
) -> None:
    assert host_nvml_nodes, "the harness host already has NVML's device nodes: nothing to test"
    if installation.present:
        installation.uninstall()
    cluster, node = installation.cluster, installation.cluster.node_name
    with cluster.api_client() as api:
        resource = client.ResourceV1Api(api)
        theirs = resource.create_resource_slice(_nvidia_slice(node))
        try:
            # Point 3: beside NVIDIA's driver, host /dev read-only at /dev.
            installation.chart.install(
                cluster.kubeconfig,
                NAMESPACE,
                values=_real_dev_values(installation, gpus=False, compute_domains=False),
                timeout="3m",
            )
            installation.present = True
            pod = _wait_rolled(installation)
            assert [c.name for c in pod.spec.containers] == ["devices"]
            assert all(s.ready for s in pod.status.container_statuses)
            ours = wait_for(
                lambda: [d for s in own_slices(api, node) for d in s.spec.devices or []] or None,
                timeout=120,
                what="fabricdra's devices",
            )
            kinds = {d.attributes["type"].string for d in ours}
            assert kinds
            assert not kinds & {"gpu", "mig"}, kinds
            after = resource.read_resource_slice(theirs.metadata.name)
            assert after.metadata.resource_version == theirs.metadata.resource_version
            assert [d.name for d in after.spec.devices] == ["gpu-0"]

            # Point 2: with GPUs on, NVML's nodes open as far as the kernel.
            installation.chart.install(
                cluster.kubeconfig,
                NAMESPACE,
                values=_real_dev_values(installation, gpus=True, compute_domains=False),
                timeout="3m",
            )
            pod = _wait_rolled(installation)
            devices = next(s for s in pod.status.container_statuses if s.name == "devices")
            container_id = devices.container_id.split("://", 1)[1]
            out = _exec_in(
                installation, container_id, OPEN_ALL.replace("NAMES", repr(list(NVML_NODES)))
            )
            opened = json.loads(out)
            for name in host_nvml_nodes:
                # ENXIO: the kernel has no driver for the number; EPERM would be the cgroup.
                assert opened[name] == "ENXIO", opened
        finally:
            with contextlib.suppress(Exception):
                resource.delete_resource_slice(theirs.metadata.name)
            if installation.present:
                installation.uninstall()
