"""fabricdra installed the way users install it, shared by the in-cluster scenario modules.

The `installation` fixture (tests/e2e/conftest.py) builds the node's files, the image from this
checkout and the chart once per session; `installed` makes sure the release is in place before a
test (the uninstall scenario removes it, and the next test that needs it installs it again), so
scenarios do not depend on the order they run in.

The node is made to look like an 8-GPU HGX node the honest way (tests/integration/kubelethost.py):
a sysfs tree laid out as the kernel does, recorded NVML answers, the NVIDIA driver's /proc files
and real character device nodes (mknod) for every device the CDI specs name. Only values point
the chart at them (sysfsRoot, devRoot, procRoot, nvmlSnapshot), as an operator would on a node
with an unusual layout.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.helm import Chart
from e2e.harness.images import TEST_IMAGE
from e2e.harness.nodecluster import NodeCluster
from tests.integration.kubelethost import Host

NAMESPACE = "fabricdra-system"
DRIVER = "devices.fabricdra.io"
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


@dataclass
class Installed:
    cluster: NodeCluster
    host: Host
    chart: Chart
    values: dict[str, Any]
    present: bool = False

    def ensure(self) -> None:
        """Install (or re-install) the release with the session's values when it is not there."""
        if not self.present:
            self.chart.install(self.cluster.kubeconfig, NAMESPACE, values=self.values)
            self.present = True

    def uninstall(self) -> None:
        self.present = False
        self.chart.uninstall(self.cluster.kubeconfig, NAMESPACE)


@contextmanager
def namespace(installed: Installed, prefix: str) -> Iterator[tuple[client.ApiClient, str]]:
    """A namespace of the scenario's own (`<prefix>-<random>`), deleted when it ends; the
    scenario ends once it is gone, and with it its pods, whose claims kubelet has then
    unprepared (it removes a pod only after that). Ending at the delete let the next scenario
    reinstall the chart while kubelet still had those claims to unprepare: a full run left
    three claims in the agent's checkpoint, and the verification scenario's node stayed
    "busy" (active probes never run) until it timed out."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    with installed.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
        try:
            yield api, ns
        finally:
            core.delete_namespace(ns)
            wait_for(lambda: _gone(core, ns), timeout=300, what=f"namespace {ns} gone")


def _gone(core: client.CoreV1Api, ns: str) -> bool:
    try:
        core.read_namespace(ns)
    except client.ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def own_slices(api: client.ApiClient, node: str) -> list[Any]:
    slices = client.ResourceV1Api(api).list_resource_slice().items
    return [s for s in slices if s.spec.driver == DRIVER and s.spec.node_name == node]


def offered_untainted(api: client.ApiClient, node: str) -> list[Any] | None:
    """The node's devices once every one is offered without a taint that blocks (verification
    passed; an informative `None` taint, health Unknown, blocks nothing)."""
    devices = [d for s in own_slices(api, node) for d in s.spec.devices or []]
    if not devices or any(t.effect != "None" for d in devices for t in d.taints or []):
        return None
    return devices


def run_pod(
    api: client.ApiClient,
    ns: str,
    name: str,
    claim: str | None,
    command: str = "echo NCCL_IB_HCA=$NCCL_IB_HCA; ls /dev/infiniband; sleep 3600",
) -> Any:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "c",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", command],
            }
        ],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimName": claim}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
    return client.CoreV1Api(api).create_namespaced_pod(
        ns, {"metadata": {"name": name}, "spec": spec}
    )


def wait_running(core: client.CoreV1Api, ns: str, name: str) -> Any:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase == "Running" else None

    return wait_for(running, timeout=120, what=f"pod {ns}/{name} to run")


def gpu_claim(
    name: str, expression: str | None = None, capacity: dict[str, str] | None = None
) -> dict[str, Any]:
    """A claim for one GPU of class gpu.fabricdra.io, with a CEL selector and capacity
    requests where given (as users write them)."""
    exactly: dict[str, Any] = {"deviceClassName": "gpu.fabricdra.io"}
    if expression is not None:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
