"""Multi-clique ComputeDomains (issue 11 point 13) against a real kube-apiserver: with
`allowMultipleCliques: true` a domain's nodes come from two NVLink fabric domains, its gang
counts nodes across them (and times out as one gang, one timer for all its cliques), its status
shows each node's clique with indices per clique, and each node's IMEX daemon (the real daemon
code, stand-in IMEX executables) gets only its own clique's peers; without the opt-in a domain
still refuses a second clique."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.labels import FABRIC_DOMAIN
from fabricdra.controller import objects
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    EVENTS,
    NODES,
    SLICES,
    Rest,
)
from fabricdra.kubeletplugin.computedomain.daemon import DaemonIdentity, ImexDaemon
from fabricdra.kubeletplugin.computedomain.imex import HOSTS_BEGIN, ImexSettings, ImexSupervisor
from fabricdra.kubeletplugin.computedomain.report import write_host_report

from .computedomain_helpers import (
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    give_addresses,
    running_controller,
    unique,
    wait_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]
STAND_INS = Path(__file__).resolve().parents[1] / "imex"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conds(rest: Rest, ns: str, claim: str) -> dict[str, dict[str, Any]]:
    devices = rest.get(CLAIMS, claim, ns)["status"].get("devices", []) or []
    return {c["type"]: c for d in devices for c in d.get("conditions", []) or []}


def _template(rest: Rest, ns: str, name: str) -> dict[str, Any]:
    obj = wait_for(
        lambda: (o := rest.get(COMPUTE_DOMAINS, name, ns)).get("status", {}).get("channels") and o,
        what=f"{name}'s channel recorded",
    )
    domain = ComputeDomain.model_validate(obj)
    return objects.workload_claim_template(domain, domain.status.channels[0])


def _peer_block(hosts: Path) -> list[str]:
    lines = hosts.read_text().splitlines()
    start = lines.index(HOSTS_BEGIN)
    return sorted(line.split("\t")[0] for line in lines[start + 1 : -1])


def test_an_opted_in_domain_spans_two_cliques_with_one_imex_ensemble_each(
    control_plane: ControlPlane, rest: Rest, tmp_path: Path
) -> None:
    ns, driver_ns = unique("cd-cliques"), unique("cd-system")
    control_plane.create_namespace(ns)
    fabric_a, fabric_b = unique("clique-a"), unique("clique-b")
    nodes = {unique("ca"): fabric_a, unique("ca"): fabric_a, unique("cb"): fabric_b}
    nodes[unique("cb")] = fabric_b
    for node, fabric in nodes.items():
        create_plugin_node(control_plane, node, fabric)
    names = list(nodes)
    with running_controller(control_plane, driver_ns, leader_election=False):
        body = domain_body("span", num_nodes=4)
        body["spec"]["allowMultipleCliques"] = True
        rest.create(COMPUTE_DOMAINS, body, ns)
        template = _template(rest, ns, "span")
        # The gang counts nodes across cliques: three allocations are held, the fourth (in
        # the other clique) completes it.
        for i, node in enumerate(names[:3]):
            allocate_claim(rest, ns, template, node, f"s{i}", binding_conditions=True)
        wait_for(
            lambda: len(rest.get(COMPUTE_DOMAINS, "span", ns)["status"].get("nodes", [])) == 3,
            what="three nodes held",
        )
        assert cd.ADMITTED_CONDITION not in _conds(rest, ns, "s0")
        assert cd.CONFLICT_CONDITION not in _conds(rest, ns, "s2")  # the second clique fits
        allocate_claim(rest, ns, template, names[3], "s3", binding_conditions=True)
        for i in range(4):
            wait_for(
                lambda i=i: cd.ADMITTED_CONDITION in _conds(rest, ns, f"s{i}"),
                what=f"s{i} admitted with its gang across cliques",
            )
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "span", ns))
                and len(o["status"].get("nodes", [])) == 4
                and o
            ),
            what="four rows",
        )
        # Each row names its node's clique; indices (IMEX peer slots) count per clique.
        rows = obj["status"]["nodes"]
        assert {r["name"]: r["fabricDomain"] for r in rows} == nodes
        for fabric in (fabric_a, fabric_b):
            assert sorted(r["index"] for r in rows if r["fabricDomain"] == fabric) == [0, 1]
        assert obj["status"].get("fabricDomain", "") == ""
        assert condition(obj, cd.DEGRADED)["reason"] != "FabricConflict"  # type: ignore[index]
        rct = rest.get(CLAIM_TEMPLATES, "span-channel", ns)
        selector = rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]
        assert "fabricDomain" not in selector["cel"]["expression"]  # never pinned

        # Each node's daemon: IMEX gets only its own clique's peers.
        uid = obj["metadata"]["uid"]
        ips = {node: f"127.0.0.{i}" for i, node in enumerate(names, 11)}
        for node in names:  # the controller takes a report's IP only if it is the Node's
            give_addresses(control_plane, node, ips[node])
        daemons = {
            node: ImexDaemon(
                rest,
                DaemonIdentity(node, ips[node], ns, "span", uid, driver_ns),
                ImexSupervisor(
                    ImexSettings(
                        config_dir=tmp_path / node,
                        imex_bin=str(STAND_INS / "nvidia-imex"),
                        imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
                        cmd_port=_free_port(),
                    )
                ),
            )
            for node in names
        }
        try:

            def all_ready() -> bool:
                for d in daemons.values():
                    d.run_once()
                o = rest.get(COMPUTE_DOMAINS, "span", ns)
                return (condition(o, cd.READY) or {}).get("status") == "True"

            wait_for(all_ready, what="Ready=True with daemons in two cliques", timeout=60)
            for d in daemons.values():
                d.run_once()  # with every daemon's reported IP in status
            for node, fabric in nodes.items():
                clique = sorted(ips[n] for n, f in nodes.items() if f == fabric)
                assert _peer_block(tmp_path / node / "hosts") == clique, node
        finally:
            for d in daemons.values():
                d.supervisor.stop()
        rest.delete(COMPUTE_DOMAINS, "span", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "span", ns), "span deleted")


def _owner(rest: Rest, node: str) -> str:
    sl = rest.get(SLICES, objects.slice_name(node))
    channel = next(d for d in sl["spec"]["devices"] if d["name"] == cd.CHANNEL_DEVICE)
    return str(channel["attributes"][cd.ATTR_OWNER]["string"])


def test_an_incomplete_gang_across_two_cliques_times_out_as_one(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """numNodes 3 across two cliques, claims allocated on only two nodes, one in each clique
    and 3 s apart: both are held (rows listed, nodes held, no answer) while the gang waits;
    once the gang timeout has passed since the first was held, both are released together
    with GangTimeout (one timer for the domain, not one per clique: the second clique's claim
    goes with the first, 3 s before its own timer would have run out), the nodes are free
    again and the domain says it is waiting for nodes. The complement (a gang completed
    across two cliques is admitted together) is
    test_an_opted_in_domain_spans_two_cliques_with_one_imex_ensemble_each."""
    timeout, apart = 6.0, 3.0
    ns, driver_ns = unique("cd-cliqueto"), unique("cd-system")
    control_plane.create_namespace(ns)
    fabric_a, fabric_b = unique("clique-a"), unique("clique-b")
    a0, a1, b0, b1 = unique("ta"), unique("ta"), unique("tb"), unique("tb")
    for node, fabric in ((a0, fabric_a), (a1, fabric_a), (b0, fabric_b), (b1, fabric_b)):
        create_plugin_node(control_plane, node, fabric)  # 4 nodes: numNodes 3 fits
    with running_controller(
        control_plane, driver_ns, leader_election=False, gang_timeout_seconds=timeout
    ):
        body = domain_body("gangto", mode="host", num_nodes=3)
        body["spec"]["allowMultipleCliques"] = True
        rest.create(COMPUTE_DOMAINS, body, ns)
        template = _template(rest, ns, "gangto")
        uid = rest.get(COMPUTE_DOMAINS, "gangto", ns)["metadata"]["uid"]

        first = time.monotonic()
        allocate_claim(rest, ns, template, a0, "in-a", binding_conditions=True)
        wait_for(lambda: _owner(rest, a0) == uid, what=f"{a0} held for the gang")
        time.sleep(max(0.0, first + apart - time.monotonic()))
        second = time.monotonic()
        allocate_claim(rest, ns, template, b0, "in-b", binding_conditions=True)
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "gangto", ns))
                and len(o["status"].get("nodes", [])) == 2
                and o
            ),
            what="both nodes held",
        )
        # Waiting: each row names its clique (index 0 in each), both nodes are held for the
        # domain, and neither claim has an answer yet.
        assert time.monotonic() - first < timeout, "too slow to see the gang waiting"
        rows = obj["status"]["nodes"]
        assert {r["name"]: (r["fabricDomain"], r["index"]) for r in rows} == {
            a0: (fabric_a, 0),
            b0: (fabric_b, 0),
        }
        assert _owner(rest, b0) == uid
        for claim in ("in-a", "in-b"):
            assert _conds(rest, ns, claim) == {}, f"{claim} answered while its gang waits"

        released: dict[str, float] = {}
        deadline = time.monotonic() + timeout + 30
        while len(released) < 2 and time.monotonic() < deadline:
            for claim in ("in-a", "in-b"):
                if claim not in released and cd.CONFLICT_CONDITION in _conds(rest, ns, claim):
                    released[claim] = time.monotonic()
            time.sleep(0.1)
        assert set(released) == {"in-a", "in-b"}, f"released: {sorted(released)}"
        # Not before the gang's time (its timer starts when the first claim is held, after
        # `first`), and the second clique's claim with the first: one timer per domain.
        assert released["in-a"] - first >= timeout
        assert released["in-b"] - second < timeout - 1.0, (
            f"in-b released {released['in-b'] - second:.1f}s after its allocation: on a timer "
            f"of its own clique, not with its gang ({released['in-a'] - first:.1f}s)"
        )
        for claim in ("in-a", "in-b"):
            conds = _conds(rest, ns, claim)
            assert cd.ADMITTED_CONDITION not in conds
            assert conds[cd.CONFLICT_CONDITION]["reason"] == "GangTimeout"
            assert "in its cliques" in conds[cd.CONFLICT_CONDITION]["message"]
        # The nodes go back to the pool; the domain lists no node and waits for its 3.
        for node in (a0, b0):
            wait_for(lambda node=node: _owner(rest, node) == cd.FREE_OWNER, what=f"{node} free")
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "gangto", ns))
                and not o["status"].get("nodes")
                and o
            ),
            what="rows gone after the release",
        )
        ready = condition(obj, cd.READY)
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", "WaitingForNodes")
        assert "0/3" in ready["message"]
        said = [
            e["message"]
            for e in rest.list(EVENTS, ns)["items"]
            if e["involvedObject"].get("uid") == uid and e["reason"] == "NodeConflict"
        ]
        for claim in ("in-a", "in-b"):
            assert any(f"claim {claim}:" in m and "in its cliques" in m for m in said), said
        rest.delete(COMPUTE_DOMAINS, "gangto", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "gangto", ns), "gangto deleted")


def test_without_the_opt_in_a_second_clique_is_refused(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns, driver_ns = unique("cd-one"), unique("cd-system")
    control_plane.create_namespace(ns)
    home, away = unique("one-home"), unique("one-away")
    create_plugin_node(control_plane, home, unique("clique-home"))
    create_plugin_node(control_plane, away, unique("clique-away"))
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("single", mode="host"), ns)
        template = _template(rest, ns, "single")
        allocate_claim(rest, ns, template, home, "h", binding_conditions=True)
        wait_for(lambda: cd.ADMITTED_CONDITION in _conds(rest, ns, "h"), what="home admitted")
        allocate_claim(rest, ns, template, away, "a", binding_conditions=True)
        refused = wait_for(
            lambda: _conds(rest, ns, "a").get(cd.CONFLICT_CONDITION), what="away refused"
        )
        assert "allowMultipleCliques" in refused["message"]
        rest.delete(COMPUTE_DOMAINS, "single", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "single", ns), "single deleted")


def _row(rest: Rest, ns: str, name: str, node: str) -> dict[str, Any] | None:
    rows = rest.get(COMPUTE_DOMAINS, name, ns)["status"].get("nodes", []) or []
    return next((r for r in rows if r["name"] == node), None)


def test_a_held_node_moved_to_another_clique_keeps_its_row_until_its_claim_is_released(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 22 point 5. A held node is re-cabled into another clique (its fabric label
    changes) under a running domain. Its row keeps its old clique and index (the IMEX peers of
    both sides are not silently shrunk to themselves: today each side became its own
    ensemble and the domain said FabricConflict about its own node, with no way back); the
    domain says which node moved where (Ready and Degraded, reason CliqueChanged), also after
    a controller restart; once the node's claim is released it leaves the domain and the
    domain is Ready again."""
    ns, driver_ns = unique("cd-move"), unique("cd-system")
    control_plane.create_namespace(ns)
    stay, mover = unique("move-stay"), unique("move-mover")
    old, new = unique("clique-old"), unique("clique-new")
    create_plugin_node(control_plane, stay, old)
    create_plugin_node(control_plane, mover, old)
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("moved", mode="host"), ns)
        template = _template(rest, ns, "moved")
        for node, claim in ((stay, "s"), (mover, "m")):
            write_host_report(rest, driver_ns, node, ready=True, message="", lease_seconds=600)
            allocate_claim(rest, ns, template, node, claim, binding_conditions=True)
            wait_for(lambda c=claim: cd.ADMITTED_CONDITION in _conds(rest, ns, c), what=claim)
        wait_for(
            lambda: (
                (condition(rest.get(COMPUTE_DOMAINS, "moved", ns), cd.READY) or {}).get("status")
                == "True"
                and len(rest.get(COMPUTE_DOMAINS, "moved", ns)["status"]["nodes"]) == 2
            ),
            what="both nodes in, Ready",
        )
        before = _row(rest, ns, "moved", mover)
        assert before is not None
        assert before["fabricDomain"] == old

        rest.patch(NODES, mover, {"metadata": {"labels": {FABRIC_DOMAIN: new}}})
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "moved", ns))
                and (condition(o, cd.DEGRADED) or {}).get("reason") == "CliqueChanged"
                and o
            ),
            what="the domain says the node moved",
        )
        degraded = condition(obj, cd.DEGRADED) or {}
        ready = condition(obj, cd.READY) or {}
        assert degraded["status"] == "True"
        assert mover in degraded["message"]
        assert new in degraded["message"]
        assert old in degraded["message"]
        assert ready["status"] == "False"
        assert ready["reason"] == "CliqueChanged"
        # Its row (its IMEX peer slot in the old clique) is kept while its claim holds it.
        rows = {r["name"]: r for r in obj["status"]["nodes"]}
        assert rows[mover]["fabricDomain"] == old
        assert rows[mover]["index"] == before["index"]
        assert rows[stay]["fabricDomain"] == old
    with running_controller(control_plane, driver_ns, leader_election=False):
        # Restarted: the kept row is in the API, so the new controller keeps it too (a status
        # write forced by a new report on the moved node).
        write_host_report(rest, driver_ns, mover, ready=True, message="again", lease_seconds=600)
        row = wait_for(
            lambda: (r := _row(rest, ns, "moved", mover)) and r["message"] == "again" and r,
            what="the moved node's row after a restart",
        )
        assert row["fabricDomain"] == old
        assert row["index"] == before["index"]
        reason = (condition(rest.get(COMPUTE_DOMAINS, "moved", ns), cd.DEGRADED) or {}).get(
            "reason"
        )
        assert reason == "CliqueChanged"

        rest.delete(CLAIMS, "m", ns)
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "moved", ns))
                and _row(rest, ns, "moved", mover) is None
                and (condition(o, cd.READY) or {}).get("status") == "True"
                and o
            ),
            what="Ready again once the moved node's claim is released",
        )
        assert (condition(obj, cd.DEGRADED) or {}).get("status") == "False"
        assert [r["name"] for r in obj["status"]["nodes"]] == [stay]
        rest.delete(CLAIMS, "s", ns)
        rest.delete(COMPUTE_DOMAINS, "moved", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "moved", ns), "moved deleted")
