"""The controller's pure parts: channel allocation, node admission, status, objects, queue."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.controller import admission, channels, objects, placement, status
from fabricdra.controller.admission import ClaimOnNode
from fabricdra.controller.workqueue import WorkQueue

A, B = "uid-a", "uid-b"


def _domain(**status_: object) -> ComputeDomain:
    return ComputeDomain.model_validate(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": A, "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}, "numNodes": 2},
            "status": status_,
        }
    )


# -- channels --------------------------------------------------------------------------------
def test_lowest_free_channel_fills_holes() -> None:
    assert channels.lowest_free([]) == 0
    assert channels.lowest_free([0, 1, 3]) == 2
    with pytest.raises(channels.ChannelsExhausted):
        channels.lowest_free(range(4), count=4)


def test_duplicate_channels_are_reported() -> None:
    assert channels.duplicates({"a": [1], "b": [1], "c": [2]}) == {1: ["a", "b"]}


# -- admission -------------------------------------------------------------------------------
def _claim(key: str, domain: str, state: str = "pending", since: str = "t1") -> ClaimOnNode:
    return ClaimOnNode(key=key, domain=domain, state=state, since=since)


def test_first_pending_claim_wins_a_free_node_and_others_conflict() -> None:
    claims = [
        _claim("ns/b", B, since="t2"),
        _claim("ns/a1", A, since="t1"),
        _claim("ns/a2", A, since="t3"),
    ]
    d = admission.decide("n1", "rack", claims, {A: None, B: None})
    assert d.owner == A
    assert d.admit == ["ns/a1", "ns/a2"]
    assert [k for k, _ in d.conflicts] == ["ns/b"]
    assert "held by another ComputeDomain" in d.conflicts[0][1]
    assert d.fabric_pins == {A: "rack"}


def test_a_node_held_refusal_names_the_holder() -> None:
    """`kubectl describe` on a refused claim (or the NodeConflict event) says which domain
    holds the node by name, not only by UID: the first thing a user stuck NodeHeld needs."""
    claims = [_claim("ns/a", A, "admitted"), _claim("ns/b", B, since="t0")]
    d = admission.decide(
        "n1", "rack", claims, {A: "rack", B: None}, current_owner=A, names={A: "team/train"}
    )
    assert d.conflicts == [
        ("ns/b", f"node n1 is held by another ComputeDomain, team/train (UID {A})")
    ]


def test_admitted_owner_keeps_the_node() -> None:
    claims = [_claim("ns/a", A, "admitted", "t9"), _claim("ns/b", B, since="t0")]
    d = admission.decide("n1", "rack", claims, {A: "rack", B: None}, current_owner=A)
    assert (d.owner, d.admit, [k for k, _ in d.conflicts]) == (A, [], ["ns/b"])


def test_node_is_free_without_claims_and_a_gone_domain_gets_nothing() -> None:
    assert admission.decide("n1", "", [], {A: None}, current_owner=A).owner == cd.FREE_OWNER
    d = admission.decide("n1", "", [_claim("ns/x", "gone")], {A: None})
    assert d.owner == cd.FREE_OWNER
    assert "no longer exists" in d.conflicts[0][1]


def test_a_domain_never_spans_two_fabric_domains() -> None:
    d = admission.decide("n2", "rack-2", [_claim("ns/a", A)], {A: "rack-1"})
    assert d.owner == cd.FREE_OWNER
    assert "never spans two" in d.conflicts[0][1]


def test_just_admitted_owner_survives_a_stale_cache() -> None:
    # The controller admitted A a moment ago; the claim still looks pending in its cache while
    # B's claim arrived earlier in time: A must keep the node.
    claims = [_claim("ns/a", A, since="t5"), _claim("ns/b", B, since="t1")]
    d = admission.decide("n1", "", claims, {A: "", B: None}, current_owner=A)
    assert (d.owner, d.admit) == (A, ["ns/a"])


# -- status ----------------------------------------------------------------------------------
def _obs(held: list[str], reports: dict[str, status.DaemonReport]) -> status.Observed:
    return status.Observed(
        True, "ok", [status.HeldNode(n, f"10.0.0.{i}", "rack") for i, n in enumerate(held)], reports
    )


def test_indices_are_stable_and_newcomers_take_the_lowest_free() -> None:
    first, _ = status.compute(_domain(channels=[4]), _obs(["n1", "n2"], {}), "t0")
    assert [(r.name, r.index) for r in first.nodes] == [("n1", 0), ("n2", 1)]
    again = _domain(**first.model_dump(mode="json"))
    later, events = status.compute(again, _obs(["n2", "n3"], {}), "t1")
    assert {(r.name, r.index) for r in later.nodes} == {("n2", 1), ("n3", 0)}
    assert {e.reason for e in events} >= {"NodeJoined", "NodeLeft"}


def test_ready_needs_every_node_and_the_expected_count() -> None:
    ok = status.DaemonReport(True, "READY", "192.0.2.9")
    st, _ = status.compute(_domain(channels=[0]), _obs(["n1"], {"n1": ok}), "t0")
    ready = {c.type: c for c in st.conditions}
    assert (ready[cd.READY].status, ready[cd.READY].reason) == ("False", "WaitingForNodes")
    assert st.nodes[0].ipAddress == "192.0.2.9"  # the daemon's own IP wins
    st, events = status.compute(
        _domain(channels=[0]), _obs(["n1", "n2"], {"n1": ok, "n2": ok}), "t0"
    )
    assert {c.type: c.status for c in st.conditions}[cd.READY] == "True"
    assert st.fabricDomain == "rack"
    assert [e.reason for e in events if e.reason.startswith("Ready")] == ["ReadyTrue"]


def test_imex_errors_surface_as_degraded_and_recovery_is_an_event() -> None:
    bad = status.DaemonReport(False, "nvidia-imex not found: this host has no IMEX binary")
    st, events = status.compute(_domain(channels=[0]), _obs(["n1"], {"n1": bad}), "t0")
    cond = {c.type: c for c in st.conditions}
    assert (cond[cd.DEGRADED].status, cond[cd.DEGRADED].reason) == ("True", "ImexError")
    assert "no IMEX binary" in cond[cd.DEGRADED].message
    assert cond[cd.DAEMONS_READY].reason == "ImexNotReady"
    assert any(e.type == "Warning" for e in events)
    ok = status.DaemonReport(True, "READY")
    st2, events2 = status.compute(
        _domain(**st.model_dump(mode="json")), _obs(["n1"], {"n1": ok}), "t1"
    )
    assert {c.type: c.status for c in st2.conditions}[cd.DEGRADED] == "False"
    assert "Recovered" in {e.reason for e in events2}
    # The transition time of an unchanged condition stays put.
    st3, events3 = status.compute(
        _domain(**st2.model_dump(mode="json")), _obs(["n1"], {"n1": ok}), "t2"
    )
    assert status.status_patch(st2, st3) is None
    assert events3 == []


def test_a_domain_without_fabric_is_ready_without_imex_and_says_so() -> None:
    """Issue 22 point 7: on nodes without a multi-node NVLink fabric (HGX, PCIe) the daemons
    run no IMEX and report ready; DaemonsReady says IMEX is not used (reason NoFabric)."""
    held = [status.HeldNode(n, f"10.0.0.{i}", "") for i, n in enumerate(["h1", "h2"])]
    ok = status.DaemonReport(True, "no NVLink fabric on this node: IMEX is not run")
    obs = status.Observed(True, "ok", held, {"h1": ok, "h2": ok})
    st, _ = status.compute(_domain(channels=[3]), obs, "t0")
    cond = {c.type: c for c in st.conditions}
    assert cond[cd.READY].status == "True"
    assert (cond[cd.DAEMONS_READY].status, cond[cd.DAEMONS_READY].reason) == ("True", "NoFabric")
    assert "IMEX is not run" in cond[cd.DAEMONS_READY].message
    assert "channel still isolates" in cond[cd.DAEMONS_READY].message
    assert cond[cd.DEGRADED].status == "False"
    # Nodes with a fabric: IMEX daemons, as before.
    st, _ = status.compute(_domain(channels=[3]), _obs(["n1", "n2"], {"n1": ok, "n2": ok}), "t0")
    assert {c.type: c for c in st.conditions}[cd.DAEMONS_READY].reason == "AllDaemonsReady"


# -- objects ---------------------------------------------------------------------------------
def test_workload_template_selects_free_or_own_channel_and_carries_sorted_config() -> None:
    rct = objects.workload_claim_template(_domain(), 7)
    assert rct["metadata"]["ownerReferences"][0]["uid"] == A
    request = rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert f"in ['{cd.FREE_OWNER}', '{A}']" in request["selectors"][0]["cel"]["expression"]
    params = rct["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["channel"] == 7
    assert list(params) == sorted(params)


def test_node_slice_channel_is_shared_and_gated_by_binding_conditions() -> None:
    sl = objects.node_slice("n1", "node-uid", A, "rack", 3)
    channel = sl["spec"]["devices"][0]
    assert channel["allowMultipleAllocations"] is True
    assert channel["bindingConditions"] == [cd.ADMITTED_CONDITION]
    assert channel["attributes"][cd.ATTR_OWNER] == {"string": A}
    assert sl["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}


def test_differs_ignores_server_added_fields() -> None:
    assert not objects.differs({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}, "d": 3})
    assert objects.differs({"a": [1, 2]}, {"a": [1]})


# -- work queue ------------------------------------------------------------------------------
def test_queue_dedups_and_requeues_keys_added_while_active() -> None:
    q = WorkQueue()
    q.add("k")
    q.add("k")
    assert q.get(0.1) == "k"
    assert q.get(0.01) is None  # deduplicated
    q.add("k")  # arrives while "k" is being processed
    assert q.get(0.01) is None  # never twice at once
    q.done("k")
    assert q.get(0.1) == "k"
    q.done("k")
    q.add_after("late", 0.05)
    assert q.get(1.0) == "late"
    q.close()


def test_closed_queue_releases_waiting_workers() -> None:
    q = WorkQueue()
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.close()
    t.join(2)
    assert got == [None]


def test_host_mode_surfaces_the_host_imex_report() -> None:
    host = _domain(channels=[1]).model_copy(deep=True)
    host.spec.imexMode = "host"
    host.spec.numNodes = None
    down = status.DaemonReport(False, "host IMEX service not ready: answered UNAVAILABLE")
    st, _ = status.compute(host, _obs(["n1"], {"n1": down}), "t0")
    cond = {c.type: c for c in st.conditions}
    assert (cond[cd.READY].status, cond[cd.DEGRADED].reason) == ("False", "ImexError")
    assert "UNAVAILABLE" in cond[cd.DEGRADED].message
    # No report from the node plugin: not ready (unknown is not READY), and it says so.
    st, _ = status.compute(host, _obs(["n1"], {}), "t0")
    cond = {c.type: c for c in st.conditions}
    assert (cond[cd.READY].status, cond[cd.DAEMONS_READY].reason) == ("False", "WaitingForDaemons")
    assert st.nodes[0].ready is False
    up = status.DaemonReport(True, "host IMEX service READY")
    st, _ = status.compute(host, _obs(["n1"], {"n1": up}), "t0")
    cond = {c.type: c for c in st.conditions}
    assert (cond[cd.READY].status, cond[cd.DAEMONS_READY].reason) == ("True", "HostManaged")


def test_a_claim_speaks_only_for_a_domain_of_its_own_namespace() -> None:
    from fabricdra.controller.claims import claim_views as _claim_views

    def claim(namespace: str) -> dict[str, object]:
        return {
            "metadata": {
                "name": "c",
                "namespace": namespace,
                "labels": {cd.DOMAIN_LABEL: "uid-a"},
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "driver": cd.DRIVER,
                                "pool": "n1",
                                "device": cd.CHANNEL_DEVICE,
                                "request": "channel",
                            }
                        ]
                    }
                }
            },
        }

    domains = {"uid-a": "team-a"}
    (own,) = _claim_views(claim("team-a"), "n1", domains)
    assert own.domain == "uid-a"
    # The label is the user's to set: a claim in another namespace naming domain A's UID
    # must not hold the node for A.
    (forged,) = _claim_views(claim("team-b"), "n1", domains)
    assert forged.domain == ""


def test_a_domain_too_large_for_its_fabric_says_so() -> None:
    d = _domain(channels=[1])
    obs = status.Observed(True, "ok", [], {}, too_large="numNodes 40 cannot fit: …")
    st, _ = status.compute(d, obs, "t0")
    cond = {c.type: c for c in st.conditions}
    assert (cond[cd.READY].status, cond[cd.READY].reason) == ("False", "FabricTooSmall")


def test_a_silent_daemon_degrades_the_domain() -> None:
    d = _domain(channels=[1]).model_copy(deep=True)
    d.spec.numNodes = None
    silent = status.DaemonReport(False, "no heartbeat for 41s", silent=True)
    st, _ = status.compute(d, _obs(["n1"], {"n1": silent}), "t0")
    cond = {c.type: c for c in st.conditions}
    assert (cond[cd.DEGRADED].status, cond[cd.DEGRADED].reason) == ("True", "DaemonUnresponsive")
    assert cond[cd.DAEMONS_READY].reason == "DaemonUnresponsive"
    assert st.nodes[0].ready is False


def test_the_default_imex_image_is_this_release_never_latest() -> None:
    """Issue 9: the daemons run the controller's own release, the chart's appVersion."""
    from importlib.metadata import version

    import yaml

    from fabricdra.controller.objects import DEFAULT_IMAGE, DaemonSettings

    chart = yaml.safe_load((Path(__file__).parents[2] / "charts/fabricdra/Chart.yaml").read_text())
    assert DaemonSettings().image == DEFAULT_IMAGE
    assert DEFAULT_IMAGE.rsplit(":", 1)[1] == version("fabricdra") == chart["appVersion"]


def test_imex_daemons_run_as_root_without_escalation() -> None:
    # The image's default user (65532) can neither write the plugin's per-domain host folder
    # nor open the root-only fabric-imex-mgmt capability device.
    ds = objects.daemon_set(_domain(), objects.DaemonSettings())
    ctx = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert ctx == {"runAsUser": 0, "runAsGroup": 0, "allowPrivilegeEscalation": False}


# -- gang placement --------------------------------------------------------------------------
def test_gangs_are_placed_counting_what_other_gangs_still_expect() -> None:
    """Two racks of 4 nodes, gangs of 3: today's scheduler-only placement let both start in
    rack-a and split it (neither reaches 3); placed one at a time, the second goes to rack-b,
    and a third fits nowhere (1 free node in each rack) instead of taking a partial place."""
    fabrics = {"rack-a": ["a0", "a1", "a2", "a3"], "rack-b": ["b0", "b1", "b2", "b3"]}
    owners = {n: cd.FREE_OWNER for nodes in fabrics.values() for n in nodes}
    free = placement.free_nodes(fabrics, owners, [], "x")
    assert placement.best_fit(3, free) == "rack-a"
    x = placement.Gang("x", 3, "rack-a")
    free = placement.free_nodes(fabrics, owners, [x], "y")
    assert free == {"rack-a": 1, "rack-b": 4}
    assert placement.best_fit(3, free) == "rack-b"
    y = placement.Gang("y", 3, "rack-b")
    assert placement.best_fit(3, placement.free_nodes(fabrics, owners, [x, y], "z")) is None
    # Nodes a gang already holds count once (held, not also expected); a node another
    # domain holds is not free; the gang's own nodes are.
    owners.update({"a0": "x", "a1": "x", "a3": "elastic"})
    assert placement.free_nodes(fabrics, owners, [x], "y") == {"rack-a": 0, "rack-b": 4}
    assert placement.free_nodes(fabrics, owners, [x], "x")["rack-a"] == 1 + 2


def test_best_fit_leaves_the_largest_gangs_placeable() -> None:
    """Issue 28 point 4b, the review's sequence: racks with 18, 17 and 12 usable trays (in
    name order), gangs of 12, 17 and 18 arriving in that order. First fit by name put the 12
    in the 18-tray rack and the 18 waited for ever; best fit puts each gang in the tightest
    hole, and all three are placed."""
    fabrics = {
        rack: [f"{rack}-{i}" for i in range(size)]
        for rack, size in (("rack-a", 18), ("rack-b", 17), ("rack-c", 12))
    }
    owners = {n: cd.FREE_OWNER for nodes in fabrics.values() for n in nodes}
    gangs: list[placement.Gang] = []
    for uid, want in (("g12", 12), ("g17", 17), ("g18", 18)):
        fabric = placement.best_fit(want, placement.free_nodes(fabrics, owners, gangs, uid))
        assert fabric is not None, f"gang of {want} waits: {gangs}"
        gangs.append(placement.Gang(uid, want, fabric))
    assert {g.uid: g.fabric for g in gangs} == {"g12": "rack-c", "g17": "rack-b", "g18": "rack-a"}
    # Ties go by name, and a gang that fits nowhere is not placed.
    assert placement.best_fit(4, {"b": 5, "a": 5, "c": 9}) == "a"
    assert placement.best_fit(19, {"a": 18}) is None


def test_a_placed_gang_records_its_fabric_and_too_large_wins_over_waiting() -> None:
    d = _domain(channels=[1])
    obs = status.Observed(True, "ok", [], {}, placed="rack-b")
    st, _ = status.compute(d, obs, "t0")
    assert st.fabricDomain == "rack-b"
    waiting = status.Observed(
        False, "no room", [], {}, objects_reason="WaitingForFabric", too_large="numNodes 40 …"
    )
    st, _ = status.compute(d, waiting, "t0")
    ready = {c.type: c for c in st.conditions}[cd.READY]
    assert ready.reason == "FabricTooSmall"
    no_room = status.Observed(False, "no room", [], {}, objects_reason="WaitingForFabric")
    st, _ = status.compute(d, no_room, "t0")
    assert {c.type: c for c in st.conditions}[cd.READY].reason == "WaitingForFabric"
