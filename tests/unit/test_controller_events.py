"""Which events cost the controller work (issue 22 point 10): a report Lease's heartbeat is
told from a new report, a Node event from one that changes what gang placement reads; and the
ownership state's by-domain view stays the reverse of its by-node one."""

from __future__ import annotations

import copy

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.api.computedomain import FREE_OWNER
from fabricdra.api.jsontypes import JSON
from fabricdra.controller.manager import only_renewed, placement_facts
from fabricdra.controller.ownership import Ownership


def _lease() -> JSON:
    return {
        "metadata": {
            "name": "imex-x",
            "namespace": "sys",
            "resourceVersion": "10",
            "labels": {cd.DOMAIN_LABEL: "uid-1"},
            "annotations": {cd.REPORT_READY: "true", cd.REPORT_MESSAGE: "READY"},
        },
        "spec": {"holderIdentity": "n1", "renewTime": "t1", "leaseDurationSeconds": 40},
    }


def test_a_renewal_alone_is_a_heartbeat() -> None:
    old = _lease()
    new = copy.deepcopy(old)
    new["metadata"]["resourceVersion"] = "11"
    new["spec"]["renewTime"] = "t2"
    assert only_renewed(old, new)


def test_a_changed_report_promise_or_label_is_not() -> None:
    old = _lease()
    for path, value in (
        (("metadata", "annotations", cd.REPORT_READY), "false"),
        (("metadata", "annotations", cd.REPORT_MESSAGE), "IMEX down"),
        (("spec", "leaseDurationSeconds"), 10),
        (("metadata", "labels", cd.DOMAIN_LABEL), "uid-2"),
    ):
        new = copy.deepcopy(old)
        new["spec"]["renewTime"] = "t2"
        where = new
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        assert not only_renewed(old, new), path
    assert not only_renewed(None, old)  # created
    assert not only_renewed(old, None)  # deleted


def _node(**labels_: str) -> JSON:
    return {
        "metadata": {"name": "n1", "labels": {labels.FABRIC_DOMAIN: "rack-a", **labels_}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_our_holder_label_changes_no_placement_fact() -> None:
    assert placement_facts(_node()) == placement_facts(_node(**{cd.DOMAIN_LABEL: "uid-1"}))


def test_what_placement_reads_is_seen() -> None:
    base = placement_facts(_node())
    cordoned = _node()
    cordoned["spec"]["unschedulable"] = True
    not_ready = _node()
    not_ready["status"]["conditions"][0]["status"] = "False"
    for other in (
        cordoned,
        not_ready,
        _node(**{labels.FABRIC_DOMAIN: "rack-b"}),
        _node(**{labels.VERIFIED: "true"}),
        # A fabric domain's check passed: gangs waiting for room may fit now (--fabric-check).
        _node(**{labels.FABRIC_VERIFIED: "true"}),
    ):
        assert placement_facts(other) != base
    assert placement_facts(None) != base  # added or deleted


def test_taints_and_switch_tiers_are_placement_facts() -> None:
    """Issue 28: placement counts untolerated taints (podfit.py) and reads the switch tiers
    (hierarchy.py): a taint removed or a tier label written may let a waiting gang fit."""
    from fabricdra.api.scaleout import TIER_LABELS

    base = placement_facts(_node())
    tainted = _node()
    tainted["spec"]["taints"] = [{"key": "ops/rma", "effect": "NoSchedule"}]
    assert placement_facts(tainted) != base
    prefer = _node()
    prefer["spec"]["taints"] = [{"key": "ops/rma", "effect": "PreferNoSchedule"}]
    assert placement_facts(prefer) == base  # no pod is kept off by it
    assert placement_facts(_node(**{TIER_LABELS[1]: "spine-1"})) != base


def test_held_nodes_follow_every_owner_change() -> None:
    own = Ownership()
    own.set_owner("n1", "a")
    own.set_owner("n2", "a")
    own.set_owner("n3", FREE_OWNER)
    assert own.nodes_of("a") == ["n1", "n2"]
    assert own.held_count() == 2
    own.set_owner("n2", "b")  # handed on: leaves a's nodes
    assert own.nodes_of("a") == ["n1"]
    assert own.nodes_of("b") == ["n2"]
    own.set_owner("n1", FREE_OWNER)
    own.forget_node("n2")
    assert own.nodes_of("a") == []
    assert own.nodes_of("b") == []
    assert own.held_count() == 0
    assert own.nodes_of(FREE_OWNER) == ["n1", "n3"]
