"""ComputeDomains across two NVLink cliques with real pods (issue 11 point 13): the three
harness nodes are labelled into two fabric domains, two nodes in clique A and one in clique B
(the label the node agent writes, `fabricdra.io/fabric.domain`, set before each node's
compute-domain plugin starts, as on a real node), and the cluster, plugins and controller are
those of test_multinode_computedomain.py (its helpers are reused, not copied).

- With `allowMultipleCliques: true` and `numNodes: 3` a domain runs one pod on each node: the
  domain's rows name each node's clique, indices count per clique, and each node's IMEX daemon
  gives IMEX only its own clique's peers. This domain is in managed IMEX mode so that there are
  daemons to look at: the daemon is `fabricdra imex-daemon` (the real CLI) run as a process per
  node, with the stand-in IMEX executables, because the DaemonSet's pods need the product image,
  which this harness does not build (they are left at ErrImageNeverPull, and nothing waits on
  them: the workload's prepare waits for its node's row, which the process's report makes ready).
- Without the opt-in, a domain that started in clique A keeps its pods there: a pod for the
  clique-B node stays Pending (Unschedulable: the claim template is pinned to clique A), while
  one on A's other node runs; and a gang of 3 without the opt-in fits no clique
  (`FabricTooSmall`), gets no claim template, and its pod stays Pending.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controlplane import wait_for
from e2e.harness.multinode import MultiNodeCluster, WorkerNode
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIM_TEMPLATES, COMPUTE_DOMAINS, PODS
from fabricdra.kubeletplugin.computedomain.imex import HOSTS_BEGIN, HOSTS_END, peer_name
from tests.e2e.test_multinode_computedomain import (
    DRIVER_NS,
    ROOT,
    Env,
    _clean_up,
    _controller,
    _domain,
    _namespace,
    _one_per_node_with_channel,
    _owner,
    _pod,
    _ready_domain,
    _running,
    _unschedulable,
    _wait_leading,
    open_env,
)
from tests.integration.computedomain_helpers import condition, domain_body

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]

CLIQUE_A, CLIQUE_B = "nvl72-rack-a", "nvl72-rack-b"
STAND_INS = ROOT / "tests" / "imex"


@pytest.fixture(scope="module")
def env(
    multi_node_cluster: MultiNodeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    """Nodes 0 and 1 in clique A, node 2 in clique B."""
    tmp = tmp_path_factory.mktemp("cd-cliques")
    with open_env(multi_node_cluster, tmp, [CLIQUE_A, CLIQUE_A, CLIQUE_B]) as e:
        yield e


def _clique(e: Env, node: str) -> str:
    return CLIQUE_B if node == e.names[2] else CLIQUE_A


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ImexDaemonProcess:
    """`fabricdra imex-daemon` for one node, as the domain's DaemonSet pod would run it
    (hostNetwork: the node's address is its pod IP)."""

    node: WorkerNode
    config_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def hosts_block(self) -> dict[int, str]:
        """The peers IMEX resolves its nodes file's names through: index slot -> IP."""
        lines = (self.config_dir / "hosts").read_text().splitlines()
        inside = lines[lines.index(HOSTS_BEGIN) + 1 : lines.index(HOSTS_END)]
        out = {}
        for line in inside:
            ip, name = line.split("\t")
            out[int(name.rsplit("-", 1)[1])] = ip
            assert name == peer_name(int(name.rsplit("-", 1)[1])), line
        return out

    def resolved(self) -> dict[str, str]:
        """What the (stand-in) IMEX itself resolved its peers to at its last (re)load."""
        state = json.loads((self.config_dir / "imex-state.json").read_text())
        return {name: ip for name, ip in state["peers"].items() if ip}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # stops IMEX, deletes its report
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _imex_daemon(e: Env, node: WorkerNode, ns: str, name: str, uid: str) -> ImexDaemonProcess:
    config_dir = e.tmp / f"imexd-{name}-{node.index}"
    config_dir.mkdir()
    (config_dir / "hosts").write_text("127.0.0.1\tlocalhost\n")  # the pod's /etc/hosts
    log = node.logs_dir / f"imex-daemon-{name}.log"
    argv = [
        sys.executable,
        "-m",
        "fabricdra.cli",
        "imex-daemon",
        "--kubeconfig",
        str(e.cluster.kubeconfig),
        "--node-name",
        node.node_name,
        "--pod-ip",
        node.ip,
        "--domain-name",
        name,
        "--domain-namespace",
        ns,
        "--domain-uid",
        uid,
        "--report-namespace",
        DRIVER_NS,
        "--config-dir",
        str(config_dir),
        "--imex-bin",
        str(STAND_INS / "nvidia-imex"),
        "--imex-ctl",
        str(STAND_INS / "nvidia-imex-ctl"),
        "--hosts-file",
        str(config_dir / "hosts"),
        "--interval",
        "1",
    ]
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        # Each node's IMEX has its own command port, as on its own host.
        "FAKE_IMEX_CMD_PORT": str(_free_port()),
        "FAKE_IMEX_STATE_FILE": str(config_dir / "imex-state.json"),
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environ)
    return ImexDaemonProcess(node, config_dir, proc, log)


def _packed_pod(name: str, template: str, job: str) -> Any:
    """One pod per node (required anti-affinity), packed into as few cliques as possible
    (a *preferred* podAffinity on the fabric domain), as docs/compute-domains.md advises for a
    domain across cliques: a required one could not be met by 2 + 1 nodes."""
    pod = _pod(name, template, job=job)
    pod["spec"]["affinity"]["podAffinity"] = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"job": job}},
                    "topologyKey": "fabricdra.io/fabric.domain",
                },
            }
        ]
    }
    return pod


def test_an_opted_in_domain_runs_across_two_cliques(env: Env) -> None:
    """allowMultipleCliques, numNodes 3, managed IMEX, three pods: all run (one per node)
    with the domain's channel, the domain is Ready and never pinned, its rows name each node's
    clique with indices counted per clique (A: 0 and 1, B: 0), and each node's IMEX is given
    only its own clique's peers (the hosts block the nodes file's names resolve through, and
    what the stand-in IMEX resolved)."""
    began = time.monotonic()
    e, ns = env, _namespace(env, "cd-cliques")
    ctl = _controller(e, "cliques", "--image-pull-policy", "Never")
    daemons: list[ImexDaemonProcess] = []
    pods = [f"wide-{i}" for i in range(3)]
    cleaned = False
    try:
        _wait_leading(e, ctl)
        domain = _domain(e, ns, "wide", num_nodes=3, mode="managed", multiple_cliques=True)
        uid, channel = domain["metadata"]["uid"], domain["status"]["channels"][0]
        daemons = [_imex_daemon(e, node, ns, "wide", uid) for node in e.cluster.nodes]
        bodies = [_packed_pod(pod, "wide-imex", "wide") for pod in pods]
        _one_per_node_with_channel(e, ns, bodies, "wide", channel)
        done = _ready_domain(e, ns, "wide", rows=3)
        rows = done["status"]["nodes"]
        assert {r["name"]: r["fabricDomain"] for r in rows} == {n: _clique(e, n) for n in e.names}
        assert sorted(r["index"] for r in rows if r["fabricDomain"] == CLIQUE_A) == [0, 1]
        assert [r["index"] for r in rows if r["fabricDomain"] == CLIQUE_B] == [0]
        ips = {n.node_name: n.ip for n in e.cluster.nodes}
        assert {r["name"]: r["ipAddress"] for r in rows} == ips
        assert done["status"].get("fabricDomain", "") == ""
        assert (condition(done, cd.DEGRADED) or {}).get("status") == "False"
        for name in e.names:
            assert _owner(e, name) == uid

        # Each node's IMEX: its own clique's peers, by the indices in status, and nothing else.
        for d in daemons:
            mine = _clique(e, d.node.node_name)
            want = {r["index"]: r["ipAddress"] for r in rows if r["fabricDomain"] == mine}
            wait_for(
                lambda d=d, want=want: d.hosts_block() == want,
                what=f"{d.node.node_name}'s IMEX peers {want} (log {d.log})",
            )
            assert d.proc.poll() is None, f"the IMEX daemon exited (log {d.log})"
            wait_for(
                lambda d=d, want=want: d.resolved() == {peer_name(i): ip for i, ip in want.items()},
                what=f"{d.node.node_name}'s IMEX resolving only its clique's peers",
            )
        print(f"\ntwo cliques: Ready and checked at {time.monotonic() - began:.1f}s")
        for d in daemons:
            d.stop()
        _clean_up(e, ns, pods, ["wide"])
        cleaned = True
    finally:
        for d in daemons:
            d.stop()
        if not cleaned:  # a failure here must not leave the nodes held for the next test
            with contextlib.suppress(Exception):
                _clean_up(e, ns, pods, ["wide"])
        ctl.stop()
    print(f"two cliques: {time.monotonic() - began:.1f}s")


def test_without_the_opt_in_a_domain_stays_in_one_clique(env: Env) -> None:
    """A domain without allowMultipleCliques runs its first pod in clique A (node 0) and is
    pinned there: a second pod on A's other node runs, a pod for the clique-B node stays
    Pending (Unschedulable; never bound there). A gang of 3 without the opt-in fits no clique
    of these 2 + 1 nodes: Ready=False, FabricTooSmall, no claim template, its pod Pending."""
    began = time.monotonic()
    e, ns = env, _namespace(env, "cd-oneclique")
    a0, a1, b0 = e.names
    ctl = _controller(e, "oneclique")
    try:
        _wait_leading(e, ctl)
        domain = _domain(e, ns, "narrow")
        uid = domain["metadata"]["uid"]
        e.rest.create(PODS, _pod("narrow-a0", "narrow-imex", node=a0), ns)
        assert _running(e, ns, "narrow-a0") == a0
        wait_for(
            lambda: (
                e.rest.get(COMPUTE_DOMAINS, "narrow", ns)["status"].get("fabricDomain") == CLIQUE_A
                and f"fabricDomain == '{CLIQUE_A}'"
                in str(e.rest.get(CLAIM_TEMPLATES, "narrow-imex", ns)["spec"])
            ),
            what="narrow pinned to clique A",
        )
        e.rest.create(PODS, _pod("narrow-a1", "narrow-imex", node=a1), ns)
        e.rest.create(PODS, _pod("narrow-b0", "narrow-imex", node=b0), ns)
        assert _running(e, ns, "narrow-a1") == a1
        message = wait_for(
            lambda: _unschedulable(e, ns, "narrow-b0"), what="narrow-b0 unschedulable"
        )
        assert "cannot allocate all claims" in message
        time.sleep(3)  # and it stays so
        pod = e.rest.get(PODS, "narrow-b0", ns)
        assert pod["spec"].get("nodeName") is None
        assert pod["status"]["phase"] == "Pending"
        obj = _ready_domain(e, ns, "narrow", rows=2)
        assert {r["name"]: r["fabricDomain"] for r in obj["status"]["nodes"]} == {
            a0: CLIQUE_A,
            a1: CLIQUE_A,
        }
        assert _owner(e, b0) == cd.FREE_OWNER

        # numNodes 3 without the opt-in: the largest clique has 2 nodes.
        e.rest.create(
            COMPUTE_DOMAINS, domain_body("gang", rct="gang-imex", mode="host", num_nodes=3), ns
        )
        ready = wait_for(
            lambda: (
                (c := condition(e.rest.get(COMPUTE_DOMAINS, "gang", ns), cd.READY) or {}).get(
                    "reason"
                )
                == "FabricTooSmall"
                and c
            ),
            what="gang: FabricTooSmall",
        )
        assert ready["status"] == "False"
        assert "allowMultipleCliques" in ready["message"]
        e.rest.create(PODS, _pod("gang-0", "gang-imex", node=b0), ns)
        time.sleep(3)
        assert e.rest.get_or_none(CLAIM_TEMPLATES, "gang-imex", ns) is None
        pod = e.rest.get(PODS, "gang-0", ns)
        assert pod["spec"].get("nodeName") is None
        assert pod["status"]["phase"] == "Pending"
        assert _owner(e, b0) == cd.FREE_OWNER
        assert _owner(e, a0) == uid
        _clean_up(e, ns, ["narrow-a0", "narrow-a1", "narrow-b0", "gang-0"], ["narrow", "gang"])
    finally:
        ctl.stop()
    print(f"\none clique: {time.monotonic() - began:.1f}s")
