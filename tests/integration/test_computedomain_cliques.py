"""Multi-clique ComputeDomains (issue 11 point 13) against a real kube-apiserver: with
`allowMultipleCliques: true` a domain's nodes come from two NVLink fabric domains, its gang
counts nodes across them, its status shows each node's clique with indices per clique, and
each node's IMEX daemon (the real daemon code, stand-in IMEX executables) gets only its own
clique's peers; without the opt-in a domain still refuses a second clique."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.rest import CLAIM_TEMPLATES, CLAIMS, COMPUTE_DOMAINS, Rest
from fabricdra.controller import objects
from fabricdra.kubeletplugin.computedomain.daemon import DaemonIdentity, ImexDaemon
from fabricdra.kubeletplugin.computedomain.imex import HOSTS_BEGIN, ImexSettings, ImexSupervisor

from .computedomain_helpers import (
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    install_crd,
    running_controller,
    unique,
    wait_gone,
)

pytestmark = pytest.mark.integration
STAND_INS = Path(__file__).resolve().parents[1] / "imex"


@pytest.fixture(scope="module")
def rest(control_plane: ControlPlane) -> Rest:
    r = Rest(control_plane.api_client())
    install_crd(r)
    return r


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
