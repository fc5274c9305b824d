"""The chart on a real GPU node (issue 19): the node agent reaches the GPUs' device nodes, its
containers start with host /dev mounted, only the driver's `usr` tree is mounted, the node pods
go to GPU/RDMA nodes only, least privilege for the controller, CRDs that survive, and value
combinations that are either valid or refused. Rendered by the real helm (build.sh --helm)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.errors import HarnessError
from e2e.harness.helm import CHART_DIR, Chart, one
from fabricdra.controller import rbac

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


def _node_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "DaemonSet", "fabricdra-node")["spec"]["template"]["spec"]
    return spec


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name)


def _rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if v} for r in role["rules"]]


# -- point 2: NVML can open the GPUs ---------------------------------------------------------


def test_devices_container_may_open_gpu_device_nodes_only_when_it_offers_gpus(
    chart: Chart,
) -> None:
    """NVML opens /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidiaN: an unprivileged
    container's device cgroup refuses that (EPERM). Without GPUs the agent opens no device
    node, so it stays unprivileged with no capability."""
    devices = _container(_node_pod(chart.template()), "devices")
    assert devices["securityContext"]["privileged"] is True
    assert "allowPrivilegeEscalation" not in devices["securityContext"]
    rdma_only = _container(_node_pod(chart.template({"gpus": {"enabled": False}})), "devices")
    ctx = rdma_only["securityContext"]
    assert "privileged" not in ctx
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}


# -- point 3: host /dev read-only at /dev ----------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [{}, {"gpus": {"enabled": False}, "computeDomains": {"enabled": False}}],
    ids=["default", "beside-nvidia"],
)
def test_no_container_writes_its_termination_message_into_dev(
    chart: Chart, values: dict[str, Any]
) -> None:
    """Kubernetes' default terminationMessagePath is /dev/termination-log: where /dev is the
    host's, read-only, runc cannot make that mountpoint and the container never starts (and
    where it is writable, the file would land in the host's /dev)."""
    pod = _node_pod(chart.template(values))
    for c in pod["containers"]:
        dev_mounts = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev"]
        assert dev_mounts, c["name"]  # the case at hand: host /dev at /dev
        path = c.get("terminationMessagePath", "/dev/termination-log")
        assert not path.startswith("/dev/"), c["name"]


# -- point 4: the driver root: tests/integration/test_chart_driver_root.py (issue 30 point 3) ------


# -- point 5: placement ----------------------------------------------------------------------


def test_node_pods_go_to_gpu_or_rdma_nodes_never_control_planes(chart: Chart) -> None:
    pod = _node_pod(chart.template())
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = []
    for t in terms:
        exprs = {e["key"]: e for e in t["matchExpressions"]}
        assert exprs["node-role.kubernetes.io/control-plane"]["operator"] == "DoesNotExist"
        vendor = [e for k, e in exprs.items() if k.startswith("feature.node.kubernetes.io/")]
        assert len(vendor) == 1
        assert vendor[0]["operator"] == "In"
        assert vendor[0]["values"] == ["true"]
        keys.append(vendor[0]["key"])
    # NFD's PCI vendor labels: NVIDIA GPUs (10de), NVIDIA/Mellanox NICs (15b3), AMD GPUs (1002);
    # the AMD GPU Operator's rule label; NFD's rdma.capable for every other RDMA NIC (Broadcom,
    # Intel, AWS EFA): the project's AMD and EFA kinds and non-Mellanox NICs get a node pod.
    assert keys == [
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/pci-15b3.present",
        "feature.node.kubernetes.io/pci-1002.present",
        "feature.node.kubernetes.io/amd-gpu",
        "feature.node.kubernetes.io/rdma.capable",
    ]
    # No label rule: only the GPU Operator's driver-upgrade eviction rule (GPUs on), or nothing.
    everywhere = _node_pod(chart.template({"node": {"deviceNodeLabels": []}}))["affinity"]
    terms = everywhere["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [[e["key"] for e in t["matchExpressions"]] for t in terms["nodeSelectorTerms"]] == [
        ["nvidia.com/gpu.deploy.client"]
    ]
    no_gpus = {"node": {"deviceNodeLabels": []}, "gpus": {"enabled": False}}
    assert "affinity" not in _node_pod(chart.template(no_gpus))
    own = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert _node_pod(chart.template({"node": {"affinity": own}}))["affinity"] == own


def test_controller_and_cleanup_job_have_tolerations_and_a_priority_class(chart: Chart) -> None:
    docs = chart.template()
    controller = one(docs, "Deployment", "fabricdra-controller")["spec"]["template"]["spec"]
    job = one(docs, "Job", "fabricdra-cleanup")["spec"]["template"]["spec"]
    for pod in (controller, job):
        assert pod["priorityClassName"] == "system-cluster-critical"
        assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}.items() <= (
            pod["tolerations"][0].items()
        )
    values = {
        "controller": {"priorityClassName": "ops", "tolerations": []},
        "cleanup": {"priorityClassName": "ops"},
    }
    docs = chart.template(values)
    controller = one(docs, "Deployment", "fabricdra-controller")["spec"]["template"]["spec"]
    assert controller["priorityClassName"] == "ops"
    assert "tolerations" not in controller
    job = one(docs, "Job", "fabricdra-cleanup")["spec"]["template"]["spec"]
    assert job["priorityClassName"] == "ops"


def test_a_namespace_the_chart_creates_admits_privileged_pods(chart: Chart) -> None:
    assert not [d for d in chart.template() if d["kind"] == "Namespace"]
    docs = chart.template({"namespace": {"create": True}}, namespace="gpu-ops")
    ns = one(docs, "Namespace", "gpu-ops")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # Helm keeps its release record in it: uninstall must not delete it under itself.
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


# -- point 7: the controller's namespace permissions -----------------------------------------


def test_controller_daemonset_lease_and_namespace_rights_are_a_role_in_its_namespace(
    chart: Chart,
) -> None:
    docs = chart.template(namespace="gpu-ops")
    cluster = _rules(one(docs, "ClusterRole", "fabricdra-controller"))
    assert cluster == rbac.CONTROLLER
    for r in cluster:
        assert not {"daemonsets", "namespaces", "leases"} & set(r["resources"]), r
    role = one(docs, "Role", "fabricdra-controller")
    assert role["metadata"]["namespace"] == "gpu-ops"
    assert _rules(role) == rbac.CONTROLLER_NAMESPACED
    binding = one(docs, "RoleBinding", "fabricdra-controller")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "fabricdra-controller",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fabricdra-controller", "namespace": "gpu-ops"}
    ]


def test_node_label_policy_also_guards_annotations_and_finalizers(chart: Chart) -> None:
    policy = one(chart.template(), "ValidatingAdmissionPolicy", "fabricdra-node-labels")
    rule = policy["spec"]["validations"][1]["expression"]
    # unchanged, but for the removal of a served re-verification request (issue 18)
    assert "variables.oldAnnotations[k] == variables.newAnnotations[k]" in rule
    assert "k == 'fabricdra.io/reverify'" in rule
    assert "variables.newFinalizers == variables.oldFinalizers" in rule


# -- point 8: CRDs survive -------------------------------------------------------------------


def test_crds_are_kept_by_uninstall_and_by_an_upgrade_that_drops_them(chart: Chart) -> None:
    crds = [d for d in chart.template() if d["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 2
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        # The rest of the object is api/crds' own (parsed and written back, not edited).
        source = yaml.safe_load(
            (CHART_DIR / "files" / "crds" / f"{crd['metadata']['name']}.yaml").read_text()
        )
        assert crd["spec"] == source["spec"]
    for crd in chart.template({"crds": {"keep": False}}):
        if crd["kind"] == "CustomResourceDefinition":
            assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})


# -- point 9: value combinations -------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "min_available", "pdb"),
    [(1, 1, False), (2, 1, True), (2, 2, False), (3, 2, True)],
)
def test_the_controller_pdb_never_blocks_a_drain(
    chart: Chart, replicas: int, min_available: int, pdb: bool
) -> None:
    values = {
        "controller": {"replicas": replicas, "podDisruptionBudget": {"minAvailable": min_available}}
    }
    budgets = [d for d in chart.template(values) if d["kind"] == "PodDisruptionBudget"]
    assert bool(budgets) == pdb
    for b in budgets:
        assert b["spec"]["minAvailable"] < replicas


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"node": {"maxSurge": 0, "maxUnavailable": 0}}, "/node/maxUnavailable"),
        ({"node": {"maxSurge": "0%", "maxUnavailable": "0"}}, "/node/maxUnavailable"),
        ({"toolkitCdiDirs": ["/etc/cdi", "/etc/cdi"]}, "/toolkitCdiDirs"),
        ({"dashboards": {"label": "grafana dashboard"}}, "/dashboards/label"),
    ],
)
def test_combinations_that_render_a_broken_object_are_refused_naming_the_key(
    chart: Chart, values: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(HarnessError, match=re.escape(complaint)):
        chart.template(values)


def test_the_refused_combinations_next_to_valid_ones(chart: Chart) -> None:
    """The rules above refuse only the broken combination."""
    ds = one(
        chart.template({"node": {"maxSurge": 0, "maxUnavailable": 1}}),
        "DaemonSet",
        "fabricdra-node",
    )
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    docs = chart.template({"dashboards": {"label": "grafana.io/dashboard"}})
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert all(m["metadata"]["labels"]["grafana.io/dashboard"] == "1" for m in maps)


def test_global_values_are_accepted_and_the_chart_works_as_a_subchart(
    chart: Chart, tmp_path: Path
) -> None:
    """Helm hands every subchart the parent's `global` values."""
    chart.template({"global": {"imageRegistry": "registry.example"}})
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\nkubeVersion: '>=1.34.0-0'\n"
    )
    # An umbrella chart answers the subchart's device plugin question under its name.
    (parent / "values.yaml").write_text(
        "global:\n  imageRegistry: registry.example\n"
        "fabricdra:\n  devicePlugins:\n    absent: true\n"
    )
    shutil.copytree(CHART_DIR, parent / "charts" / "fabricdra")
    out = chart.run(
        "template", "platform", str(parent), "--namespace=gpu-ops", "--kube-version=v1.36.0"
    )
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert one(docs, "DaemonSet", "fabricdra-node")["metadata"]["namespace"] == "gpu-ops"


# -- point 10: liveness, and helm template without --kube-version ----------------------------


def test_compute_domain_plugin_has_a_liveness_probe_on_its_own_socket(chart: Chart) -> None:
    cd = _container(_node_pod(chart.template()), "compute-domain")
    probe = cd["livenessProbe"]
    command = probe["exec"]["command"][2]
    assert "FABRICDRA_POD_UID" in command
    assert "channel_ready_future" in command
    assert probe["timeoutSeconds"] > 5  # above the handshake's own 5 s


def test_helm_template_needs_no_kube_version(chart: Chart) -> None:
    """The helm build.sh builds defaults to the Kubernetes version of its own client-go (as
    helm's release builds do), not 1.20, which the chart's kubeVersion refuses."""
    out = chart.run("template", "fabricdra", str(CHART_DIR), "--set=devicePlugins.absent=true")
    assert "kind: DaemonSet" in out


def test_a_helm_built_without_the_version_stamp_is_built_again(tmp_path: Path) -> None:
    """The cache may hold a helm build.sh made before it stamped the default version: the
    harness must not take it (binaries.ensure runs build.sh --helm again)."""
    from e2e.harness import binaries

    helm = tmp_path / "helm"
    helm.write_text("#!/bin/sh\n")
    helm.chmod(0o755)
    assert not binaries._present(tmp_path, binaries.HELM)
    (tmp_path / binaries.STAMPS["helm"]).write_text("v1.36.0\n")
    assert binaries._present(tmp_path, binaries.HELM)
    bash = shutil.which("bash")
    assert bash
    subprocess.run([bash, "-n", str(binaries.BUILD_SCRIPT)], check=True)
