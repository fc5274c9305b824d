"""`fabricdra fleet` on a 1,000-node simulated cluster, against a real kube-apiserver (started
here, stopped at exit).

Each simulated node publishes the slice the plugin would for an 8-GPU HGX node (8 GPUs, 8 RDMA
NICs), in fabric domains of 18 nodes; a third of the nodes carry an allocated 4-GPU + 4-NIC
claim, a tenth are held by a ComputeDomain, and every node has its NodeDevices record and a
Ready Node object. Prints, as JSON:

- objects: Nodes, slices, claims, NodeDevices, ComputeDomains created;
- fleet_s: wall time of `fabricdra fleet -o json` answering (listing the five kinds and
  computing the view), median and worst of `--repeat` runs, in-process;
- compute_s: the pure accounting alone (objects already in memory), median;
- cli_process_s: one run of the real `fabricdra fleet -o json` process, start-up included.

    python -m bench.fleet [--nodes 1000] [--repeat 5]

Goal: fleet_s under 2 s at 1,000 nodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import ControlPlane
from fabricdra.api.nodedevices import CRD as ND_CRD
from fabricdra.cli.fleet import render
from fabricdra.controller.fleet import fleet
from fabricdra.controller.fleetmetrics import read_fleet
from fabricdra.kube.rest import CLAIMS, COMPUTE_DOMAINS, NODE_DEVICES, NODES, SLICES, Kind, Rest

CRDS = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", False)
DRIVER = "devices.fabricdra.io"
ROOT = Path(__file__).resolve().parents[1]


def _node_slice(node: str, domain: str) -> dict[str, Any]:
    devices = []
    for i in range(8):
        devices.append(
            {
                "name": f"gpu-0000-{0x18 + i * 0x11:02x}-00-0",
                "attributes": {
                    "type": {"string": "gpu"},
                    "deviceClass": {"string": "gb200-186gb-nvl72"},
                    "fabricDomain": {"string": domain},
                    "uuid": {"string": f"GPU-{node}-{i}"},
                    "pciRoot": {"string": f"0000:{0x17 + i * 0x11:02x}:01.0"},
                },
                "capacity": {"memory": {"value": "186Gi"}},
            }
        )
        devices.append(
            {
                "name": f"rdma-0000-{0x19 + i * 0x11:02x}-00-0",
                "attributes": {
                    "type": {"string": "rdma"},
                    "rdmaMode": {"string": "exclusive"},
                    "linkVerdict": {"string": "OK"},
                    "rdmaDevice": {"string": f"mlx5_{i}"},
                    "pciRoot": {"string": f"0000:{0x17 + i * 0x11:02x}:01.0"},
                },
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _populate(cp: ControlPlane, nodes: int) -> dict[str, int]:
    rest = Rest(cp.api_client())
    rest.create(CRDS, ND_CRD.crd())
    from tests.integration.computedomain_helpers import install_crd

    install_crd(rest)
    cp.create_namespace("bench")
    names = [f"n{i:04d}" for i in range(nodes)]
    counts = {"nodes": 0, "slices": 0, "claims": 0, "nodeDevices": 0, "computeDomains": 0}

    def one(i: int) -> None:
        node, domain = names[i], f"nvlink-bench{i // 18:03d}-1"
        # A Ready Node (the status is kept on create): only a node that takes pods has room.
        rest.create(
            NODES,
            {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": node, "labels": {"fabricdra.io/fabric.domain": domain}},
             "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        )  # fmt: skip
        rest.create(SLICES, _node_slice(node, domain))
        rest.create(
            NODE_DEVICES,
            {"apiVersion": "fabricdra.io/v1alpha1", "kind": "NodeDevices",
             "metadata": {"name": node}, "spec": {"interfaces": [], "groups": []}},
        )  # fmt: skip
        if i % 3 == 0:
            claim = f"job-{i}"
            rest.create(
                CLAIMS,
                {"metadata": {"name": claim}, "spec": {"devices": {"requests": [
                    {"name": "r", "exactly": {"deviceClassName": "gpu.fabricdra.io",
                                              "count": 8}}]}}},
                "bench",
            )  # fmt: skip
            results = [
                {"request": "r", "driver": DRIVER, "pool": node, "device": d}
                for d in [f"gpu-0000-{0x18 + k * 0x11:02x}-00-0" for k in range(4)]
                + [f"rdma-0000-{0x19 + k * 0x11:02x}-00-0" for k in range(4)]
            ]
            rest.patch(
                CLAIMS, claim, {"status": {"allocation": {"devices": {"results": results}}}},
                "bench", sub="status",
            )  # fmt: skip
        if i % 10 == 0:
            cd = f"cd-{i}"
            rest.create(
                COMPUTE_DOMAINS,
                {"apiVersion": "fabricdra.io/v1beta1", "kind": "ComputeDomain",
                 "metadata": {"name": cd},
                 "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": cd}}}},
                "bench",
            )  # fmt: skip
            rest.patch(
                COMPUTE_DOMAINS, cd,
                {"status": {"nodes": [{"name": node, "index": 0, "fabricDomain": domain}],
                            "fabricDomain": domain}},
                "bench", sub="status",
            )  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(nodes)))
    counts["nodes"] = counts["slices"] = counts["nodeDevices"] = nodes
    counts["claims"] = len(range(0, nodes, 3))
    counts["computeDomains"] = len(range(0, nodes, 10))
    return counts


def run(nodes: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fabricdra-bench-") as tmp:
        cp = ControlPlane(Path(tmp) / "cp")
        cp.start()
        try:
            objects = _populate(cp, nodes)
            rest = Rest(cp.api_client())
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                view = read_fleet(rest)
                json.dumps(view.to_json())
                render(view)
                times.append(time.perf_counter() - start)
            raw = [
                rest.list(k).get("items", [])
                for k in (SLICES, CLAIMS, NODE_DEVICES, COMPUTE_DOMAINS, NODES)
            ]
            compute = []
            for _ in range(repeat):
                start = time.perf_counter()
                fleet(*raw)
                compute.append(time.perf_counter() - start)
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "fabricdra.cli", "fleet", "-o", "json",
                 "--kubeconfig", str(cp.kubeconfig)],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
            cli = time.perf_counter() - start
            domains = len(json.loads(done.stdout)["domains"])
        finally:
            cp.stop()
    return {
        "nodes": nodes,
        "objects": objects,
        "fabric_domains": domains,
        "fleet_s": {"median": round(statistics.median(times), 3), "max": round(max(times), 3)},
        "compute_s": round(statistics.median(compute), 3),
        "cli_process_s": round(cli, 3),
        "goal_s": 2.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(run(args.nodes, args.repeat), indent=2))


if __name__ == "__main__":
    main()
