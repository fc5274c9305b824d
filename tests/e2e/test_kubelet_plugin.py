"""`fabricdra kubelet-plugin` against a real kubelet and containerd: the plugin registers, the
scheduler allocates a GPU and an RDMA NIC of a DGX H100 node to a claim, kubelet prepares
it, containerd injects the CDI spec, and the pod sees exactly its device nodes, NCCL_IB_HCA
and, read-only, the NCCL topology NCCL_TOPO_FILE names (the node is a DGX H100, whose bridges
show their link files). Deleting the pod unprepares the claim (its CDI spec goes away)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import wait_for
from e2e.harness.existing import ExistingCluster
from e2e.harness.images import TEST_IMAGE
from e2e.harness.nodecluster import NodeCluster
from fabricdra.kubeletplugin.kinds import accelerator, rdma
from tests.integration.kubelethost import build_host

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "devices.fabricdra.io"


def test_pod_gets_its_gpu_and_nic(
    node_cluster: NodeCluster | ExistingCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if not node_cluster.is_local:
        pytest.skip("the plugin runs as a process on this machine: needs the local node cluster")
    base = tmp_path_factory.mktemp("e2e-plugin")
    host = build_host(base / "host", dgx=True)
    ns = f"kp-{uuid.uuid4().hex[:8]}"
    node = node_cluster.node_name
    argv = [
        sys.executable,
        "-m",
        "fabricdra.cli",
        "kubelet-plugin",
        "--node-name",
        node,
        "--kubeconfig",
        str(node_cluster.kubeconfig),
        "--sysfs-root",
        str(host.root / "sys"),
        "--nvml-snapshot",
        str(host.nvml_snapshot),
        "--dev-root",
        str(host.layout.dev_root),
        "--proc-root",
        str(host.layout.proc_root),
        "--cdi-dir",
        str(node_cluster.cdi_dir),
        "--toolkit-cdi-dirs",
        "",
        "--plugin-dir",
        str(node_cluster.plugins_dir / DRIVER),
        "--registry-dir",
        str(node_cluster.plugins_registry_dir),
        "--state-dir",
        str(base / "state"),
        "--metrics-port",
        "0",
        "--discovery-interval",
        "5",
        "--verify-active=off",  # the made-up node has no bandwidth tools
    ]
    log = (base / "plugin.log").open("w")
    made: list[tuple[str, str]] = []  # (kind, name) of the API objects this test created
    plugin = subprocess.Popen(argv, stderr=log, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        with node_cluster.api_client() as api:
            resource = client.ResourceV1Api(api)
            core = client.CoreV1Api(api)
            # What the deployment installs: the NodeDevices CRD and the device classes.
            crd = yaml.safe_load((ROOT / "api/crds/nodedevices.fabricdra.io.yaml").read_text())
            installs = [(client.ApiextensionsV1Api(api).create_custom_resource_definition, crd)]
            for name in ("gpu.yaml", "rdma.yaml"):
                body = yaml.safe_load((ROOT / "api" / "deviceclasses" / name).read_text())
                installs.append((resource.create_device_class, body))
            for create, body in installs:
                try:
                    create(body)
                    made.append((body["kind"], body["metadata"]["name"]))
                except ApiException as e:
                    if e.status != 409:
                        raise
            wait_for(
                lambda: resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items,
                timeout=60,
                what="the plugin's ResourceSlices",
            )
            core.create_namespace({"metadata": {"name": ns}})
            wait_for(
                lambda: core.read_namespaced_service_account("default", ns),
                what="the namespace's default ServiceAccount",
            )
            resource.create_namespaced_resource_claim(
                ns,
                {
                    "metadata": {"name": "devs"},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": "gpu.fabricdra.io"}},
                                {
                                    "name": "nic",
                                    "exactly": {"deviceClassName": "rdma.fabricdra.io"},
                                },
                            ],
                            "constraints": [
                                {
                                    "requests": ["gpu", "nic"],
                                    "matchAttribute": "devices.fabricdra.io/pciRoot",
                                }
                            ],
                        }
                    },
                },
            )
            core.create_namespaced_pod(
                ns,
                {
                    "metadata": {"name": "user"},
                    "spec": {
                        "restartPolicy": "Never",
                        "resourceClaims": [{"name": "devs", "resourceClaimName": "devs"}],
                        "containers": [
                            {
                                "name": "c",
                                "image": TEST_IMAGE,
                                "imagePullPolicy": "Never",
                                "command": [
                                    "sh",
                                    "-c",
                                    "ls /dev/infiniband; ls /dev | grep nvidia; "
                                    "echo HCA=$NCCL_IB_HCA; "
                                    # the topology's tokens, and whether the mount is read-only
                                    "tr ' ' '\\n' < $NCCL_TOPO_FILE; "
                                    "touch $NCCL_TOPO_FILE 2>/dev/null || echo TOPO-READ-ONLY; "
                                    "sleep 5",
                                ],  # hold the claim
                                "resources": {"claims": [{"name": "devs"}]},
                            }
                        ],
                    },
                },
            )
            # the allocation is read while the pod holds it (it is released when the pod ends)
            claim = wait_for(
                lambda: (
                    (c := resource.read_namespaced_resource_claim("devs", ns)).status
                    and c.status.allocation
                    and c
                ),
                timeout=120,
                what="the scheduler to allocate the claim",
            )
            uid = claim.metadata.uid
            results = claim.status.allocation.devices.results
            spec = node_cluster.cdi_dir / f"k8s.devices.fabricdra.io-device_{uid}.json"
            phase = wait_for(
                lambda: (
                    (p := core.read_namespaced_pod("user", ns).status.phase)
                    in ("Succeeded", "Failed")
                    and p
                ),
                timeout=180,
                what="the pod to finish",
            )
            logs = core.read_namespaced_pod_log("user", ns, container="c")
            assert phase == "Succeeded", logs
            core.delete_namespaced_pod("user", ns)
            wait_for(lambda: not spec.exists(), timeout=120, what="unprepare to remove the spec")
            core.delete_namespace(ns)
    finally:
        plugin.send_signal(signal.SIGTERM)
        try:
            assert plugin.wait(timeout=30) == 0
        finally:
            if plugin.poll() is None:
                plugin.kill()
                plugin.wait()
            log.close()
            # What this test made, it removes: a DeviceClass left here, not Helm's, would stop
            # the next test's `helm install` of the chart (it cannot adopt an object it did not
            # make). What existed before (the chart's, kept CRDs) is not touched.
            with node_cluster.api_client() as api:
                for kind, name in reversed(made):
                    if kind == "DeviceClass":
                        client.ResourceV1Api(api).delete_device_class(name)
                    else:
                        client.ApiextensionsV1Api(api).delete_custom_resource_definition(name)

    lines = logs.split()
    nic = next(r.device for r in results if r.request == "nic")
    gpu = next(r.device for r in results if r.request == "gpu")
    inventory = host.inventory()
    nic_device = inventory.get(nic)
    gpu_device = inventory.get(gpu)
    assert nic_device is not None
    assert gpu_device is not None
    nic_ep, gpu_acc = rdma.payload_of(nic_device).endpoint, accelerator.payload_of(gpu_device)
    # the pair shares its outermost bridge, and the container got exactly that NIC's node
    assert nic_ep.topology.pciRootId == gpu_acc.accelerator.topology.pciRootId
    assert nic_ep.verbsDevice in lines
    assert "rdma_cm" in lines
    assert len([x for x in lines if x.startswith("uverbs")]) == 1
    assert f"HCA=={nic_ep.rdmaDevice}" in lines  # "=": exact names
    assert "nvidiactl" in lines
    # NCCL's topology of exactly this GPU and this NIC (and its measured rail), read-only
    assert "TOPO-READ-ONLY" in lines
    assert f'busid="{gpu_acc.accelerator.pciBusId}"' in lines
    assert len([x for x in lines if x.startswith("<gpu")]) == 1
    assert [x for x in lines if x.startswith("name=")] == [f'name="{nic_ep.rdmaDevice}"']
    assert len([x for x in lines if x.startswith("nvidia") and x[6:].isdigit()]) == 1
