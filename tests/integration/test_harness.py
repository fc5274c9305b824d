"""The real-Kubernetes harness itself: each fixture does what the rest of the suite relies on."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness import binaries
from e2e.harness.controlplane import (
    ControlPlane,
    HarnessError,
    KubeControllerManager,
    KubeScheduler,
    wait_for,
)
from e2e.harness.existing import ExistingCluster

pytestmark = pytest.mark.integration


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_namespace_round_trip(control_plane: ControlPlane) -> None:
    name = _name("harness-ns")
    control_plane.create_namespace(name)
    with control_plane.api_client() as api:
        ns = client.CoreV1Api(api).read_namespace(name)
    assert ns.metadata.name == name
    assert ns.status.phase == "Active"
    assert control_plane.server.startswith("https://127.0.0.1:")


def test_dra_v1_objects_round_trip(control_plane: ControlPlane) -> None:
    driver = f"{_name('harness')}.example.com"
    node = _name("harness-node")
    with control_plane.api_client() as api:
        resource = client.ResourceV1Api(api)
        resource.create_device_class(
            {
                "metadata": {"name": driver},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
            }
        )
        resource.create_resource_slice(
            {
                "metadata": {"name": node},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {"name": "dev0", "attributes": {"model": {"string": "h100"}}},
                    ],
                },
            }
        )
        slice_ = resource.read_resource_slice(node)
        cls = resource.read_device_class(driver)
    assert slice_.spec.driver == driver
    assert [d.name for d in slice_.spec.devices] == ["dev0"]
    assert slice_.spec.devices[0].attributes["model"].string == "h100"
    assert cls.spec.selectors[0].cel.expression == f'device.driver == "{driver}"'


def test_audit_events_see_writes_by_user_agent(control_plane: ControlPlane) -> None:
    agent = f"fabricdra-{_name('harness')}/0.0"
    name = _name("audited")
    with control_plane.api_client() as api:
        api.user_agent = agent
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        core.read_namespace(name)
        core.patch_namespace(name, {"metadata": {"labels": {"seen": "yes"}}})
    writes = control_plane.audit_events(user_agent=agent, verbs=["create", "update", "patch"])
    assert [(e["verb"], e["objectRef"]["name"]) for e in writes] == [
        ("create", name),
        ("patch", name),
    ]
    everything = control_plane.audit_events(user_agent=agent)
    assert [e["verb"] for e in everything] == ["create", "get", "patch"]
    assert {e["stage"] for e in everything} == {"ResponseComplete"}
    assert {e["level"] for e in everything} == {"Metadata"}


def test_create_node_is_ready_and_untainted(control_plane: ControlPlane) -> None:
    name = _name("fake-node")
    control_plane.create_node(name, {"example.com/role": "gpu"})
    with control_plane.api_client() as api:
        node = client.CoreV1Api(api).read_node(name)
    assert node.metadata.labels["example.com/role"] == "gpu"
    assert not node.spec.taints
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]
    assert node.status.allocatable["pods"] == "110"


def test_scheduler_binds_pod_to_fake_node(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler
) -> None:
    ns, node = _name("sched"), _name("sched-node")
    control_plane.create_namespace(ns)
    control_plane.create_node(node, {"harness/target": node})
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": "p"},
                "spec": {
                    "nodeSelector": {"harness/target": node},
                    "containers": [{"name": "c", "image": "localhost/busybox:e2e"}],
                },
            },
        )
        bound = wait_for(
            lambda: core.read_namespaced_pod("p", ns).spec.node_name,
            what="the scheduler to bind the pod",
        )
    assert bound == node
    assert kube_scheduler.alive()


def test_controller_manager_finalizes_deleted_namespace(
    control_plane: ControlPlane, kube_controller_manager: KubeControllerManager
) -> None:
    ns = _name("doomed")
    control_plane.create_namespace(ns)
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"k": "v"}})
        core.delete_namespace(ns)

        def gone() -> bool:
            try:
                core.read_namespace(ns)
            except ApiException as e:
                return e.status == 404
            return False

        wait_for(gone, timeout=90, what="the namespace controller to finalize the namespace")
    assert kube_controller_manager.alive()


def test_controller_manager_creates_default_service_account(
    control_plane: ControlPlane, kube_controller_manager: KubeControllerManager
) -> None:
    ns = _name("sa")
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        sa = wait_for(
            lambda: core.read_namespaced_service_account("default", ns),
            what="the serviceaccount controller",
        )
    assert sa.metadata.name == "default"


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    """A second, private control plane: after stop() none of its processes exist."""
    cp = ControlPlane(tmp_path / "cp")
    with cp:
        scheduler = KubeScheduler(cp)
        scheduler.start()
        pids = [d.pid for d in cp.daemons]
        assert len(pids) == 3  # etcd, kube-apiserver, kube-scheduler
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} survived stop()"
    assert (cp.logs_dir / "kube-apiserver.log").stat().st_size > 0


def test_missing_binaries_without_go_fail_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No binaries and no Go: a HarnessError carrying build.sh's reason (tests fail, not skip)."""
    tools = tmp_path / "bin"  # a PATH with what build.sh needs to start, and no `go`
    tools.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    monkeypatch.setenv("FABRICDRA_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tools))
    with pytest.raises(HarnessError, match="no 'go' on PATH"):
        binaries.ensure()


def test_existing_cluster_switch_uses_the_named_cluster(control_plane: ControlPlane) -> None:
    """FABRICDRA_E2E_KUBECONFIG's target (here: our control plane, one fake node)."""
    node = _name("existing-node")
    control_plane.create_node(node)
    existing = ExistingCluster(control_plane.kubeconfig, node_name=node)
    assert existing.server == control_plane.server
    assert existing.node_name == node
    assert existing.plugins_registry_dir == Path("/var/lib/kubelet/plugins_registry")
    with existing.api_client() as api:
        assert client.CoreV1Api(api).read_node(node).metadata.name == node


def test_existing_cluster_without_kubeconfig_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"FABRICDRA_E2E_KUBECONFIG=.*no such file"):
        ExistingCluster(tmp_path / "missing.kubeconfig")
