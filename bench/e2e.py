"""Pod creation to Running, installed the way users install: the image built from this checkout
and the chart on the harness's real kubelet + containerd node (the HGX node of
tests/integration/kubelethost.py), as tests/e2e/test_install.py does.

    python -m bench.e2e [--pods 10]     (root; one node cluster at a time on the machine)

For each of `--pods` pods, one after the other: a pod with the claim "1 GPU + 1 NIC on the same
pciRoot" (docs/examples/gpu-nic-pxb.yaml, a fresh claim each), and the same pod without a
claim. Measured from the create call to the pod's phase Running seen on a watch. Prints the
median and the spread of each and their difference. Goal: the claim adds under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch

from e2e.harness.controlplane import wait_for
from e2e.harness.helm import Chart, harness_values
from e2e.harness.images import TEST_IMAGE, fabricdra_image
from e2e.harness.nodecluster import NodeCluster
from tests.integration.kubelethost import DRIVER, build_host

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "gpu-nic-pxb.yaml"
NAMESPACE = "fabricdra-system"


def _pod(name: str, claim: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "c",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }
        ],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimName": claim}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
    return {"metadata": {"name": name}, "spec": spec}


def _time_to_running(api: client.ApiClient, ns: str, name: str, claim: str | None) -> float:
    core = client.CoreV1Api(api)
    if claim:
        body = yaml.safe_load(EXAMPLE.read_text())
        body["metadata"]["name"] = claim
        client.ResourceV1Api(api).create_namespaced_resource_claim(ns, body)
    t0 = time.perf_counter()
    created = core.create_namespaced_pod(ns, _pod(name, claim))
    w = watch.Watch()  # type: ignore[no-untyped-call]
    for event in w.stream(
        core.list_namespaced_pod,
        ns,
        field_selector=f"metadata.name={name}",
        resource_version=created.metadata.resource_version,
        timeout_seconds=120,
    ):
        if event["object"].status.phase == "Running":
            w.stop()  # type: ignore[no-untyped-call]
            elapsed = time.perf_counter() - t0
            break
    else:
        raise SystemExit(f"pod {ns}/{name} did not run within 120 s")
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}").items)
    if claim:
        client.ResourceV1Api(api).delete_namespaced_resource_claim(claim, ns)
    return elapsed


def _untainted(api: client.ApiClient, node: str) -> bool:
    slices = client.ResourceV1Api(api).list_resource_slice().items
    devices = [
        d
        for s in slices
        if s.spec.driver == DRIVER and s.spec.node_name == node
        for d in s.spec.devices or []
    ]
    return bool(devices) and not any(d.taints for d in devices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fabricdra-bench-e2e-") as tmp:
        base = Path(tmp)
        host = build_host(base / "hgx")
        t0 = time.perf_counter()
        archive, image = fabricdra_image(base / "image")
        print(f"image built in {time.perf_counter() - t0:.0f} s: {image}")
        with NodeCluster(base / "cluster") as cluster:
            cluster.import_image(archive)
            chart = Chart()
            values = harness_values(
                cluster,
                image,
                sysfs=host.root / "sys",
                dev=host.layout.dev_root,
                proc=host.layout.proc_root,
                nvml=host.nvml_snapshot,
            )
            t0 = time.perf_counter()
            chart.install(cluster.kubeconfig, NAMESPACE, values=values)
            with cluster.api_client() as api:
                wait_for(lambda: _untainted(api, cluster.node_name), timeout=120, what="devices")
                print(f"helm install to devices offered: {time.perf_counter() - t0:.1f} s")
                ns = f"bench-{uuid.uuid4().hex[:6]}"
                client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
                wait_for(
                    lambda: client.CoreV1Api(api).read_namespaced_service_account("default", ns)
                )
                plain, claimed = [], []
                for i in range(args.pods):
                    plain.append(_time_to_running(api, ns, f"plain-{i}", None))
                    claimed.append(_time_to_running(api, ns, f"claim-{i}", f"gpu-nic-{i}"))
            chart.uninstall(cluster.kubeconfig, NAMESPACE)
    p50, c50 = statistics.median(plain), statistics.median(claimed)
    print(f"pod create -> Running, {args.pods} pods each (one at a time):")
    print(
        f"  without a claim      : median {p50:.2f} s  (min {min(plain):.2f}, max {max(plain):.2f})"
    )
    print(
        f"  with 1 GPU + 1 NIC   : median {c50:.2f} s  (min {min(claimed):.2f}, "
        f"max {max(claimed):.2f})"
    )
    print(f"  the claim adds       : {c50 - p50:+.2f} s   (goal < 1 s)")


if __name__ == "__main__":
    main()
