"""ComputeDomains across several real nodes: three kubelets (each with its own containerd) on
one control plane, the real scheduler and controller manager, `fabricdra compute-domain-plugin`
running as a process per node (as the other e2e tests run the plugins) and
`fabricdra controller` as a process, with real pods.

The domains use host IMEX mode: managed mode needs the daemon image (issue 9) to run its
DaemonSet pods. The host's IMEX service is a stand-in control tool answering READY; each node
has its own /proc/devices (listing the IMEX channel major) and /dev root, and its own CDI
folder, so what a pod sees comes from its own node's plugin.

The tests share one cluster (module scope) and run in this order: the last two take a node
away and leave it down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.images import TEST_IMAGE
from e2e.harness.multinode import MultiNodeCluster, WorkerNode
from fabricdra.api import computedomain as cd
from fabricdra.controller.objects import slice_name
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    EVENTS,
    LEASES,
    NODES,
    PODS,
    SLICES,
    Rest,
)
from tests.integration.computedomain_helpers import condition, domain_body, install_crd, unique

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]

ROOT = Path(__file__).resolve().parents[2]
FABRIC = "nvl72-rack-1"  # all three nodes are one NVLink fabric domain
DRIVER_NS = "fabricdra-system"  # the controller's namespace: its lease and the host reports
CONTROLLER_LEASE = "fabricdra-compute-domain-controller"
IMEX_MAJOR = 234
POD_TIMEOUT = 120.0


@dataclass
class NodePlugin:
    node: WorkerNode
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """As on a node that lost power: no clean-up, no last report."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Env:
    cluster: MultiNodeCluster
    rest: Rest
    plugins: dict[str, NodePlugin]
    tmp: Path

    @property
    def names(self) -> list[str]:
        return [n.node_name for n in self.cluster.nodes]


def _start_plugin(cluster: MultiNodeCluster, node: WorkerNode, tmp: Path) -> NodePlugin:
    host = tmp / f"host-{node.index}"
    proc_root, dev_root = host / "proc", host / "dev"
    proc_root.mkdir(parents=True)
    dev_root.mkdir()
    (proc_root / "devices").write_text(
        f"Character devices:\n195 nvidia\n{IMEX_MAJOR} nvidia-caps-imex-channels\n\n"
        "Block devices:\n"
    )
    imex_ctl = host / "nvidia-imex-ctl"  # the host's IMEX service, up and READY
    imex_ctl.write_text("#!/bin/sh\necho READY\n")
    imex_ctl.chmod(0o755)
    log = node.logs_dir / "compute-domain-plugin.log"
    argv = [
        sys.executable,
        "-m",
        "fabricdra.cli",
        "compute-domain-plugin",
        "--node-name",
        node.node_name,
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--cdi-dir",
        str(node.cdi_dir),
        "--plugin-dir",
        str(node.plugins_dir / cd.DRIVER),
        "--registry-dir",
        str(node.plugins_registry_dir),
        "--proc-root",
        str(proc_root),
        "--dev-root",
        str(dev_root),
        "--imex-ctl",
        str(imex_ctl),
        "--report-namespace",
        DRIVER_NS,
        "--host-imex-interval",
        "2",
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
    return NodePlugin(node, proc, log)


@contextmanager
def open_env(cluster: MultiNodeCluster, tmp: Path, fabrics: Sequence[str]) -> Iterator[Env]:
    """The CRD, the driver's namespace, and a compute-domain plugin on each node, node i in
    NVLink fabric domain (clique) `fabrics[i]` (test_multinode_cliques.py uses two)."""
    rest = Rest(cluster.api_client())
    install_crd(rest)
    cluster.control_plane.create_namespace(DRIVER_NS)
    plugins: dict[str, NodePlugin] = {}
    try:
        for node, fabric in zip(cluster.nodes, fabrics, strict=True):
            # What the node agent labels on an NVL72 node; the plugin reads it at start.
            rest.patch(
                NODES,
                node.node_name,
                {"metadata": {"labels": {"fabricdra.io/fabric.domain": fabric}}},
            )
            plugins[node.node_name] = _start_plugin(cluster, node, tmp)
        for name, plugin in plugins.items():
            wait_for(
                lambda name=name, plugin=plugin: (
                    plugin.proc.poll() is None
                    and rest.get(NODES, name)["metadata"]["labels"].get(cd.PLUGIN_NODE_LABEL)
                    == "true"
                    and any(plugin.node.plugins_registry_dir.glob(f"{cd.DRIVER}*"))
                ),
                timeout=60,
                what=f"the compute-domain plugin on {name} (log {plugin.log})",
            )
        yield Env(cluster, rest, plugins, tmp)
    finally:
        for plugin in plugins.values():
            plugin.stop()


@pytest.fixture(scope="module")
def env(
    multi_node_cluster: MultiNodeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("cd-hosts")
    with open_env(multi_node_cluster, tmp, [FABRIC] * len(multi_node_cluster.nodes)) as e:
        yield e


# -- controller processes ----------------------------------------------------------------------


@dataclass
class ControllerProcess:
    identity: str
    user: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _controller(e: Env, identity: str, *extra: str) -> ControllerProcess:
    """`fabricdra controller` with leader election, as its own API user (so the audit log says
    which replica wrote what); `extra`: more flags."""
    user = f"fabricdra-controller-{identity}"
    kubeconfig = e.cluster.control_plane.kubeconfig_for(identity, user, ("system:masters",))
    log = e.cluster.logs_dir / f"controller-{identity}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fabricdra.cli",
                "controller",
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                DRIVER_NS,
                "--identity",
                identity,
                "--resync-seconds",
                "5",
                "--metrics-port",
                "0",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    return ControllerProcess(identity, user, proc, log)


def _leader(rest: Rest) -> str | None:
    lease = rest.get_or_none(LEASES, CONTROLLER_LEASE, DRIVER_NS)
    holder = (lease or {}).get("spec", {}).get("holderIdentity")
    return str(holder) if holder else None


def _wait_leading(e: Env, ctl: ControllerProcess, timeout: float = 60) -> None:
    wait_for(
        lambda: ctl.proc.poll() is None and _leader(e.rest) == ctl.identity,
        timeout=timeout,
        what=f"controller {ctl.identity} to lead (log {ctl.log})",
    )


# -- pods and domains --------------------------------------------------------------------------

SHOW = (
    "ls /dev/nvidia-caps-imex-channels; echo CHANNEL=$FABRICDRA_IMEX_CHANNEL; "
    "echo DOMAIN=$FABRICDRA_COMPUTE_DOMAIN; sleep 3600"
)


def _pod(name: str, template: str, *, node: str | None = None, job: str | None = None) -> Any:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "c",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", SHOW],
                "resources": {"claims": [{"name": "imex"}]},
            }
        ],
        "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": template}],
    }
    labels = {"job": job} if job else {}
    if node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    elif job is not None:
        # As a multi-node job is written: one pod per node, all in one NVLink domain.
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"job": job}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            },
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"job": job}},
                        "topologyKey": "fabricdra.io/fabric.domain",
                    }
                ]
            },
        }
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def _domain(
    e: Env,
    ns: str,
    name: str,
    num_nodes: int | None = None,
    *,
    mode: str = "host",
    multiple_cliques: bool = False,
) -> dict[str, Any]:
    body = domain_body(name, rct=f"{name}-imex", mode=mode, num_nodes=num_nodes)
    if multiple_cliques:
        body["spec"]["allowMultipleCliques"] = True
    e.rest.create(COMPUTE_DOMAINS, body, ns)
    wait_for(
        lambda: e.rest.get_or_none(CLAIM_TEMPLATES, f"{name}-imex", ns),
        what=f"{name}'s claim template",
    )
    obj: dict[str, Any] = wait_for(
        lambda: (
            (o := e.rest.get(COMPUTE_DOMAINS, name, ns)).get("status", {}).get("channels") and o
        ),
        what=f"{name}'s channel",
    )
    return obj


def _running(e: Env, ns: str, pod: str) -> str:
    """Wait until the pod runs; its node."""

    def running() -> str | None:
        obj = e.rest.get(PODS, pod, ns)
        if obj.get("status", {}).get("phase") == "Running":
            return str(obj["spec"]["nodeName"])
        return None

    node: str = wait_for(running, timeout=POD_TIMEOUT, what=f"pod {pod} Running")
    return node


def _pod_output(e: Env, ns: str, pod: str) -> list[str]:
    with e.cluster.api_client() as api:
        logs: str = wait_for(
            lambda: (
                (text := client.CoreV1Api(api).read_namespaced_pod_log(pod, ns, container="c"))
                and "DOMAIN=" in text
                and text
            ),
            what=f"{pod}'s output",
        )
    return logs.split()


def _one_per_node_with_channel(
    e: Env, ns: str, bodies: list[dict[str, Any]], domain: str, channel: int
) -> None:
    """Creates the pods; each runs, on a node of its own (every node), and sees the domain's
    channel: its device node and the environment the plugin gives it."""
    for body in bodies:
        e.rest.create(PODS, body, ns)
    pods = [b["metadata"]["name"] for b in bodies]
    placed = {pod: _running(e, ns, pod) for pod in pods}
    assert sorted(placed.values()) == sorted(e.names)
    for pod in pods:
        assert _pod_output(e, ns, pod) == [
            f"channel{channel}",
            f"CHANNEL={channel}",
            f"DOMAIN={domain}",
        ]


def _unschedulable(e: Env, ns: str, pod: str) -> str | None:
    for c in e.rest.get(PODS, pod, ns).get("status", {}).get("conditions", []) or []:
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def _ready_domain(e: Env, ns: str, name: str, rows: int) -> dict[str, Any]:
    obj: dict[str, Any] = wait_for(
        lambda: (
            (o := e.rest.get(COMPUTE_DOMAINS, name, ns))
            and (condition(o, cd.READY) or {}).get("status") == "True"
            and len(o["status"].get("nodes", [])) == rows
            and o
        ),
        timeout=60,
        what=f"{name} Ready with {rows} nodes",
    )
    return obj


def _owner(e: Env, node: str) -> str:
    sl = e.rest.get(SLICES, slice_name(node))
    channel = next(d for d in sl["spec"]["devices"] if d["name"] == cd.CHANNEL_DEVICE)
    return str(channel["attributes"][cd.ATTR_OWNER]["string"])


def _clean_up(e: Env, ns: str, pods: list[str], domains: list[str]) -> None:
    for pod in pods:
        e.rest.delete(PODS, pod, ns)
    for pod in pods:
        wait_for(lambda pod=pod: e.rest.get_or_none(PODS, pod, ns) is None, what=f"{pod} gone")
    for name in domains:
        e.rest.delete(COMPUTE_DOMAINS, name, ns)
    for name in domains:
        wait_for(
            lambda name=name: e.rest.get_or_none(COMPUTE_DOMAINS, name, ns) is None,
            what=f"{name} deleted",
        )


def _stop_after_clean_up(
    e: Env, ns: str, pods: list[str], domains: list[str], controllers: list[ControllerProcess]
) -> None:
    """A test's end, passed or failed: its pods and domains removed while its controller runs
    (the domains' finalizer needs one), then the controllers stopped. A failed test's domain
    left behind would keep holding its nodes, and the next test's gang would find no room and
    never get its claim template (a failed failover test made both node-leaving tests fail)."""
    try:
        _clean_up(e, ns, pods, domains)
    finally:
        for ctl in controllers:
            ctl.stop()


def _namespace(e: Env, prefix: str) -> str:
    ns = unique(prefix)
    e.cluster.control_plane.create_namespace(ns)
    return ns


# -- the scenarios -----------------------------------------------------------------------------


def test_domain_spans_three_nodes(env: Env) -> None:
    """One domain, one pod per node (anti-affinity, as a job is written): all three run, each
    with exactly the domain's IMEX channel; the domain lists three nodes with distinct IPs and
    indices and is Ready; each node is held for it."""
    began = time.monotonic()
    e, ns = env, _namespace(env, "cd-span")
    ctl = _controller(e, "span")
    pods = [f"span-{i}" for i in range(3)]
    try:
        _wait_leading(e, ctl)
        domain = _domain(e, ns, "span", num_nodes=3)
        channel = domain["status"]["channels"][0]
        bodies = [_pod(pod, "span-imex", job="span") for pod in pods]
        _one_per_node_with_channel(e, ns, bodies, "span", channel)
        done = _ready_domain(e, ns, "span", rows=3)
        rows = done["status"]["nodes"]
        assert sorted(r["name"] for r in rows) == sorted(e.names)
        assert sorted(r["index"] for r in rows) == [0, 1, 2]
        assert {r["ipAddress"] for r in rows} == {n.ip for n in e.cluster.nodes}
        assert {r["fabricDomain"] for r in rows} == {FABRIC}
        assert done["status"]["fabricDomain"] == FABRIC
        uid = done["metadata"]["uid"]
        for name in e.names:
            assert _owner(e, name) == uid
            assert e.rest.get(NODES, name)["metadata"]["labels"][cd.DOMAIN_LABEL] == uid
        _clean_up(e, ns, pods, ["span"])
        # Free again once the domain's pods are gone.
        for name in e.names:
            wait_for(lambda name=name: _owner(e, name) == cd.FREE_OWNER, what=f"{name} free")
    finally:
        _stop_after_clean_up(e, ns, pods, ["span"], [ctl])
    print(f"\nspan: {time.monotonic() - began:.1f}s")


def test_second_domain_waits_on_a_held_node_and_runs_on_a_free_one(env: Env) -> None:
    """Domain A holds nodes 0 and 1. Domain B's pod for node 0 stays Pending (unschedulable,
    never ContainerCreating) while B's pod for the free node 2 runs; once A's pods are gone
    the waiting pod runs on node 0."""
    began = time.monotonic()
    e, ns = env, _namespace(env, "cd-held")
    n0, n1, n2 = e.names
    ctl = _controller(e, "held")
    try:
        _wait_leading(e, ctl)
        a = _domain(e, ns, "alpha")
        b = _domain(e, ns, "beta")
        assert a["status"]["channels"] != b["status"]["channels"]
        e.rest.create(PODS, _pod("alpha-0", "alpha-imex", node=n0), ns)
        e.rest.create(PODS, _pod("alpha-1", "alpha-imex", node=n1), ns)
        assert _running(e, ns, "alpha-0") == n0
        assert _running(e, ns, "alpha-1") == n1

        e.rest.create(PODS, _pod("beta-held", "beta-imex", node=n0), ns)
        e.rest.create(PODS, _pod("beta-free", "beta-imex", node=n2), ns)
        assert _running(e, ns, "beta-free") == n2
        message = wait_for(
            lambda: _unschedulable(e, ns, "beta-held"), what="beta-held unschedulable"
        )
        assert "cannot allocate all claims" in message
        pod = e.rest.get(PODS, "beta-held", ns)
        assert pod["spec"].get("nodeName") is None
        assert pod["status"]["phase"] == "Pending"
        assert _owner(e, n0) == a["metadata"]["uid"]
        assert _owner(e, n2) == b["metadata"]["uid"]
        assert _pod_output(e, ns, "beta-free")[1] == f"CHANNEL={b['status']['channels'][0]}"

        for pod_name in ("alpha-0", "alpha-1"):
            e.rest.delete(PODS, pod_name, ns)
        assert _running(e, ns, "beta-held") == n0
        assert _pod_output(e, ns, "beta-held")[1] == f"CHANNEL={b['status']['channels'][0]}"
        _ready_domain(e, ns, "beta", rows=2)
    finally:
        pods = ["alpha-0", "alpha-1", "beta-held", "beta-free"]
        _stop_after_clean_up(e, ns, pods, ["alpha", "beta"], [ctl])
    print(f"\nheld/free: {time.monotonic() - began:.1f}s")


def _writes(e: Env, user: str) -> list[dict[str, Any]]:
    """Successful writes `user` made, leader Lease and dry runs excluded: every replica, standby
    too, checks the API's features at start with a dry-run create of a ResourceSlice
    (controller/preflight.py), which stores nothing."""
    out = []
    for ev in e.cluster.control_plane.audit_events(verbs=("create", "update", "patch", "delete")):
        ref = ev.get("objectRef", {})
        if ev.get("user", {}).get("username") != user or ref.get("resource") == "leases":
            continue
        if "dryRun" in parse_qs(urlsplit(ev.get("requestURI", "")).query):
            continue
        if ev.get("responseStatus", {}).get("code", 0) < 300:
            out.append(ev)
    return out


def test_controller_failover(env: Env) -> None:
    """Two controller replicas: the standby writes nothing while the leader lives; the leader
    is SIGKILLed; the standby takes over within seconds, admits a new pod of the domain, and
    no decision is taken twice (each claim admitted once, the channel, indices and NodeJoined
    events unchanged)."""
    began = time.monotonic()
    e, ns = env, _namespace(env, "cd-failover")
    n0, n1, n2 = e.names
    first = _controller(e, "replica-a")
    second: ControllerProcess | None = None
    try:
        _wait_leading(e, first)
        second = _controller(e, "replica-b")
        domain = _domain(e, ns, "fo")
        uid = domain["metadata"]["uid"]
        e.rest.create(PODS, _pod("fo-0", "fo-imex", node=n0), ns)
        e.rest.create(PODS, _pod("fo-1", "fo-imex", node=n1), ns)
        _running(e, ns, "fo-0")
        _running(e, ns, "fo-1")
        before = _ready_domain(e, ns, "fo", rows=2)
        assert second.proc.poll() is None, f"the standby exited (log {second.log})"
        assert _leader(e.rest) == first.identity
        assert _writes(e, second.user) == [], "the standby wrote while the leader lived"

        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        killed = time.monotonic()
        e.rest.create(PODS, _pod("fo-2", "fo-imex", node=n2), ns)
        _wait_leading(e, second, timeout=30)
        took_over = time.monotonic() - killed
        _running(e, ns, "fo-2")
        admitted = time.monotonic() - killed
        print(
            f"\nfailover: lease taken {took_over:.1f}s, new pod Running {admitted:.1f}s after kill"
        )

        after = _ready_domain(e, ns, "fo", rows=3)
        assert after["status"]["channels"] == before["status"]["channels"]
        old_rows = {r["name"]: r["index"] for r in before["status"]["nodes"]}
        new_rows = {r["name"]: r["index"] for r in after["status"]["nodes"]}
        assert {n: new_rows[n] for n in old_rows} == old_rows
        # Each workload claim was admitted exactly once, by one replica or the other.
        claims = [
            c["metadata"]["name"]
            for c in e.rest.list(CLAIMS, ns)["items"]
            if c["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL) == uid
        ]
        assert len(claims) == 3
        admissions = Counter(
            ev["objectRef"]["name"]
            for user in (first.user, second.user)
            for ev in _writes(e, user)
            if ev["objectRef"].get("resource") == "resourceclaims"
            and ev["objectRef"].get("subresource") == "status"
        )
        assert admissions == Counter(dict.fromkeys(claims, 1))
        joined = Counter(
            ev["message"]
            for ev in e.rest.list(EVENTS, ns)["items"]
            if ev["involvedObject"].get("uid") == uid and ev["reason"] == "NodeJoined"
        )
        assert joined == Counter(f"node {n} joined the domain" for n in (n0, n1, n2))
    finally:
        replicas = [first] if second is None else [first, second]
        _stop_after_clean_up(e, ns, ["fo-0", "fo-1", "fo-2"], ["fo"], replicas)
    print(f"failover test: {time.monotonic() - began:.1f}s")


@dataclass
class Left:
    """A domain Ready on three nodes, then node 2 died (kubelet and plugin gone)."""

    ns: str
    uid: str
    gone: WorkerNode
    pods: list[str]


@pytest.fixture(scope="module")
def left(env: Env) -> Iterator[Left]:
    e, ns = env, _namespace(env, "cd-leave")
    ctl = _controller(e, "leave")
    try:
        _wait_leading(e, ctl)
        uid = _domain(e, ns, "leave", num_nodes=3)["metadata"]["uid"]
        pods = [f"leave-{i}" for i in range(3)]
        for pod in pods:
            e.rest.create(PODS, _pod(pod, "leave-imex", job="leave"), ns)
        placed = {pod: _running(e, ns, pod) for pod in pods}
        _ready_domain(e, ns, "leave", rows=3)
        gone = e.cluster.nodes[2]
        # As on a node that lost power: no clean-up, no last report, no more heartbeats.
        e.plugins[gone.node_name].kill()
        gone.stop_kubelet()
        yield Left(ns, uid, gone, [p for p, n in placed.items() if n != gone.node_name])
    finally:
        ctl.stop()


def test_node_leaving_marks_its_row_not_ready(env: Env, left: Left) -> None:
    """Node 2 died: its row turns not ready, and the domain (numNodes 3) is no longer Ready
    and says Degraded."""
    began = time.monotonic()
    seen: list[dict[str, Any]] = []

    def reflected() -> dict[str, Any] | None:
        obj = env.rest.get(COMPUTE_DOMAINS, "leave", left.ns)
        seen[:] = [obj.get("status", {})]
        rows = {r["name"]: r for r in obj["status"].get("nodes", [])}
        row = rows.get(left.gone.node_name)
        ready = (condition(obj, cd.READY) or {}).get("status")
        degraded = (condition(obj, cd.DEGRADED) or {}).get("status")
        if row is not None and not row["ready"] and ready == "False" and degraded == "True":
            return obj
        return None

    try:
        # The KCM marks the node NotReady after 20 s without heartbeats; allow the
        # controller as long again.
        wait_for(reflected, timeout=60, what=f"{left.gone.node_name}'s row not ready")
    except AssertionError as e:
        status = seen[0] if seen else {}
        rows = [(r["name"], r["ready"]) for r in status.get("nodes", [])]
        conds = [(c["type"], c["status"], c["reason"]) for c in status.get("conditions", [])]
        raise AssertionError(f"{e}\nlast rows {rows}\nlast conditions {conds}") from None
    finally:
        print(f"\nnode leaving: {time.monotonic() - began:.1f}s")


def test_removed_node_leaves_the_domain(env: Env, left: Left) -> None:
    """Node 2, dead, is removed from the cluster (its Node deleted, as an operator or a
    cloud's node controller does): its pod is garbage-collected, its row leaves the domain
    (event NodeLeft, its slice gone) and the domain, which wants 3 nodes, is no longer Ready;
    the pods on the other nodes keep running."""
    began = time.monotonic()
    e, gone = env, left.gone
    e.rest.delete(NODES, gone.node_name)

    def without_it() -> dict[str, Any] | None:
        obj = e.rest.get(COMPUTE_DOMAINS, "leave", left.ns)
        names = {r["name"] for r in obj["status"].get("nodes", [])}
        ready = condition(obj, cd.READY) or {}
        if names == set(e.names) - {gone.node_name} and ready.get("status") == "False":
            return obj
        return None

    # The pod GC deletes the pods of a vanished node after a 40 s quarantine.
    obj = wait_for(without_it, timeout=120, what=f"{gone.node_name} to leave the domain")
    print(f"\nnode removed -> row gone: {time.monotonic() - began:.1f}s")
    # Too few nodes joined; with issue 11 point 13 the fabric itself (two nodes left) is now
    # smaller than numNodes, which the controller says instead.
    assert (condition(obj, cd.READY) or {}).get("reason") in ("WaitingForNodes", "FabricTooSmall")
    assert e.rest.get_or_none(SLICES, slice_name(gone.node_name)) is None
    assert any(
        ev["reason"] == "NodeLeft" and gone.node_name in ev["message"]
        for ev in e.rest.list(EVENTS, left.ns)["items"]
        if ev["involvedObject"].get("uid") == left.uid
    )
    for pod in left.pods:
        assert e.rest.get(PODS, pod, left.ns)["status"]["phase"] == "Running"
