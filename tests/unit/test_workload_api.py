"""Issue 28 point 6, the pure parts: a ComputeDomain's gang size from the PodGroup its pods
belong to (Kubernetes Workload API, scheduling.k8s.io/v1alpha2) and the KEP-5732 topology
constraint narrowing placement's candidates (controller/workloads.py). The real API server's
side is tests/integration/test_workload_api.py."""

from __future__ import annotations

from typing import Any

import pytest

from fabricdra.api.computedomain import ComputeDomain, gang_size
from fabricdra.controller import capacity, workloads
from fabricdra.controller.placement import is_gang
from fabricdra.kube.rest import ApiError


def _domain(num_nodes: int | None = None, group: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"channel": {"resourceClaimTemplate": {"name": "job-channel"}}}
    if num_nodes is not None:
        spec["numNodes"] = num_nodes
    status: dict[str, Any] = {"fabricDomain": "rack-a"}
    if group is not None:
        status["podGroup"] = group
    return {
        "metadata": {"name": "job", "namespace": "team", "uid": "u-job"},
        "spec": spec,
        "status": status,
    }


GROUP = {"name": "job", "minCount": 4, "topologyKey": "fabricdra.io/network.tier-1"}


def test_the_gang_size_is_numnodes_else_the_recorded_podgroups_mincount() -> None:
    assert gang_size(_domain(2, GROUP)) == 2  # numNodes set: the user's word wins
    assert gang_size(_domain(None, GROUP)) == 4
    assert gang_size(_domain()) is None  # elastic
    model = ComputeDomain.model_validate(_domain(None, GROUP))
    assert model.num_nodes == 4
    assert is_gang(model)
    assert not is_gang(ComputeDomain.model_validate(_domain()))


def test_placement_capacity_counts_a_podgroup_gang_as_expected_nodes() -> None:
    """The nodes other gangs still expect (what free_nodes subtracts): a PodGroup gang of 4
    placed in rack-a holding none expects 4; before, a domain without numNodes expected none."""
    assert capacity.expected_by_fabric([_domain(None, GROUP)]) == {"rack-a": 4}
    assert capacity.expected_by_fabric([_domain()]) == {}


def test_a_recorded_podgroup_with_a_bad_mincount_is_refused() -> None:
    with pytest.raises(ValueError, match="minCount"):
        ComputeDomain.model_validate(_domain(None, {"name": "job", "minCount": 0}))


def _podgroup(policy: dict[str, Any], topology: list[dict[str, str]] | None = None) -> Any:
    spec: dict[str, Any] = {"schedulingPolicy": policy}
    if topology is not None:
        spec["schedulingConstraints"] = {"topology": topology}
    return {"metadata": {"name": "job", "namespace": "team"}, "spec": spec}


def test_a_gang_podgroup_gives_its_mincount_and_topology_key() -> None:
    pg = _podgroup({"gang": {"minCount": 3}}, [{"key": "fabricdra.io/fabric.domain"}])
    assert workloads.gang_of(pg) == workloads.Group("job", 3, "fabricdra.io/fabric.domain")
    assert workloads.gang_of(_podgroup({"gang": {"minCount": 3}})) == workloads.Group("job", 3)
    assert workloads.gang_of(_podgroup({"basic": {}})) is None  # no gang: the domain is elastic


def _pod(name: str, group: str | None, *templates: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "x"}],
        "resourceClaims": [
            {"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
        ]
        + [{"name": "own", "resourceClaimName": "shared"}],
        "nodeName": "n1",
    }
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": {"name": name, "namespace": "team", "uid": f"u-{name}"}, "spec": spec}


def test_the_pod_cache_keeps_a_pods_group_and_templates_only() -> None:
    view = workloads.pod_view(_pod("w0", "job", "job-channel", "gpus"))
    assert view["spec"] == {
        "schedulingGroup": {"podGroupName": "job"},
        "resourceClaims": [
            {"resourceClaimTemplateName": "job-channel"},
            {"resourceClaimTemplateName": "gpus"},
        ],
    }
    assert workloads.pod_templates(view) == ["team/gpus", "team/job-channel"]
    assert workloads.pod_group(view) == ["team/job"]
    # Out of any group: its templates still say which domains have pods (elastic ones).
    alone = workloads.pod_view(_pod("w1", None, "job-channel"))
    assert alone["spec"] == {"resourceClaims": [{"resourceClaimTemplateName": "job-channel"}]}
    assert workloads.pod_group(alone) == []
    bare = workloads.pod_view(_pod("w2", None))
    assert bare["spec"] == {}
    assert workloads.pod_templates(bare) == []
    assert workloads.domain_template(_domain()) == ["team/job-channel"]


def test_a_domains_group_is_its_pods_one_podgroup() -> None:
    pgs = {"team/job": _podgroup({"gang": {"minCount": 2}}), "team/other": _podgroup({"basic": {}})}
    pods = [workloads.pod_view(_pod(f"w{i}", "job", "job-channel")) for i in range(2)]
    assert workloads.group_of("team", "job-channel", pods, pgs.get) == (
        workloads.Group("job", 2),
        "",
    )
    assert workloads.group_of("team", "job-channel", [], pgs.get) == (None, "")
    group, why = workloads.group_of(
        "team", "job-channel", [_pod("x", "gone", "job-channel")], pgs.get
    )
    assert group is None
    assert "PodGroup gone" in why
    assert "does not exist" in why
    assert workloads.group_of(
        "team", "job-channel", [*pods, _pod("u", None, "job-channel")], pgs.get
    ) == (
        workloads.Group("job", 2),
        "",
    )  # a pod in no group beside them does not count
    mixed = [*pods, _pod("y", "other", "job-channel")]
    group, why = workloads.group_of("team", "job-channel", mixed, pgs.get)
    assert group is None
    assert "several PodGroups (job, other)" in why
    assert "numNodes" in why
    # A basic (not gang) group: no size, the domain stays elastic; nothing to complain about.
    basic = [_pod("z", "other", "job-channel")]
    assert workloads.group_of("team", "job-channel", basic, pgs.get) == (None, "")


def test_the_topology_constraint_keeps_each_racks_largest_free_switch_group() -> None:
    """Per fabric domain, only the nodes under the one value of the constraint's label with
    the most free nodes; unlabelled nodes never count."""
    labels = {"a1": "s1", "a2": "s1", "a3": "s2", "b1": "s3", "b2": "s4", "b3": "s4", "c1": ""}
    held = {"a1"}  # another domain holds a1: s1 has one free node, s2 one too (tie: s1)
    fabrics = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3"], "c": ["c1"]}
    out = workloads.narrow_to_topology(
        fabrics, "tier", lambda n: labels.get(n, ""), lambda n: n not in held
    )
    assert out == {"a": ["a1", "a2"], "b": ["b2", "b3"], "c": []}


def test_served_reads_the_api_groups_resources() -> None:
    def call(doc: Any) -> Any:
        def f(method: str, path: str) -> Any:
            assert (method, path) == ("GET", "/apis/scheduling.k8s.io/v1alpha2")
            if isinstance(doc, Exception):
                raise doc
            return doc

        return f

    assert workloads.served(call({"resources": [{"name": "podgroups"}, {"name": "workloads"}]}))
    assert not workloads.served(call({"resources": [{"name": "workloads"}]}))
    assert not workloads.served(call(ApiError(404, "not found")))
    with pytest.raises(ApiError):  # cannot tell: the caller says so (the CLI exits 1)
        workloads.served(call(ApiError(503, "unavailable")))


def test_workload_api_true_where_podgroups_are_not_served_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fabricdra.cli import controller as cli

    monkeypatch.setattr(workloads, "served", lambda call: False)
    assert cli._workload_api(object(), "false") is False
    assert cli._workload_api(object(), "auto") is False
    assert cli._workload_api(object(), "true") is None
    assert "does not serve scheduling.k8s.io/v1alpha2 PodGroups" in caplog.text
    monkeypatch.setattr(workloads, "served", lambda call: True)
    assert cli._workload_api(object(), "auto") is True


def test_the_reconciler_holds_the_template_until_the_pods_group_exists_then_records_it() -> None:
    """The domain reconciler from in-memory deps: a pod names the domain's template and a
    PodGroup that does not exist yet: no claim template (Ready WaitingForPods); once the group
    exists, its gang is recorded in status.podGroup before anything is made from it."""
    from fabricdra.api import computedomain as cd
    from fabricdra.controller import objects
    from fabricdra.controller.deps import DomainDeps
    from fabricdra.controller.domains import WAITING_FOR_PODS, DomainReconciler
    from fabricdra.controller.liveness import Heartbeats
    from fabricdra.controller.ownership import Ownership
    from fabricdra.controller.writes import Writer
    from fabricdra.kube.rest import CLAIM_TEMPLATES, COMPUTE_DOMAINS
    from tests.unit.test_reconciler_deps import MemApi, MemCache, _placement

    api = MemApi()
    body = {
        "metadata": {"name": "job", "namespace": "team", "uid": "u-job", "generation": 1},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "job-channel"}}, "imexMode": "host"},
    }
    domains, nodes, own = MemCache([api.create(COMPUTE_DOMAINS, body)]), MemCache(), Ownership()
    own.set_key("u-job", "team/job")
    pods = MemCache(
        [workloads.pod_view(_pod("w0", "job", "job-channel"))],
        {workloads.BY_TEMPLATE: workloads.pod_templates},
    )
    podgroups = MemCache()
    reconciler = DomainReconciler(
        DomainDeps(
            rest=api,
            writer=Writer(api, "test"),  # type: ignore[arg-type]
            domains=domains,
            claims=MemCache(),
            nodes=nodes,
            leases=MemCache(),
            templates=MemCache(),
            daemonsets=MemCache(),
            ownership=own,
            placement=_placement(api, domains, nodes, own),
            heartbeats=Heartbeats(),
            namespace="fabricdra-system",
            daemon=objects.DaemonSettings(),
            channel_count=cd.CHANNEL_COUNT,
            requeue_after=lambda key, delay: None,
            pods=pods,
            podgroups=podgroups,
        )
    )

    def reconcile() -> dict[str, Any]:
        domains.objs["team/job"] = api.get(COMPUTE_DOMAINS, "job", "team")  # the watch's echo
        reconciler.reconcile("team/job")
        return api.get(COMPUTE_DOMAINS, "job", "team")

    stored = reconcile()
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == cd.READY)
    assert (ready["status"], ready["reason"]) == ("False", WAITING_FOR_PODS)
    assert "PodGroup job (named by the domain's pods) does not exist yet" in ready["message"]
    assert api.get_or_none(CLAIM_TEMPLATES, "job-channel", "team") is None
    assert "podGroup" not in stored["status"]

    podgroups.objs["team/job"] = _podgroup({"gang": {"minCount": 2}}, [{"key": "k"}])
    stored = reconcile()
    assert stored["status"]["podGroup"] == {"name": "job", "minCount": 2, "topologyKey": "k"}
    assert api.get_or_none(CLAIM_TEMPLATES, "job-channel", "team") is not None
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == cd.READY)
    assert ready["reason"] != WAITING_FOR_PODS
