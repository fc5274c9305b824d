"""The multi-node NVLink check's launch against a real kube-apiserver (issue 18 point 4), run
as a non-admin user with exactly the controller's rules (rbac.CONTROLLER cluster-wide,
rbac.CONTROLLER_NAMESPACED in its namespace): the API server accepts every object of a run
(the ComputeDomain, the Secret and Service it owns, pinned worker pods; the launcher only once
the workers run), a run whose pods never start (no kubelet here) ends NotRun saying why, and
leaves nothing behind;
a controller's leftovers are deleted by the next one's cleanup."""

from __future__ import annotations

import pytest
from kubernetes import config as kube_config

from e2e.harness.controlplane import ControlPlane
from fabricdra.controller import rbac
from fabricdra.controller.fabriccheckrun import (
    RUN_LABEL,
    KubeRunner,
    RunSettings,
    objects,
    own,
    run_name,
)
from fabricdra.controller.sshkey import new_pair
from fabricdra.kube.rest import COMPUTE_DOMAINS, PODS, SECRETS, SERVICES, Rest

from .computedomain_helpers import new_namespace, unique
from .test_computedomain_controller import (
    RBAC_BINDINGS,
    RBAC_NS_BINDINGS,
    RBAC_NS_ROLES,
    RBAC_ROLES,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]


def _as_controller(control_plane: ControlPlane, rest: Rest, ns: str) -> Rest:
    user = unique("fabricdra-fabric-check")
    rest.create(RBAC_ROLES, rbac.cluster_role(user, rbac.CONTROLLER))
    rest.create(RBAC_BINDINGS, rbac.binding_for_user(user, user, user))
    rest.create(RBAC_NS_ROLES, rbac.role(user, ns, rbac.CONTROLLER_NAMESPACED), ns)
    rest.create(RBAC_NS_BINDINGS, rbac.role_binding_for_user(user, ns, user, user), ns)
    kubeconfig = control_plane.kubeconfig_for(user, user)
    return Rest(kube_config.new_client_from_config(config_file=str(kubeconfig)))


def _left(rest: Rest, ns: str) -> list[str]:
    out = []
    for kind in (COMPUTE_DOMAINS, PODS):
        for obj in rest.list(kind, ns, label_selector=RUN_LABEL)["items"]:
            if not obj["metadata"].get("deletionTimestamp"):
                out.append(f"{kind.plural}/{obj['metadata']['name']}")
    return out


def test_a_run_whose_pods_never_start_is_not_run_and_leaves_nothing(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns = new_namespace(control_plane, "fc-run")
    as_controller = _as_controller(control_plane, rest, ns)
    seen: dict[str, list[dict[str, object]]] = {}

    def sleep(_: float) -> None:
        # While the run waits: every object is there, as the controller's user created it.
        if not seen:
            for kind in (COMPUTE_DOMAINS, PODS, SECRETS, SERVICES):
                seen[kind.plural] = rest.list(kind, ns, label_selector=RUN_LABEL)["items"]

    settings = RunSettings(image="registry.invalid/fabricdra-verify:test", namespace=ns,
                           timeout_seconds=1.0)  # fmt: skip
    runner = KubeRunner(as_controller, settings, poll_seconds=0.2, start_seconds=1.0, sleep=sleep)
    result = runner.run("nvlink-run-1", {"tray-1": 4, "tray-2": 4}, 335.0)
    assert result.outcome == "NotRun"
    assert result.reason.startswith(
        "the check did not finish: the workers still not running after 1 s"
    )
    domain = seen["computedomains"][0]
    name = domain["metadata"]["name"]
    assert name.startswith(run_name("nvlink-run-1", ""))
    assert f"{name}-w0: " in result.reason  # why each worker has not started
    pods = {p["metadata"]["name"]: p for p in seen["pods"]}
    # No launcher: it is created once the workers run, to be told their pod IPs.
    assert set(pods) == {f"{name}-w0", f"{name}-w1"}
    assert pods[f"{name}-w1"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "tray-2"}
    for obj in [*seen["pods"], *seen["secrets"], *seen["services"]]:
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["kind"], r["uid"]) for r in refs] == [
            ("ComputeDomain", domain["metadata"]["uid"])
        ]
    assert _left(rest, ns) == []


def test_a_new_controller_deletes_the_checks_an_earlier_one_left(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns = new_namespace(control_plane, "fc-left")
    as_controller = _as_controller(control_plane, rest, ns)
    settings = RunSettings(image="registry.invalid/fabricdra-verify:test", namespace=ns)
    # What a controller killed mid-check left: everything a run creates (no `finally` ran).
    bodies = objects("nvlink-left-1", ["tray-1", "tray-2"], 4, settings, new_pair())
    domain = as_controller.create(COMPUTE_DOMAINS, bodies["computedomains"][0], ns)
    for kind in (SECRETS, SERVICES, PODS):
        for body in bodies[kind.plural]:
            as_controller.create(kind, own(body, domain), ns)
    assert len(_left(rest, ns)) == 4  # the ComputeDomain and its three pods
    KubeRunner(as_controller, settings).cleanup()
    assert _left(rest, ns) == []


def test_a_controller_that_stops_mid_run_stops_waiting_and_deletes_its_run(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """It lost the lead: a new leader may start its own run of the domain; this one ends its
    own (a run of its own id) instead of waiting out the timeout."""
    ns = new_namespace(control_plane, "fc-stop")
    as_controller = _as_controller(control_plane, rest, ns)
    settings = RunSettings(image="registry.invalid/fabricdra-verify:test", namespace=ns,
                           timeout_seconds=3600.0)  # fmt: skip
    runner = KubeRunner(as_controller, settings, poll_seconds=0.1, stopped=lambda: True)
    result = runner.run("nvlink-stop-1", {"tray-1": 4, "tray-2": 4}, 335.0)
    assert result.outcome == "NotRun"
    assert result.reason.startswith("the check did not finish: the controller is stopping")
    assert _left(rest, ns) == []
