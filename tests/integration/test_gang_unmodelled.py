"""Issue 28 point 4c against a real kube-apiserver and a running controller: a gang is not
placed on a rack with a tray tainted against its pods, and an elastic domain's claim on the
last free tray a placed gang expects is refused at binding (`ReservedForGang`) instead of
taking it (the gang then cycled through gang timeouts, its claims pinned to that rack)."""

from __future__ import annotations

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIM_TEMPLATES, CLAIMS, COMPUTE_DOMAINS, NODES, Rest

from .computedomain_helpers import (
    allocate_claim,
    create_plugin_node,
    domain_body,
    new_namespace,
    running_controller,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]


def _placed(rest: Rest, ns: str, name: str) -> str:
    return str(rest.get(COMPUTE_DOMAINS, name, ns).get("status", {}).get("fabricDomain") or "")


def _answer(rest: Rest, ns: str, claim: str) -> dict[str, str]:
    devices = rest.get(CLAIMS, claim, ns)["status"].get("devices", []) or []
    return {c["type"]: c["reason"] for d in devices for c in d.get("conditions", []) or []}


def test_untolerated_taint_and_elastic_domain_on_a_gangs_tray(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-fit"), unique("cd-system")
    racks = [unique("0000fita"), unique("0000fitb"), unique("0000fitc")]  # sort first
    nodes = {rack: [unique("fit"), unique("fit")] for rack in racks}
    for rack, names in nodes.items():
        for n in names:
            create_plugin_node(control_plane, n, rack)
    taint = {"key": "ops.example.com/rma", "value": "tray", "effect": "NoSchedule"}
    rest.patch(NODES, nodes[racks[0]][1], {"spec": {"taints": [taint]}})
    with running_controller(control_plane, driver_ns, leader_election=False):
        # The tainted tray is no room: the gang goes to the second rack, not the first.
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)
        assert wait_for(lambda: _placed(rest, ns, "gang"), what="gang placed") == racks[1]
        # An elastic domain's pod scheduled onto a tray the gang expects: refused there.
        rest.create(COMPUTE_DOMAINS, domain_body("elastic", mode="host"), ns)
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "elastic-channel", ns), what="template"
        )
        allocate_claim(rest, ns, template, nodes[racks[1]][0], "el-0", binding_conditions=True)
        refused = wait_for(
            lambda: _answer(rest, ns, "el-0").get(cd.CONFLICT_CONDITION), what="refused"
        )
        assert refused == "ReservedForGang"
        # On the free third rack it is admitted.
        allocate_claim(rest, ns, template, nodes[racks[2]][0], "el-1", binding_conditions=True)
        admitted = wait_for(
            lambda: _answer(rest, ns, "el-1").get(cd.ADMITTED_CONDITION), what="admitted"
        )
        assert admitted == "Admitted"
