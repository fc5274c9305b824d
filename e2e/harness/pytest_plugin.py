"""pytest plugin: session fixtures for a real control plane (registered by tests/conftest.py).

- `control_plane`: etcd + kube-apiserver (e2e.harness.controlplane.ControlPlane)
- `kube_scheduler`, `kube_controller_manager`: the real components against it
- `node_cluster` (alias `cluster`): a one-node cluster with kubelet + containerd
  (e2e.harness.nodecluster.NodeCluster), or the existing cluster that
  FABRICDRA_E2E_KUBECONFIG names (e2e.harness.existing.ExistingCluster)
- `multi_node_cluster` (module scope): one control plane and three nodes, each with its own
  kubelet and containerd (e2e.harness.multinode.MultiNodeCluster)

If the binaries are missing they are built with e2e/cluster/build.sh; if that fails, the tests
using these fixtures fail with the reason (they never skip). When such a test fails, its report
names the folder holding every component's log.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from e2e.harness.controlplane import ControlPlane, KubeControllerManager, KubeScheduler
from e2e.harness.errors import HarnessError
from e2e.harness.existing import KUBECONFIG_ENV, ExistingCluster
from e2e.harness.multinode import MultiNodeCluster
from e2e.harness.nodecluster import NodeCluster

_LOGS_KEY = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def control_plane(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        cp.start()
    except HarnessError as e:
        pytest.fail(f"real control plane unavailable: {e}", pytrace=False)
    request.config.stash.setdefault(_LOGS_KEY, []).append(str(cp.logs_dir))
    try:
        yield cp
    finally:
        cp.stop()


def another_control_plane(
    tmp_path_factory: pytest.TempPathFactory, name: str, *apiserver_flags: str
) -> Iterator[ControlPlane]:
    """For a module fixture: a control plane of its own whose kube-apiserver gets
    `apiserver_flags` (feature gates off, `--emulated-version=1.35`, ...), stopped after."""
    cp = ControlPlane(tmp_path_factory.mktemp(name), apiserver_flags=apiserver_flags)
    try:
        cp.start()
    except HarnessError as e:
        pytest.fail(f"real control plane unavailable: {e}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kube_scheduler(control_plane: ControlPlane) -> Iterator[KubeScheduler]:
    scheduler = KubeScheduler(control_plane)
    try:
        scheduler.start()
    except HarnessError as e:
        pytest.fail(f"kube-scheduler did not start: {e}", pytrace=False)
    try:
        yield scheduler
    finally:
        scheduler.stop()


@pytest.fixture(scope="session")
def kube_controller_manager(control_plane: ControlPlane) -> Iterator[KubeControllerManager]:
    # Fake nodes never heartbeat: keep the node-lifecycle controller from tainting them.
    kcm = KubeControllerManager(control_plane, node_monitor_grace_period="8760h")
    try:
        kcm.start()
    except HarnessError as e:
        pytest.fail(f"kube-controller-manager did not start: {e}", pytrace=False)
    try:
        yield kcm
    finally:
        kcm.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    logs = item.config.stash.get(_LOGS_KEY, [])
    if report.failed and logs:
        report.sections.append(
            (
                "real Kubernetes logs",
                "component logs (etcd, kube-apiserver, ...) are in:\n" + "\n".join(logs),
            )
        )


@pytest.fixture(scope="session")
def node_cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[NodeCluster | ExistingCluster]:
    """A one-node cluster with a real kubelet and containerd (e2e tests, marked `e2e`).

    With FABRICDRA_E2E_KUBECONFIG set, the cluster it names (kind, or up.sh's) is used as is.
    """
    existing = os.environ.get(KUBECONFIG_ENV)
    if existing:
        try:
            named = ExistingCluster(Path(existing))
        except HarnessError as e:
            pytest.fail(f"{KUBECONFIG_ENV}: {e}", pytrace=False)
        yield named
        return
    # Not under pytest's tmp folder: its numbered path (/tmp/pytest-of-root/pytest-123/...)
    # grows with every run on a machine, and the plugin sockets under the kubelet root must fit
    # the 107 bytes of a unix socket path.
    base = Path(tempfile.mkdtemp(prefix="fdra-e2e-"))
    cluster = NodeCluster(base)
    try:
        cluster.start()
    except HarnessError as e:
        pytest.fail(f"single-node cluster unavailable: {e}", pytrace=False)
    request.config.stash.setdefault(_LOGS_KEY, []).append(str(cluster.logs_dir))
    try:
        yield cluster
    finally:
        cluster.stop()
        _remove_if_clean(base, keep=request.session.testsfailed > 0)


def _remove_if_clean(base: Path, *, keep: bool) -> None:
    """Remove a cluster's folder after its teardown, unless a test failed (its logs are
    reported) or something is still mounted below it (never delete through a mount)."""
    if keep:
        return
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    if any(line.split()[4].startswith(f"{base}/") for line in mounts):
        return
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(node_cluster: NodeCluster | ExistingCluster) -> NodeCluster | ExistingCluster:
    """Alias of `node_cluster`."""
    return node_cluster


@pytest.fixture(scope="module")
def multi_node_cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[MultiNodeCluster]:
    """Three real nodes (kubelet + containerd each) on one control plane (e2e tests).

    Module scope: it shares the machine-wide lock with `node_cluster` (session scope), so the
    modules using it run first and each tears its cluster down before the next module.
    """
    cluster = MultiNodeCluster(tmp_path_factory.mktemp("multi-node"), nodes=3)
    try:
        cluster.start()
    except HarnessError as e:
        pytest.fail(f"multi-node cluster unavailable: {e}", pytrace=False)
    request.config.stash.setdefault(_LOGS_KEY, []).append(
        " ".join(str(p) for p in (cluster.logs_dir, *(n.logs_dir for n in cluster.nodes)))
    )
    print(f"\nmulti-node cluster: {len(cluster.nodes)} nodes Ready in {cluster.start_seconds:.1f}s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use a node cluster are e2e tests, whether or not they say so. Multi-node
    tests run first: the single-node cluster, once up, holds the machine until the end."""
    for item in items:
        if {"node_cluster", "cluster", "multi_node_cluster"} & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.e2e)
        if "multi_node_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.multinode)
    items.sort(key=lambda item: item.get_closest_marker("multinode") is None)
