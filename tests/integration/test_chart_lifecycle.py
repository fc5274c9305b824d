"""The chart's lifecycle values (issue 30 points 2, 4, 8, 9), rendered by the real helm: what
the API server would reject is refused by the schema, a first install says what it offers,
upgrades are versioned, and the values users expect of a chart exist."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.errors import HarnessError
from e2e.harness.helm import CHART_DIR, PREVIOUS_CHART, Chart, chart_at, one

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


def _of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _images(docs: list[dict[str, Any]]) -> set[str]:
    """Every container image of every pod template, and the controller's --image argument."""
    found: set[str] = set()
    for d in docs:
        spec = d.get("spec", {})
        pod = spec.get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            found.add(c["image"])
            found.update(a.split("=", 1)[1] for a in c.get("args", []) if a.startswith("--image="))
    return found


# -- point 2: versions, digests, upgrades ---------------------------------------------------


def _package_version() -> str:
    found = re.search(r'^version = "(.*)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert found is not None
    return found.group(1)


def test_every_stated_version_is_the_package_version() -> None:
    """One source of truth, pyproject.toml's version: the chart's version and appVersion, and
    every user agent and documented image tag that names a version. Bumped past 0.1.0, which
    stood for hundreds of changes while IfNotPresent kept serving cached images."""
    version = _package_version()
    assert version != "0.1.0"
    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["version"] == meta["appVersion"] == version
    stated = re.compile(r"(fabricdra-[a-z-]+/|ghcr\.io/fabricdra/fabricdra:)(\d+\.\d+\.\d+)")
    roots = [
        "cli",
        "controller",
        "kubeletplugin",
        "kube",
        "api",
        "docs",
        "deployments",
        "README.md",
    ]
    wrong = []
    for root in roots:
        path = REPO / root
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            if f.suffix not in {".py", ".md", ""} and f.name != "Containerfile":
                continue
            for m in stated.finditer(f.read_text(errors="replace")):
                if m.group(2) != version:
                    wrong.append(f"{f.relative_to(REPO)}: {m.group(0)}")
    assert wrong == [], f"not {version}: {wrong}"


def test_image_digest_pins_every_pod_to_it(chart: Chart) -> None:
    plain = _images(chart.template())
    assert plain == {f"ghcr.io/fabricdra/fabricdra:{_package_version()}"}
    pinned = _images(chart.template({"image": {"digest": DIGEST}}))
    assert pinned == {f"ghcr.io/fabricdra/fabricdra@{DIGEST}"}
    cleanup = _images(chart.template({"image": {"digest": DIGEST}}))
    assert cleanup == pinned
    with pytest.raises(HarnessError, match="/image/digest"):
        chart.template({"image": {"digest": "abc"}})


def test_docs_upgrade_with_reset_then_reuse_values() -> None:
    """`--reuse-values` keeps the old release's values and none of the new chart's defaults: the
    next chart that adds a value fails on it (nil pointer). The documented command resets to the
    new defaults first."""
    install = (REPO / "docs" / "install.md").read_text()
    # Each `helm upgrade` command with its continuation lines (a trailing backslash).
    commands = re.findall(r"helm upgrade (?:[^\n`]*\\\n)*[^\n`]*", install)
    assert commands
    assert all("--reuse-values" not in c for c in commands), commands
    assert any("--reset-then-reuse-values" in c for c in commands)
    assert "## What an upgrade changes" in install


def test_the_new_templates_render_with_the_previous_charts_values(
    chart: Chart, tmp_path: Path
) -> None:
    """What `helm upgrade --reuse-values` from 0.1.0 renders: the new templates with only the
    values the previous chart stored (no `image.digest`, `nameOverride`, `serviceAccount`, ...).
    New values are read so that a missing one is their default, never a nil pointer; the
    documented `--reset-then-reuse-values` needs no such care."""
    old = chart_at(PREVIOUS_CHART, tmp_path)
    assert yaml.safe_load((old / "Chart.yaml").read_text())["version"] == "0.1.0"
    old_values = yaml.safe_load((old / "values.yaml").read_text())
    assert "digest" not in old_values["image"]  # the previous chart lacked the new values
    reused = tmp_path / "reused"
    shutil.copytree(CHART_DIR, reused)
    (reused / "values.yaml").write_text(yaml.safe_dump(old_values))
    docs = Chart(reused).template()
    assert _images(docs) == {f"ghcr.io/fabricdra/fabricdra:{_package_version()}"}
    one(docs, "DaemonSet", "fabricdra-node")
    one(docs, "Deployment", "fabricdra-controller")


# -- point 8: rollout, PDB, namespace, paths -----------------------------------------------


@pytest.mark.parametrize(
    ("node", "complaint"),
    [
        # The API server's DaemonSet validation: exactly one of the two non-zero, each a
        # non-negative integer or a percent no more than 100%.
        ({"maxSurge": 1, "maxUnavailable": 1}, "/node"),
        ({"maxSurge": "10%", "maxUnavailable": "5%"}, "/node"),
        ({"maxSurge": 0, "maxUnavailable": 0}, "/node"),
        ({"maxSurge": "150%", "maxUnavailable": 0}, "/node/maxSurge"),
        ({"maxSurge": 0, "maxUnavailable": "101%"}, "/node/maxUnavailable"),
        ({"maxSurge": -1, "maxUnavailable": 0}, "/node/maxSurge"),
        ({"maxSurge": 0, "maxUnavailable": -1}, "/node/maxUnavailable"),
        ({"maxSurge": "abc", "maxUnavailable": 0}, "/node/maxSurge"),
        ({"maxSurge": "5", "maxUnavailable": 0}, "/node/maxSurge"),
        ({"maxSurge": 0, "maxUnavailable": "1.5%"}, "/node/maxUnavailable"),
    ],
)
def test_schema_refuses_rollouts_the_api_server_rejects(
    chart: Chart, node: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(HarnessError, match=re.escape(complaint)):
        chart.template({"node": node})


@pytest.mark.parametrize(
    "node",
    [
        {"maxSurge": "10%", "maxUnavailable": 0},
        {"maxSurge": 25, "maxUnavailable": "0%"},
        {"maxSurge": 0, "maxUnavailable": 1},
        {"maxSurge": "0%", "maxUnavailable": "100%"},
    ],
)
def test_schema_accepts_the_rollouts_the_api_server_does(
    chart: Chart, node: dict[str, Any]
) -> None:
    ds = one(chart.template({"node": node}), "DaemonSet", "fabricdra-node")
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == node


def test_default_rollout_surges_a_tenth_of_the_nodes(chart: Chart) -> None:
    """One node at a time is hours at 5,000 nodes; a surge never leaves a node without its
    plugins, and a broken new pod never gets Ready, so the rollout stops at the first tenth."""
    ds = one(chart.template(), "DaemonSet", "fabricdra-node")
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {
        "maxSurge": "10%",
        "maxUnavailable": 0,
    }


@pytest.mark.parametrize(
    ("replicas", "min_available", "rendered"),
    [
        (1, 1, False),
        (1, "50%", False),  # ceil(1 x 50%) = 1: every eviction refused
        (1, "1%", False),
        (2, "100%", False),
        (3, "67%", False),  # ceil(3 x 67%) = 3
        (2, "50%", True),
        (3, "66%", True),  # ceil(3 x 66%) = 2
        (2, 1, True),
        (1, 0, True),
        (1, "0%", True),
    ],
)
def test_a_pdb_is_rendered_only_where_it_lets_a_pod_go(
    chart: Chart, replicas: int, min_available: int | str, rendered: bool
) -> None:
    docs = chart.template(
        {
            "controller": {
                "replicas": replicas,
                "podDisruptionBudget": {"minAvailable": min_available},
            }
        }
    )
    assert bool(_of_kind(docs, "PodDisruptionBudget")) == rendered


def test_schema_refuses_a_pdb_that_is_no_count_or_percent(chart: Chart) -> None:
    for bad in ("abc", "150%", -1):
        with pytest.raises(HarnessError, match="minAvailable"):
            chart.template({"controller": {"podDisruptionBudget": {"minAvailable": bad}}})


@pytest.mark.parametrize("namespace", ["default", "kube-system", "kube-public", "kube-node-lease"])
def test_namespace_create_refuses_to_relabel_a_shared_namespace(
    chart: Chart, namespace: str
) -> None:
    """`namespace.create` labels the namespace privileged: in `default` every user's pod would
    then be admitted privileged."""
    out = chart.render({"namespace": {"create": True}}, namespace=namespace, check=False)
    assert "namespace.create" in out
    assert namespace in out
    assert "kind: Namespace" not in out
    # Installing there without it is the user's call (and labels nothing).
    plain = chart.template(namespace=namespace)
    assert not _of_kind(plain, "Namespace")


def test_toolkit_cdi_dirs_are_normalised(chart: Chart) -> None:
    """`/var/run/cdi/` is the cdiDir: mounted again read-only it would shadow the folder the
    agent writes its specs to."""
    docs = chart.template({"toolkitCdiDirs": ["/etc/cdi/", "/var/run/cdi/", "/etc/cdi"]})
    pod = one(docs, "DaemonSet", "fabricdra-node")["spec"]["template"]["spec"]
    mounts = [m for c in pod["containers"] for m in c["volumeMounts"]]
    paths = [m["mountPath"] for m in mounts]
    assert all(not p.endswith("/") for p in paths), paths
    assert [m for m in mounts if m["mountPath"] == "/var/run/cdi" and m.get("readOnly")] == []
    assert paths.count("/etc/cdi") == 1
    devices = next(c for c in pod["containers"] if c["name"] == "devices")
    assert "--toolkit-cdi-dirs=/etc/cdi,/var/run/cdi" in devices["args"]
    host = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert all(not p.endswith("/") for p in host), host


# -- point 9: what users expect of a chart ---------------------------------------------------


def test_name_overrides(chart: Chart) -> None:
    """`nameOverride` is the app.kubernetes.io/name label and the names' stem;
    `fullnameOverride` the stem alone. The ServiceAccounts, RBAC, admission policies,
    DeviceClasses and CRDs keep their names (policies and the controller name them; one
    driver per cluster)."""
    named = chart.template({"nameOverride": "gpu-dra"})
    one(named, "DaemonSet", "gpu-dra-node")
    dep = one(named, "Deployment", "gpu-dra-controller")
    assert dep["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-dra"
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-dra"
    full = chart.template({"fullnameOverride": "acme-dra", "nameOverride": "ignored"})
    one(full, "DaemonSet", "acme-dra-node")
    one(full, "Deployment", "acme-dra-controller")
    one(full, "PodDisruptionBudget", "acme-dra-controller")
    assert {s["metadata"]["name"] for s in _of_kind(full, "Service")} == {
        "acme-dra-node-metrics",
        "acme-dra-controller-metrics",
    }
    one(full, "ServiceAccount", "fabricdra-node")
    # Selectors stay on the release and component: a DaemonSet's selector is immutable.
    assert (
        dep["spec"]["selector"]
        == one(full, "Deployment", "acme-dra-controller")["spec"]["selector"]
    )
    with pytest.raises(HarnessError, match="fullnameOverride"):
        chart.template({"fullnameOverride": "Not_A_Name"})


def test_pod_annotations_labels_and_service_account_annotations(chart: Chart) -> None:
    docs = chart.template(
        {
            "podAnnotations": {"example.com/scrape": "yes"},
            "podLabels": {"team": "gpu"},
            "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:x"}},
        }
    )
    pods = [
        one(docs, "DaemonSet", "fabricdra-node")["spec"]["template"],
        one(docs, "Deployment", "fabricdra-controller")["spec"]["template"],
    ]
    for pod in pods:
        assert pod["metadata"]["annotations"]["example.com/scrape"] == "yes"
        assert pod["metadata"]["labels"]["team"] == "gpu"
        # The chart's own labels (the selectors') cannot be overridden.
        assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "fabricdra"
    for sa in _of_kind(docs, "ServiceAccount"):
        if sa["metadata"]["name"] == "fabricdra-cleanup":
            continue
        assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:x"}
    with pytest.raises(HarnessError, match="podLabels"):
        chart.template({"podLabels": {"app.kubernetes.io/instance": "other"}})


def test_service_monitor_is_optional_and_scrapes_the_metrics_services(chart: Chart) -> None:
    assert not _of_kind(chart.template(), "ServiceMonitor")
    docs = chart.template(
        {"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s",
                                        "labels": {"release": "kube-prometheus-stack"}}}}
    )  # fmt: skip
    monitor = one(docs, "ServiceMonitor", "fabricdra")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "15s"}]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["fabricdra-system"]}
    selector = monitor["spec"]["selector"]
    for svc in _of_kind(docs, "Service"):
        labels = svc["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector["matchLabels"].items())
        (expr,) = selector["matchExpressions"]
        assert labels[expr["key"]] in expr["values"]
    with pytest.raises(HarnessError, match="serviceMonitor"):
        chart.template({"metrics": {"services": False, "serviceMonitor": {"enabled": True}}})


def test_network_policy_admits_only_the_metrics_ports(chart: Chart) -> None:
    assert not _of_kind(chart.template(), "NetworkPolicy")
    peers = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    docs = chart.template({"networkPolicy": {"enabled": True, "metricsFrom": peers}})
    by_name = {p["metadata"]["name"]: p for p in _of_kind(docs, "NetworkPolicy")}
    node, controller = by_name["fabricdra-node"], by_name["fabricdra-controller"]
    assert node["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "node"
    assert node["spec"]["policyTypes"] == ["Ingress"]
    assert node["spec"]["ingress"] == [
        {"from": peers, "ports": [{"port": 9478, "protocol": "TCP"}]}
    ]
    assert controller["spec"]["ingress"] == [
        {"from": peers, "ports": [{"port": 8080, "protocol": "TCP"}]}
    ]
    # The fabric check's pods (launcher and workers: SSH, then MPI on ports of its choosing)
    # take connections from each other only.
    check = by_name["fabricdra-fabric-check"]
    run = {"key": "fabricdra.io/fabric-check-run", "operator": "Exists"}
    assert check["spec"]["podSelector"] == {"matchExpressions": [run]}
    assert check["spec"]["ingress"] == [{"from": [{"podSelector": {"matchExpressions": [run]}}]}]


# -- point 4: a first install that offers devices, and says what it offers --------------------


def _agent_args(docs: list[dict[str, Any]]) -> list[str]:
    ds = one(docs, "DaemonSet", "fabricdra-node")
    return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])


def _controller_args(docs: list[dict[str, Any]]) -> list[str]:
    dep = one(docs, "Deployment", "fabricdra-controller")
    return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


@pytest.mark.parametrize(
    ("verification", "probes", "check"),
    [
        # The default: no image, so no probe could run; off, the devices are offered.
        ({}, "off", "false"),
        ({"image": "reg/verify:1"}, "on", "true"),
        ({"activeProbes": True}, "on", "true"),  # said outright: devices stay unverified
        ({"activeProbes": False, "image": "reg/verify:1"}, "off", "false"),
        ({"fabricCheck": {"required": True}}, "off", "true"),
    ],
)
def test_active_probes_default_to_whether_they_can_run(
    chart: Chart, verification: dict[str, Any], probes: str, check: str
) -> None:
    docs = chart.template({"verification": verification})
    assert f"--verify-active={probes}" in _agent_args(docs)
    assert f"--fabric-check={check}" in _controller_args(docs)


def test_notes_say_what_the_install_offers_and_why_not(chart: Chart) -> None:
    plain = chart.notes()
    assert "Active probes OFF (activeProbes=auto and no verification.image)" in plain
    assert "GPUs (DeviceClasses gpu.fabricdra.io" in plain
    assert "Multi-node NVLink check OFF" in plain
    assert "--reset-then-reuse-values" in plain
    assert "WARNING" not in plain
    stuck = chart.notes({"verification": {"activeProbes": True}})
    assert "WARNING: verification.image is empty" in stuck
    assert "fabricdra.io/unverified" in stuck
    assert "no gang is placed" in stuck
    measured = chart.notes({"verification": {"image": "reg/verify:1"}})
    assert "Active probes ON" in measured
    assert "They run in pods from reg/verify:1" in measured
    assert "WARNING" not in measured
    beside = chart.notes({"gpus": {"enabled": False}, "computeDomains": {"enabled": False}})
    assert "No GPUs (gpus.enabled=false" in beside
    assert "No ComputeDomains" in beside


# -- point 6: computeDomains.enabled true -> false --------------------------------------------


def test_compute_domains_off_runs_a_pre_upgrade_release_of_what_the_controller_made(
    chart: Chart,
) -> None:
    """An upgrade turning ComputeDomains off would orphan the IMEX DaemonSets, claim templates,
    slices and labels the controller made: a pre-upgrade hook Job releases them first, while
    the compute-domain plugin still runs, with the uninstall hook's account and rules."""
    on = chart.template()
    assert [j["metadata"]["name"] for j in _of_kind(on, "Job")] == ["fabricdra-cleanup"]
    assert (
        one(on, "ClusterRole", "fabricdra-cleanup")["metadata"]["annotations"]["helm.sh/hook"]
        == "pre-delete"
    )
    off = chart.template({"computeDomains": {"enabled": False}})
    job = one(off, "Job", "fabricdra-release-domains")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--scope=compute-domains" in args
    uninstall = one(off, "Job", "fabricdra-cleanup")
    assert uninstall["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert not [a for a in uninstall["spec"]["template"]["spec"]["containers"][0]["args"]
                if a.startswith("--scope")]  # fmt: skip
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        hook = one(off, kind, "fabricdra-cleanup")["metadata"]["annotations"]["helm.sh/hook"]
        assert hook == "pre-delete,pre-upgrade", kind
