"""fabricdra installed on the harness's node cluster the way users install it: the image built
from this checkout (deployments/container/build.sh), imported into the node's containerd, and the
chart installed unmodified with helm. The node is the 8-GPU HGX sample made the honest way
(tests/integration/kubelethost.py: kernel-shaped sysfs, recorded NVML answers, the driver's /proc
files, mknod'ed device nodes), which the chart's values point at.

Used by `e2e/cluster/up.sh --install`; tests/e2e/test_install.py and bench/e2e.py do the same
steps in-process.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.controlplane import wait_for
from e2e.harness.helm import Chart, harness_values
from e2e.harness.images import TEST_IMAGE, fabricdra_image

NAMESPACE = "fabricdra-system"
DRIVER = "devices.fabricdra.io"
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "gpu-nic-pxb.yaml"


def _say(message: str) -> None:
    print(f"[install {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr)


def offered_untainted(api: Any, node: str) -> list[Any] | None:
    """The node's devices.fabricdra.io devices once every one is offered without a taint."""
    from kubernetes import client

    slices = client.ResourceV1Api(api).list_resource_slice().items
    devices = [
        d
        for s in slices
        if s.spec.driver == DRIVER and s.spec.node_name == node
        for d in s.spec.devices or []
    ]
    return devices if devices and not any(d.taints for d in devices) else None


def install_sample(cluster: Any, workdir: Path) -> None:
    """Build and import the image, make the sample node's files under `workdir`, helm install,
    wait for the devices, then run the sample pod (claim gpu-nic-pxb) and print what it got."""
    from kubernetes import client

    # The test node builder lives with the tests (not type-checked: mypy covers the product
    # and e2e/), so it is imported by name.
    build_host = importlib.import_module("tests.integration.kubelethost").build_host
    start = time.monotonic()
    host = build_host(workdir / "node")
    _say("building the image from this checkout")
    archive, image = fabricdra_image(workdir / "image")
    cluster.import_image(archive)
    _say(f"helm install {image}")
    values = harness_values(
        cluster,
        image,
        sysfs=host.root / "sys",
        dev=host.layout.dev_root,
        proc=host.layout.proc_root,
        nvml=host.nvml_snapshot,
    )
    Chart().install(cluster.kubeconfig, NAMESPACE, values=values)
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        devices = wait_for(
            lambda: offered_untainted(api, cluster.node_name), timeout=120, what="devices"
        )
        _say(f"{len(devices)} devices offered on node {cluster.node_name}")
        claim = yaml.safe_load(EXAMPLE.read_text())
        client.ResourceV1Api(api).create_namespaced_resource_claim("default", claim)
        wait_for(lambda: core.read_namespaced_service_account("default", "default"))
        pod: Any = {
            "metadata": {"name": "fabricdra-sample"},
            "spec": {
                "resourceClaims": [{"name": "dev", "resourceClaimName": claim["metadata"]["name"]}],
                "containers": [
                    {
                        "name": "c",
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "echo NCCL_IB_HCA=$NCCL_IB_HCA; ls /dev /dev/infiniband; "
                            "exec sleep 86400",
                        ],
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
            },
        }
        core.create_namespaced_pod("default", pod)
        wait_for(
            lambda: core.read_namespaced_pod_log("fabricdra-sample", "default") or None,
            timeout=120,
            what="the sample pod's output",
        )
        log = core.read_namespaced_pod_log("fabricdra-sample", "default")
    _say(f"installed in {time.monotonic() - start:.0f} s; pod default/fabricdra-sample sees:")
    print(log.rstrip(), file=sys.stderr)
