"""The chart's scale-out parts (issue 27 points 2-4), rendered by the real helm: the
controller's --scale-out-tiers and --topology-file (the topology ConfigMap mounted), one
ibnetdiscover CronJob per fabric with its least-privilege Role (off by default), and the node
agent's label policy leaving the tier labels to the controller."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.harness.helm import Chart, one

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


def _controller(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deploy = one(docs, "Deployment", "fabricdra-controller")
    return dict(deploy["spec"]["template"]["spec"])


def test_default_no_tiers_and_no_dump_jobs(chart: Chart) -> None:
    docs = chart.template()
    args = _controller(docs)["containers"][0]["args"]
    assert "--scale-out-tiers=false" in args
    assert not any(a.startswith("--topology-file") for a in args)
    assert not [d for d in docs if d["kind"] == "CronJob"]


def test_tiers_with_a_topology_configmap(chart: Chart) -> None:
    docs = chart.template(
        {"scaleOut": {"tiers": True, "topologyConfigMap": "cabling", "topologyKey": "topo.conf"}}
    )
    pod = _controller(docs)
    args = pod["containers"][0]["args"]
    assert "--scale-out-tiers=true" in args
    assert "--topology-file=/etc/fabricdra/topology/topo.conf" in args
    assert pod["volumes"] == [{"name": "topology", "configMap": {"name": "cabling"}}]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "topology", "mountPath": "/etc/fabricdra/topology", "readOnly": True}
    ]


def test_one_ibnetdiscover_cronjob_per_fabric(chart: Chart) -> None:
    fabrics = [
        {"name": "compute", "nodeSelector": {"fabric/dump": "compute"}, "ca": "mlx5_0", "port": 1},
        {"name": "storage"},
    ]
    docs = chart.template(
        {"scaleOut": {"fabricDump": {"fabrics": fabrics, "image": "rdma-tools:1"}}},
        namespace="gpu-ops",
    )
    job = one(docs, "CronJob", "fabricdra-ibnetdiscover-compute")
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["image"] == "rdma-tools:1"
    assert init["command"][-1] == "ibnetdiscover -C mlx5_0 -P 1 > /dump/ibnetdiscover.txt"
    assert pod["nodeSelector"] == {"fabric/dump": "compute"}
    store = pod["containers"][0]
    assert store["args"] == [
        "fabric-dump",
        "--fabric=compute",
        "--file=/dump/ibnetdiscover.txt",
        "--namespace=gpu-ops",
    ]
    assert store["securityContext"]["runAsNonRoot"] is True
    other = one(docs, "CronJob", "fabricdra-ibnetdiscover-storage")
    init = other["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][-1] == "ibnetdiscover > /dump/ibnetdiscover.txt"
    role = one(docs, "Role", "fabricdra-fabric-dump")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["ibnetdiscover-compute", "ibnetdiscover-storage"],
            "verbs": ["get", "update"],
        },
    ]


def test_fabrics_without_an_image_are_refused_naming_the_key(chart: Chart) -> None:
    out = chart.render({"scaleOut": {"fabricDump": {"fabrics": [{"name": "a"}]}}}, check=False)
    assert "scaleOut.fabricDump.image" in out
    out = chart.render(
        {"scaleOut": {"fabricDump": {"fabrics": [{"name": "Bad_Name"}], "image": "x"}}},
        check=False,
    )
    assert "name" in out
    assert "pattern" in out or "does not match" in out


def test_node_agent_may_not_write_tier_labels(chart: Chart) -> None:
    policy = one(chart.template(), "ValidatingAdmissionPolicy", "fabricdra-node-labels")
    rule = policy["spec"]["validations"][1]["expression"]
    assert "!k.startsWith('fabricdra.io/network.')" in rule
