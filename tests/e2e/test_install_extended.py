"""In-cluster: a pod asking `resources.limits: {fabricdra.io/gpu: 1}` and no resourceClaims runs
with exactly one GPU, prepared by our driver through the claim the scheduler wrote for it
(extended resources backed by DRA, KEP-5004; tests/e2e/installkit.py says how the node and the
release are made)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.images import TEST_IMAGE
from tests.e2e.installkit import DRIVER, Installed, offered_untainted, own_slices, wait_running

pytestmark = pytest.mark.e2e

# Every /dev/nvidiaN the container has, with its device numbers (hex), then the marker line.
LIST_GPUS = (
    'for n in /dev/nvidia[0-9]*; do [ -e "$n" ] && stat -c \'GPU %n %t %T %F\' "$n"; done; '
    "echo LISTED; sleep 3600"
)


def test_a_pod_asking_fabricdra_gpu_runs_with_exactly_one_gpu(installed: Installed) -> None:
    node = installed.cluster.node_name
    ns = f"extres-{uuid.uuid4().hex[:6]}"
    with installed.cluster.api_client() as api:
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
        pod = {
            "metadata": {"name": "p"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "c",
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", LIST_GPUS],
                        "resources": {"limits": {"fabricdra.io/gpu": "1"}},
                    }
                ],
            },
        }
        core.create_namespaced_pod(ns, pod)
        wait_running(core, ns, "p")
        log = wait_for(
            lambda: (lambda text: text if "LISTED" in text else None)(
                core.read_namespaced_pod_log("p", ns)
            ),
            what="the pod's list of GPUs",
        )
        # Raw JSON: extendedResourceClaimStatus is newer than the generated client's models.
        status: dict[str, Any] = json.loads(
            core.read_namespaced_pod("p", ns, _preload_content=False).data
        )["status"]
        claim = resource.read_namespaced_resource_claim(
            status["extendedResourceClaimStatus"]["resourceClaimName"], ns
        )
        devices = {d.name: d for s in own_slices(api, node) for d in s.spec.devices or []}
        core.delete_namespace(ns)

    [result] = claim.status.allocation.devices.results
    assert result.driver == DRIVER
    gpu = devices[result.device]
    assert gpu.attributes["type"].string == "gpu"
    # The one GPU node the container has is the allocated GPU's: its minor is the one the
    # NVIDIA driver gives that PCI function.
    bus_id = gpu.attributes["resource.kubernetes.io/pciBusID"].string
    info = installed.host.layout.proc_root / "driver/nvidia/gpus" / bus_id / "information"
    found = re.search(r"^Device Minor:\s*(\d+)\s*$", info.read_text(), re.M)
    assert found is not None
    minor = int(found.group(1))
    seen = [line.split() for line in log.splitlines() if line.startswith("GPU ")]
    assert [s[1] for s in seen] == [f"/dev/nvidia{minor}"]
    assert (int(seen[0][2], 16), int(seen[0][3], 16)) == (195, minor)
