"""The Helm chart, rendered by the real helm: lint, shapes per values, and what it must not drift
from (api/ CRDs and DeviceClasses, the controller's RBAC rules, the package version)."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.errors import HarnessError
from e2e.harness.helm import CHART_DIR, Chart, one
from fabricdra.controller import rbac

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart()


def _kinds(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d["metadata"]["name"])
    return out


def test_chart_lints_clean(chart: Chart) -> None:
    assert "0 chart(s) failed" in chart.lint()


def test_chart_crds_are_exact_copies_of_api() -> None:
    # Refresh with charts/fabricdra/sync-api.sh after changing api/. (The DeviceClasses are
    # generated from their table: tests/unit/test_deviceclass_table.py.)
    kind = "crds"
    source = sorted(p.name for p in (REPO / "api" / kind).glob("*.yaml"))
    copy = sorted(p.name for p in (CHART_DIR / "files" / kind).glob("*.yaml"))
    assert copy == source, "run charts/fabricdra/sync-api.sh"
    _, mismatch, errors = filecmp.cmpfiles(
        REPO / "api" / kind, CHART_DIR / "files" / kind, source, shallow=False
    )
    assert mismatch == errors == [], "run charts/fabricdra/sync-api.sh"


def test_default_render_has_every_component(chart: Chart) -> None:
    docs = chart.template()
    kinds = _kinds(docs)
    assert sorted(kinds["CustomResourceDefinition"]) == [
        "computedomains.fabricdra.io",
        "nodedevices.fabricdra.io",
    ]
    assert len(kinds["DeviceClass"]) == 5
    ds = one(docs, "DaemonSet", "fabricdra-node")
    containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    assert sorted(containers) == ["compute-domain", "devices"]
    for c in containers.values():
        assert "startupProbe" in c
        assert "readinessProbe" in c
    dep = one(docs, "Deployment", "fabricdra-controller")
    assert dep["spec"]["replicas"] == 2
    # No surge pod: on a small or host-network cluster it could never be placed.
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    assert "--leader-elect=true" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert one(docs, "PodDisruptionBudget", "fabricdra-controller")["spec"]["minAvailable"] == 1
    assert len(kinds["ValidatingAdmissionPolicy"]) == len(kinds["ValidatingAdmissionPolicyBinding"])


def test_imex_daemon_image_is_this_image_at_the_chart_version(chart: Chart) -> None:
    version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"]
    dep = one(chart.template(), "Deployment", "fabricdra-controller")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    image = f"ghcr.io/fabricdra/fabricdra:{version}"
    assert c["image"] == image
    assert f"--image={image}" in c["args"]


def test_chart_version_is_the_package_version() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    found = re.search(r'^version = "(.*)"$', pyproject, re.M)
    assert found is not None
    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["version"] == meta["appVersion"] == found.group(1)


def test_beside_nvidias_driver_gpus_off_offers_only_nics_and_domains(chart: Chart) -> None:
    docs = chart.template({"gpus": {"enabled": False}})
    assert sorted(_kinds(docs)["DeviceClass"]) == [
        "rdma-shared.fabricdra.io",
        "rdma-vf.fabricdra.io",
        "rdma.fabricdra.io",
    ]
    ds = one(docs, "DaemonSet", "fabricdra-node")
    devices = ds["spec"]["template"]["spec"]["containers"][0]
    assert "--gpus=false" in devices["args"]
    assert all(m["name"] != "driver-root" for m in devices["volumeMounts"])


def test_efa_is_off_by_default_and_its_value_reaches_the_agent_and_the_classes(
    chart: Chart,
) -> None:
    def rendered(values: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
        docs = chart.template(values or {})
        ds = one(docs, "DaemonSet", "fabricdra-node")
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        return args, _kinds(docs)["DeviceClass"]

    args, classes = rendered()
    assert not [a for a in args if a.startswith("--efa")]
    assert "efa.fabricdra.io" not in classes
    args, classes = rendered({"efa": {"enabled": True}})
    assert "--efa" in args
    assert "--efa-device-rdma" not in args
    assert "efa.fabricdra.io" in classes
    args, _ = rendered({"efa": {"enabled": True, "deviceRdma": True}})
    assert "--efa-device-rdma" in args
    # the RDMA switch does not carry EFA's class, nor EFA's the RDMA classes
    _, classes = rendered({"efa": {"enabled": True}, "rdma": {"enabled": False}})
    assert "efa.fabricdra.io" in classes
    assert "rdma.fabricdra.io" not in classes


def test_gaudi_is_off_by_default_and_its_value_reaches_the_agent_and_its_class(
    chart: Chart,
) -> None:
    for values, on in (({}, False), ({"gaudi": {"enabled": True}}, True)):
        docs = chart.template(values)
        ds = one(docs, "DaemonSet", "fabricdra-node")
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert ("--gaudi" in args) is on
        assert ("gaudi.fabricdra.io" in _kinds(docs)["DeviceClass"]) is on


def test_compute_domains_off_drops_controller_and_plugin(chart: Chart) -> None:
    docs = chart.template({"computeDomains": {"enabled": False}})
    kinds = _kinds(docs)
    assert "Deployment" not in kinds
    assert kinds["CustomResourceDefinition"] == ["nodedevices.fabricdra.io"]
    ds = one(docs, "DaemonSet", "fabricdra-node")
    assert [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]] == ["devices"]


def test_rdma_mode_and_paths_reach_the_agent(chart: Chart) -> None:
    docs = chart.template(
        {
            "rdma": {"mode": "shared", "sharedHolders": 8},
            "kubeletRootDir": "/data/kubelet",
            "nvmlSnapshot": "/etc/nvml.json",
        }
    )
    ds = one(docs, "DaemonSet", "fabricdra-node")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--rdma-mode=shared" in args
    assert "--rdma-shared-holders=8" in args
    assert "--plugin-dir=/data/kubelet/plugins/devices.fabricdra.io" in args
    assert "--nvml-snapshot=/etc/fabricdra/nvml.json" in args


def test_the_verification_profile_reaches_the_agent_inline(chart: Chart) -> None:
    def args(values: dict[str, Any]) -> list[str]:
        ds = one(chart.template(values), "DaemonSet", "fabricdra-node")
        return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])

    assert not [a for a in args({}) if a.startswith("--verify-expect")]
    profile = {"name": "XE9680", "gpus": {"count": 8, "deviceClass": "h100-80gb-sxm"}}
    [arg] = [a for a in args({"verification": {"expect": profile}}) if "verify-expect" in a]
    assert arg.startswith("--verify-expect-json=")
    assert json.loads(arg.split("=", 1)[1]) == profile


def test_the_verification_image_gives_the_agent_a_pod_on_its_node_and_nothing_more(
    chart: Chart,
) -> None:
    """verification.image: the agent runs the active probes in a pod from it; RBAC for pods
    in the chart's namespace only; the admission policy binds it to its own node and image."""
    image = "registry.example/fabricdra-verify:1"

    def args(docs: list[dict[str, Any]]) -> list[str]:
        ds = one(docs, "DaemonSet", "fabricdra-node")
        return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])

    plain = chart.template({})
    # activeProbes `auto`: off without an image (test_chart_lifecycle.py), on with one.
    assert "--verify-active=off" in args(plain)
    assert not [a for a in args(plain) if a.startswith("--verify-image")]
    assert "fabricdra-node-verification" not in _kinds(plain).get("Role", [])
    docs = chart.template({"verification": {"image": image, "runtimeClassName": "nvidia"}})
    assert "--verify-active=on" in args(docs)
    assert f"--verify-image={image}" in args(docs)
    assert "--verify-runtime-class=nvidia" in args(docs)
    assert [a for a in args(docs) if a.startswith("--verify-namespace=")]
    role = one(docs, "Role", "fabricdra-node-verification")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    binding = one(docs, "RoleBinding", "fabricdra-node-verification")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert "ClusterRole" not in json.dumps(binding["roleRef"])
    policy = one(docs, "ValidatingAdmissionPolicy", "fabricdra-node-verification-pods")
    rule = policy["spec"]["validations"][-1]["expression"]
    assert "object.spec.nodeName == variables.nodeName" in rule
    assert f"c.image == '{image}'" in rule
    one(docs, "ValidatingAdmissionPolicyBinding", "fabricdra-node-verification-pods")
    off = chart.template({"verification": {"activeProbes": False}})
    assert "--verify-active=off" in args(off)


def test_dynamic_mig_value_reaches_the_agent(chart: Chart) -> None:
    """Issue 20 point 2: off by default (no flag at all), `dynamicMIG: true` passes it."""

    def args(values: dict[str, Any] | None = None) -> list[str]:
        ds = one(chart.template(values), "DaemonSet", "fabricdra-node")
        return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--dynamic-mig" not in args()
    assert "--dynamic-mig" in args({"dynamicMIG": True})


def test_gpu_shares_value_reaches_the_agent(chart: Chart) -> None:
    """Issue 32 point 6: no flag by default (GPUs not shared), `gpus.shares: N` passes it, and
    helm refuses 1 (a GPU shared by one claim is not shared) naming the key."""

    def args(values: dict[str, Any] | None = None) -> list[str]:
        ds = one(chart.template(values), "DaemonSet", "fabricdra-node")
        return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])

    assert not [a for a in args() if a.startswith("--gpu-shares")]
    assert "--gpu-shares=8" in args({"gpus": {"shares": 8}})
    with pytest.raises(HarnessError, match=re.escape("gpus/shares")):
        chart.template({"gpus": {"shares": 1}})


@pytest.mark.parametrize(
    ("value", "flag"),
    [
        ("deviceMetadata", "--device-metadata"),  # issue 32 point 5 (KEP-5304)
        ("listTypeAttributes", "--list-type-attributes"),  # point 2 (alpha gate in 1.36)
        ("evictOnFatal", "--evict-on-fatal"),  # point 3
    ],
)
def test_opt_in_values_reach_the_agent(chart: Chart, value: str, flag: str) -> None:
    """Off by default (no flag at all); `<value>: true` passes the flag."""

    def args(values: dict[str, Any] | None = None) -> list[str]:
        ds = one(chart.template(values), "DaemonSet", "fabricdra-node")
        return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])

    assert flag not in args()
    assert flag in args({value: True})


def test_nccl_topo_file_is_on_by_default_and_can_be_turned_off(chart: Chart) -> None:
    """Issue 27 point 6: `ncclTopoFile` (default true) reaches the agent either way."""

    def args(values: dict[str, Any] | None = None) -> list[str]:
        ds = one(chart.template(values), "DaemonSet", "fabricdra-node")
        return list(ds["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--nccl-topo-file=true" in args()
    assert "--nccl-topo-file=false" in args({"ncclTopoFile": False})


def test_the_node_agent_may_read_pods(chart: Chart) -> None:
    """Issue 32 point 4: prepare reads an RDMA claim's pods for their PodGroup."""
    role = one(chart.template(), "ClusterRole", "fabricdra-node-devices")
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]} in role["rules"]


def test_rdma_overrides_and_vfs_reach_the_agent(chart: Chart) -> None:
    """Issue 20 point 4: per-NIC modes and the VF switch (the node label needs no value)."""
    args = one(chart.template(), "DaemonSet", "fabricdra-node")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--rdma-vfs=true" in args
    assert not [a for a in args if a.startswith("--rdma-override")]
    docs = chart.template(
        {
            "rdma": {
                "mode": "off",
                "vfs": False,
                "overrides": [
                    {"match": "0000:1c:00.0", "mode": "shared"},
                    {"match": "ens1f1", "mode": "off"},
                ],
            }
        }
    )
    args = one(docs, "DaemonSet", "fabricdra-node")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--rdma-mode=off" in args
    assert "--rdma-vfs=false" in args
    assert [a for a in args if a.startswith("--rdma-override")] == [
        "--rdma-override=0000:1c:00.0=shared",
        "--rdma-override=ens1f1=off",
    ]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"verification": {"expect": {"gpu": {}}}}, "/verification/expect"),
        ({"rdma": {"mode": "bogus"}}, "/rdma/mode"),
        ({"rdma": {"overrides": [{"match": "ens1f0", "mode": "vf"}]}}, "/rdma/overrides/0/mode"),
        ({"rdma": {"overrides": [{"mode": "off"}]}}, "/rdma/overrides/0"),
        ({"image": {"tag": "latest"}}, "/image/tag"),
        ({"kubeletRootDir": "relative"}, "/kubeletRootDir"),
        ({"nosuch": 1}, "nosuch"),
    ],
)
def test_schema_refuses_bad_values_naming_them(
    chart: Chart, values: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(HarnessError, match=re.escape(complaint)):
        chart.template(values)


def _rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if v} for r in role["rules"]]


def test_compute_domain_rbac_is_the_controllers_own_rule_set(chart: Chart) -> None:
    docs = chart.template()
    assert _rules(one(docs, "ClusterRole", "fabricdra-controller")) == rbac.CONTROLLER
    assert _rules(one(docs, "ClusterRole", "fabricdra-node-compute-domain")) == rbac.NODE_PLUGIN
    assert _rules(one(docs, "ClusterRole", "fabricdra-imex-daemon")) == rbac.IMEX_DAEMON
    # The controller names the IMEX DaemonSets' service account; the chart must create it.
    from fabricdra.controller.objects import DaemonSettings

    assert DaemonSettings().service_account in _kinds(docs)["ServiceAccount"]


def test_no_cluster_role_grants_leases(chart: Chart) -> None:
    """Issue 19: a node's identity must not patch Leases in kube-system (node heartbeats, other
    controllers' leader locks). Every Lease permission is a Role in the release namespace."""
    docs = chart.template(namespace="gpu-ops")
    for doc in _kinds_docs(docs, "ClusterRole"):
        for rule in doc["rules"]:
            assert "leases" not in rule.get("resources", []), doc["metadata"]["name"]
    ns = "gpu-ops"
    for name, rules in [
        ("fabricdra-controller", rbac.CONTROLLER_NAMESPACED),
        ("fabricdra-node-compute-domain-leases", rbac.NODE_PLUGIN_NAMESPACED),
        ("fabricdra-imex-daemon-leases", rbac.IMEX_DAEMON_NAMESPACED),
    ]:
        role = one(docs, "Role", name)
        assert role["metadata"]["namespace"] == ns
        assert _rules(role) == rules
        binding = one(docs, "RoleBinding", name)
        assert binding["metadata"]["namespace"] == ns
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": name,
        }


def _kinds_docs(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d and d.get("kind") == kind]


def test_dashboards_ship_as_sidecar_configmaps_when_present(chart: Chart) -> None:
    dashboards = sorted((CHART_DIR / "dashboards").glob("*.json"))
    maps = _kinds(chart.template()).get("ConfigMap", [])
    assert maps == [f"fabricdra-dashboard-{p.stem}" for p in dashboards]


def test_device_nodes_are_seen_at_their_host_path(chart: Chart) -> None:
    # CDI specs name the host's device node paths: the agent must see them where the host has
    # them, or the runtime is handed a path that exists only inside the agent's container.
    docs = chart.template({"devRoot": "/srv/dev"})
    pod = one(docs, "DaemonSet", "fabricdra-node")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    for c in pod["containers"]:
        assert "--dev-root=/srv/dev" in c["args"]
        mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
        assert mounts["/srv/dev"] == "/srv/dev"
        for host in ("/var/lib/kubelet/plugins_registry", "/var/run/cdi"):
            assert mounts[host] == host  # sockets and CDI specs too


def test_nvml_comes_from_the_driver_root_without_shadowing_the_images_libraries(
    chart: Chart,
) -> None:
    docs = chart.template()
    devices = one(docs, "DaemonSet", "fabricdra-node")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in devices["env"]}
    folders = env["LD_LIBRARY_PATH"].split(":")
    first_host = next(i for i, f in enumerate(folders) if f.startswith("/driver-root"))
    # One image index serves x86_64 nodes and Grace (aarch64) GB200/GB300 trays, so the
    # folders of both Debian/Ubuntu multiarch triplets are listed: the image's own before any
    # of the host's, and the host's NVML folder of each (the loader skips a library built for
    # the other machine, so a folder of the other triplet is harmless).
    for triplet in ("x86_64-linux-gnu", "aarch64-linux-gnu"):
        assert f"/usr/lib/{triplet}" in folders[:first_host], triplet
        assert f"/driver-root/usr/lib/{triplet}" in folders[first_host:], triplet
    assert "/driver-root/usr/lib64" in folders  # RHEL-family hosts, either machine


def test_node_plugins_run_as_root_and_the_controller_does_not(chart: Chart) -> None:
    # The image's default user is 65532: a node plugin left to it cannot bind its socket in
    # the kubelet's root-owned plugin folder.
    docs = chart.template()
    node = one(docs, "DaemonSet", "fabricdra-node")["spec"]["template"]["spec"]
    for c in node["containers"]:
        assert c["securityContext"]["runAsUser"] == 0, c["name"]
    controller = one(docs, "Deployment", "fabricdra-controller")["spec"]["template"]["spec"]
    assert controller["securityContext"]["runAsNonRoot"] is True


def test_uninstall_cleanup_is_a_pre_delete_hook_with_its_own_least_privilege(
    chart: Chart,
) -> None:
    docs = chart.template(namespace="gpu-ops")
    hooks = [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert sorted(f"{d['kind']}/{d['metadata']['name']}" for d in hooks) == [
        "ClusterRole/fabricdra-cleanup",
        "ClusterRoleBinding/fabricdra-cleanup",
        "Job/fabricdra-cleanup",
        "Role/fabricdra-cleanup",
        "RoleBinding/fabricdra-cleanup",
        "ServiceAccount/fabricdra-cleanup",
    ]
    for d in hooks:
        notes = d["metadata"]["annotations"]
        assert notes["helm.sh/hook"] == "pre-delete"
        assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        # Its account and rights exist before the Job starts.
        assert int(notes["helm.sh/hook-weight"]) < 0 or d["kind"] == "Job"
    assert _rules(one(docs, "ClusterRole", "fabricdra-cleanup")) == rbac.CLEANUP
    assert _rules(one(docs, "Role", "fabricdra-cleanup")) == rbac.CLEANUP_NAMESPACED
    job = one(docs, "Job", "fabricdra-cleanup")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "fabricdra-cleanup"
    args = pod["containers"][0]["args"]
    assert args[1:4] == ["cleanup", "--namespace=gpu-ops", "--release=fabricdra"]
    # The Job waits for the components' pods to go: its own must not be one of them.
    from fabricdra.controller.cleanup import COMPONENTS

    component = job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    assert component not in COMPONENTS.strip("()").split(",")
    for kind, name in (("DaemonSet", "fabricdra-node"), ("Deployment", "fabricdra-controller")):
        labels = one(docs, kind, name)["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] in COMPONENTS.strip("()").split(",")


def test_cleanup_off_renders_no_hook(chart: Chart) -> None:
    docs = chart.template({"cleanup": {"enabled": False}})
    assert not [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]


def test_extra_env_reaches_the_imex_daemons_the_controller_runs(chart: Chart) -> None:
    # Where pods cannot reach the `kubernetes` Service, the IMEX daemons need the same address
    # as every other fabricdra container, or they never report.
    from fabricdra.api.computedomain import ComputeDomain
    from fabricdra.cli.controller import _daemon_env
    from fabricdra.controller.objects import DaemonSettings, daemon_set

    env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ]
    dep = one(chart.template({"extraEnv": env}), "Deployment", "fabricdra-controller")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    (flag,) = [a for a in args if a.startswith("--daemon-env=")]
    domain = ComputeDomain.model_validate(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "u1", "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}},
        }
    )
    ds = daemon_set(domain, DaemonSettings(extra_env=_daemon_env(flag.split("=", 1)[1])))
    daemon_env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
    assert daemon_env[-2:] == env
    assert daemon_env[0]["name"] == "NODE_NAME"  # the daemon's own come first
    plain = one(chart.template(), "Deployment", "fabricdra-controller")
    assert not [
        a
        for a in plain["spec"]["template"]["spec"]["containers"][0]["args"]
        if a.startswith("--daemon-env")
    ]


def test_node_pods_roll_with_a_surge_and_per_pod_sockets(chart: Chart) -> None:
    """A rolling update starts the new node pod beside the old one (kubelet 1.33+ serves both:
    each pod's sockets carry its UID), so each container gets its pod's UID, and readiness is
    this pod's own socket, not any socket of the driver."""
    for values in ({}, {"node": {"hostNetwork": True}}):
        ds = one(chart.template(values=values), "DaemonSet", "fabricdra-node")
        assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {
            "maxSurge": "10%",
            "maxUnavailable": 0,
        }
        pod = ds["spec"]["template"]["spec"]
        for c in pod["containers"]:
            uid = [e for e in c["env"] if e["name"] == "FABRICDRA_POD_UID"]
            assert uid == [
                {
                    "name": "FABRICDRA_POD_UID",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                }
            ]
            assert "FABRICDRA_POD_UID" in c["readinessProbe"]["exec"]["command"][2]
        devices = next(c for c in pod["containers"] if c["name"] == "devices")
        # In the host network a declared port is a hostPort: the surge pod could not be placed.
        assert ("ports" in devices) == (not values)


def test_the_readiness_probe_finds_this_pods_socket_only(chart: Chart) -> None:
    """The probe runs under the image's /bin/sh (dash): ready on this pod's DRA socket, whole
    or with the UID cut to fit (docs/kubelet-plugin.md), never on another pod's socket or on a
    regular file of that name."""
    root = Path(tempfile.mkdtemp(prefix="fdra-probe-"))
    try:
        ds = one(chart.template({"kubeletRootDir": str(root)}), "DaemonSet", "fabricdra-node")
        uid = "348fda06-4e9c-44a3-b4a9-454e6c1d2f00"
        for c in ds["spec"]["template"]["spec"]["containers"]:
            driver = {
                "devices": "devices.fabricdra.io",
                "compute-domain": "compute-domain.fabricdra.io",
            }[c["name"]]
            folder = root / "plugins" / driver
            folder.mkdir(parents=True)
            command = c["readinessProbe"]["exec"]["command"]

            def ready(command: list[str] = command) -> bool:
                env = {"FABRICDRA_POD_UID": uid, "PATH": "/usr/bin:/bin"}
                return subprocess.run(command, env=env, check=False).returncode == 0

            assert not ready()
            with socket.socket(socket.AF_UNIX) as other:
                other.bind(str(folder / "dra-61c0a8f2-0d3e-4b9a.sock"))
                assert not ready()
                (folder / f"dra-{uid[:20]}.sock").write_text("not a socket")
                assert not ready()
                (folder / f"dra-{uid[:20]}.sock").unlink()
                for name in (f"dra-{uid[:20]}.sock", f"dra-{uid}.sock"):
                    with socket.socket(socket.AF_UNIX) as own:
                        own.bind(str(folder / name))
                        assert ready(), name
                    (folder / name).unlink()
    finally:
        shutil.rmtree(root)


def _extended_names(docs: list[dict[str, Any]]) -> dict[str, str | None]:
    return {
        d["metadata"]["name"]: d["spec"].get("extendedResourceName")
        for d in docs
        if d["kind"] == "DeviceClass"
    }


def test_device_classes_name_the_extended_resources_on_136(chart: Chart) -> None:
    assert _extended_names(chart.template(kube_version="v1.36.0")) == {
        "gpu.fabricdra.io": "fabricdra.io/gpu",
        "mig.fabricdra.io": None,
        "rdma-shared.fabricdra.io": None,
        "rdma-vf.fabricdra.io": None,
        "rdma.fabricdra.io": "fabricdra.io/rdma",
    }


def test_default_device_classes_are_the_api_sources(chart: Chart) -> None:
    # The chart rebuilds each class from its copy; with default values nothing may differ
    # from what `kubectl apply -f api/deviceclasses/` creates.
    # EFA's and Gaudi's classes are rendered only with their values on (off by default).
    docs = chart.template({"efa": {"enabled": True}, "gaudi": {"enabled": True}})
    rendered = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DeviceClass"}
    for path in sorted((REPO / "api" / "deviceclasses").glob("*.yaml")):
        source = yaml.safe_load(path.read_text())
        assert rendered[source["metadata"]["name"]] == source, path.name


@pytest.mark.parametrize("kube_version", ["v1.34.0", "v1.35.4"])
def test_below_136_the_device_classes_leave_the_extended_resource_out(
    chart: Chart, kube_version: str
) -> None:
    # ComputeDomains need 1.36 (templates/version-floor.yaml): off, as an install there must.
    values = {"computeDomains": {"enabled": False}}
    names = _extended_names(chart.template(values, kube_version=kube_version))
    assert len(names) == 5
    assert set(names.values()) == {None}


def test_extended_resources_off_names_none(chart: Chart) -> None:
    names = _extended_names(chart.template({"extendedResources": {"enabled": False}}))
    assert len(names) == 5
    assert set(names.values()) == {None}


def test_gpus_can_take_over_nvidia_gpu_and_rdma_follows_the_shared_mode(chart: Chart) -> None:
    values = {
        "extendedResources": {"enabled": True, "gpu": "nvidia.com/gpu", "rdma": "example.com/hca"},
        "rdma": {"mode": "shared"},
    }
    names = _extended_names(chart.template(values))
    assert names["gpu.fabricdra.io"] == "nvidia.com/gpu"
    # Only the class of the mode in use may hold the name: one class per name in a cluster.
    assert names["rdma-shared.fabricdra.io"] == "example.com/hca"
    assert names["rdma.fabricdra.io"] is None
    no_rdma = {"extendedResources": {"enabled": True, "gpu": "fabricdra.io/gpu", "rdma": ""}}
    assert _extended_names(chart.template(no_rdma))["rdma.fabricdra.io"] is None


def test_one_extended_resource_name_is_never_given_to_two_classes(chart: Chart) -> None:
    same = {"extendedResources": {"enabled": True, "gpu": "x.io/dev", "rdma": "x.io/dev"}}
    with pytest.raises(HarnessError, match="one DeviceClass per extended resource name"):
        chart.template(same)


@pytest.mark.parametrize("name", ["gpu", "kubernetes.io/gpu", "Fabric.io/gpu", "a/b/c"])
def test_schema_refuses_names_that_are_no_extended_resource(chart: Chart, name: str) -> None:
    with pytest.raises(HarnessError, match=re.escape("/extendedResources/gpu")):
        chart.template({"extendedResources": {"enabled": True, "gpu": name, "rdma": ""}})


def test_the_chart_gates_a_class_by_its_table_field(tmp_path: Path) -> None:
    # The gate is the row's `enabledBy` (files/deviceclasses.yaml, generated from the table in
    # api/), not the class's file name: move the MIG class to the RDMA switch and it follows it.
    copy = tmp_path / "fabricdra"
    shutil.copytree(CHART_DIR, copy)
    rows_file = copy / "files" / "deviceclasses.yaml"
    rows = yaml.safe_load(rows_file.read_text())
    for row in rows:
        if row["manifest"]["metadata"]["name"] == "mig.fabricdra.io":
            row["enabledBy"] = "rdma.enabled"
    rows_file.write_text(yaml.safe_dump(rows))
    moved = Chart(copy)
    gpus_off = _kinds(moved.template({"gpus": {"enabled": False}}))["DeviceClass"]
    assert "mig.fabricdra.io" in gpus_off
    assert "gpu.fabricdra.io" not in gpus_off
    rdma_off = _kinds(moved.template({"rdma": {"enabled": False}}))["DeviceClass"]
    assert sorted(rdma_off) == ["gpu.fabricdra.io"]


def test_gang_timeout_is_passed_and_stays_below_the_schedulers_binding_wait(chart: Chart) -> None:
    """Issue 22: a gang released by kube-scheduler's binding timeout (600 s) first is released
    pod by pod, never as a whole: the chart's default is below it and the schema refuses 600."""
    docs = chart.template()
    deployment = one(docs, "Deployment", "fabricdra-controller")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--gang-timeout-seconds=300" in args
    docs = chart.template({"controller": {"gangTimeoutSeconds": 599}})
    deployment = one(docs, "Deployment", "fabricdra-controller")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--gang-timeout-seconds=599" in args
    for bad in (600, 900, 0):
        with pytest.raises(HarnessError, match="gangTimeoutSeconds"):
            chart.template({"controller": {"gangTimeoutSeconds": bad}})


def test_the_fabric_check_is_on_exactly_with_the_active_probes(chart: Chart) -> None:
    """Issue 18 point 4: the multi-node NVLink check is required when the per-node active
    probes are, with the same opt-out; it runs from the verification image."""

    def args(values: dict[str, Any]) -> list[str]:
        deploy = one(chart.template(values), "Deployment", "fabricdra-controller")
        return list(deploy["spec"]["template"]["spec"]["containers"][0]["args"])

    # activeProbes `auto` (the default) without an image: no probes, no check.
    assert [a for a in args({}) if a.startswith("--fabric-check")] == ["--fabric-check=false"]
    plain = args({"verification": {"activeProbes": True}})
    assert "--fabric-check=true" in plain
    assert "--fabric-check-timeout-seconds=600" in plain
    assert "--fabric-check-concurrency=16" in plain
    assert "--fabric-check-imex-mode=managed" in plain
    assert not [a for a in plain if a.startswith(("--fabric-check-image", "--fabric-check-runt"))]
    given = args(
        {
            "verification": {"image": "reg/verify:1", "runtimeClassName": "nvidia",
                             "fabricCheck": {"timeoutSeconds": 900, "concurrency": 4}},
            "computeDomains": {"hostImex": {"enabled": True}},
        }
    )  # fmt: skip
    for arg in ("--fabric-check-image=reg/verify:1", "--fabric-check-runtime-class=nvidia",
                "--fabric-check-timeout-seconds=900", "--fabric-check-imex-mode=host",
                "--fabric-check-concurrency=4"):  # fmt: skip
        assert arg in given
    off = args({"verification": {"activeProbes": False, "image": "reg/verify:1"}})
    assert [a for a in off if a.startswith("--fabric-check")] == ["--fabric-check=false"]
    # Beside NVIDIA's GPU driver the GPUs are not ours: no node agent of ours verifies them, so
    # a required check could never pass and host-mode ComputeDomains would never place.
    beside = args({"gpus": {"enabled": False}, "verification": {"image": "reg/verify:1"}})
    assert [a for a in beside if a.startswith("--fabric-check")] == ["--fabric-check=false"]
    # ... unless said outright, either way
    forced = {"gpus": {"enabled": False}, "verification": {"fabricCheck": {"required": True}}}
    assert "--fabric-check=true" in args(forced)
    skipped = args({"verification": {"fabricCheck": {"required": False}}})
    assert [a for a in skipped if a.startswith("--fabric-check")] == ["--fabric-check=false"]
    with pytest.raises(Exception, match="required"):
        args({"verification": {"fabricCheck": {"required": "sometimes"}}})
    with pytest.raises(Exception, match="concurrency"):
        args({"verification": {"fabricCheck": {"concurrency": 0}}})


def test_scale_out_values_reach_the_agent(chart: Chart) -> None:
    """Issue 27: the LLDP source follows the host network unless set (outside it the pod sees
    none of the node's NICs), raw LLDP adds CAP_NET_RAW to the unprivileged container, and the
    topology ConfigMap is mounted where --topology-file points."""

    def agent(values: dict[str, Any]) -> dict[str, Any]:
        ds = one(chart.template(values), "DaemonSet", "fabricdra-node")
        spec = ds["spec"]["template"]["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == "devices"]
        return {"container": container, "volumes": spec["volumes"]}

    default = agent({})["container"]
    assert "--lldp=off" in default["args"]
    assert "--ib-neighbours=smpquery" in default["args"]
    assert not any(a.startswith("--topology-file") for a in default["args"])

    host = agent({"node": {"hostNetwork": True}, "gpus": {"enabled": False}})["container"]
    assert "--lldp=raw" in host["args"]
    assert host["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}

    got = agent(
        {
            "scaleOut": {
                "lldp": "lldpd",
                "ibNeighbours": "off",
                "topologyConfigMap": "fabric-topology",
                "topologyKey": "topology.conf",
                "netRoles": [{"match": "mlx5_8", "role": "storage"}],
            }
        }
    )
    args = got["container"]["args"]
    assert "--lldp=lldpd" in args
    assert "--ib-neighbours=off" in args
    assert "--topology-file=/etc/fabricdra/topology/topology.conf" in args
    assert "--net-role=mlx5_8=storage" in args
    assert {"name": "topology", "mountPath": "/etc/fabricdra/topology", "readOnly": True} in got[
        "container"
    ]["volumeMounts"]
    (volume,) = [v for v in got["volumes"] if v["name"] == "topology"]
    assert volume["configMap"] == {"name": "fabric-topology", "optional": True}


def test_the_measured_loss_is_off_unless_asked_for_and_only_with_the_fabric_check(
    chart: Chart,
) -> None:
    """Issue 28 point 7: verification.fabricCheck.measureLoss -> --fabric-check-loss (two
    extra MPI runs after every passed check: opt-in)."""

    def args(values: dict[str, Any]) -> list[str]:
        deploy = one(chart.template(values), "Deployment", "fabricdra-controller")
        return list(deploy["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--fabric-check-loss=false" in args({"verification": {"activeProbes": True}})
    on = {"verification": {"activeProbes": True, "fabricCheck": {"measureLoss": True}}}
    assert "--fabric-check-loss=true" in args(on)
    assert not [a for a in args({}) if a.startswith("--fabric-check-loss")]  # no check: no run
    with pytest.raises(Exception, match="measureLoss"):
        chart.template({"verification": {"fabricCheck": {"measureLoss": "yes"}}})
