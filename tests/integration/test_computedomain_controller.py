"""The ComputeDomain controller against a real kube-apiserver: objects, owners, status,
channels, cleanup, restart safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.controller import rbac
from fabricdra.controller.manager import Controller, ControllerConfig
from fabricdra.controller.objects import DaemonSettings, slice_name
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    DEVICE_CLASSES,
    EVENTS,
    SLICES,
    ApiError,
    Kind,
    Rest,
)

from .computedomain_helpers import (
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    give_addresses,
    new_namespace,
    report_daemon,
    running_controller,
    unique,
    wait_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]
RBAC_ROLES = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", False)
RBAC_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False)
RBAC_NS_ROLES = Kind("rbac.authorization.k8s.io", "v1", "roles", True)
RBAC_NS_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", True)


def _delete_and_wait(rest: Rest, ns: str, name: str) -> None:
    rest.delete(COMPUTE_DOMAINS, name, ns)
    wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, name, ns), f"domain {name} deleted")


def test_create_makes_owned_objects_and_status(control_plane: ControlPlane, rest: Rest) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-user"), unique("cd-system")
    # numNodes=2: the gang is placed in a fabric domain with 2 free nodes before its claim
    # template is made; other tests' fabric domains in this API server may be full.
    rack = unique("0user")
    for _ in range(2):
        create_plugin_node(control_plane, unique("user-node"), rack)
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("job", rct="job-imex", num_nodes=2), ns)
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "job", ns)).get("status", {}).get("conditions")
                and o
            ),
            what="status written",
        )
        uid = obj["metadata"]["uid"]
        assert cd.FINALIZER in obj["metadata"]["finalizers"]
        assert len(obj["status"]["channels"]) == 1

        rct = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "job-imex", ns), what="RCT")
        assert rct["metadata"]["ownerReferences"][0]["uid"] == uid
        assert rct["spec"]["metadata"]["labels"][cd.DOMAIN_LABEL] == uid
        params = rct["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
        assert params["channel"] == obj["status"]["channels"][0]
        assert params["domainUID"] == uid

        sel = f"{cd.DOMAIN_LABEL}={uid}"
        ds = wait_for(
            lambda: rest.list(DAEMON_SETS, driver_ns, label_selector=sel)["items"], what="DaemonSet"
        )
        assert len(ds) == 1
        assert ds[0]["spec"]["template"]["spec"]["nodeSelector"] == {cd.DOMAIN_LABEL: uid}
        daemon_rcts = rest.list(CLAIM_TEMPLATES, driver_ns, label_selector=sel)["items"]
        assert len(daemon_rcts) == 1

        # numNodes=2 and no node has joined: not Ready, and it says why.
        ready = condition(obj, cd.READY)
        assert ready is not None
        assert ready["status"] == "False"
        assert condition(obj, cd.DEGRADED)["status"] == "False"  # type: ignore[index]
        reasons = {
            e["reason"] for e in rest.list(EVENTS, ns)["items"] if e["involvedObject"]["uid"] == uid
        }
        assert "ReadyFalse" in reasons

        # Delete: the claim templates and the DaemonSet go first, then the domain itself.
        _delete_and_wait(rest, ns, "job")
        assert rest.get_or_none(CLAIM_TEMPLATES, "job-imex", ns) is None
        assert rest.list(DAEMON_SETS, driver_ns, label_selector=sel)["items"] == []
        assert rest.list(CLAIM_TEMPLATES, driver_ns, label_selector=sel)["items"] == []


def test_host_mode_creates_no_daemons(control_plane: ControlPlane, rest: Rest) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-host"), unique("cd-system")
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("hostjob", mode="host"), ns)
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "hostjob", ns))
                and (condition(o, cd.READY) or {}).get("status") == "True"
                and o
            ),
            what="host-mode domain Ready",
        )
        assert condition(obj, cd.DAEMONS_READY)["reason"] == "HostManaged"  # type: ignore[index]
        assert rest.get_or_none(CLAIM_TEMPLATES, "hostjob-channel", ns) is not None
        # This domain's: the controller also serves managed domains other tests left behind.
        mine = f"{cd.DOMAIN_LABEL}={obj['metadata']['uid']}"
        assert rest.list(DAEMON_SETS, driver_ns, label_selector=mine)["items"] == []
        _delete_and_wait(rest, ns, "hostjob")


def test_channels_unique_and_reused_after_delete(control_plane: ControlPlane, rest: Rest) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-chan"), unique("cd-system")
    names = [f"d{i}" for i in range(6)]
    with running_controller(control_plane, driver_ns):
        for n in names:
            rest.create(COMPUTE_DOMAINS, domain_body(n, mode="host"), ns)

        def channels() -> dict[str, int] | None:
            out = {}
            for o in rest.list(COMPUTE_DOMAINS, ns)["items"]:
                ch = o.get("status", {}).get("channels")
                if not ch:
                    return None
                out[o["metadata"]["name"]] = ch[0]
            return out if len(out) == len(names) else None

        first = wait_for(channels, what="channels for all domains")
        assert len(set(first.values())) == len(names)
        # Domains of other tests may hold channels too: compare against the whole cluster.
        every = [
            c
            for o in rest.list(COMPUTE_DOMAINS)["items"]
            for c in o.get("status", {}).get("channels", [])
        ]
        assert len(every) == len(set(every))

        freed = first["d2"]
        _delete_and_wait(rest, ns, "d2")
        rest.create(COMPUTE_DOMAINS, domain_body("late", mode="host"), ns)
        late = wait_for(
            lambda: rest.get(COMPUTE_DOMAINS, "late", ns).get("status", {}).get("channels"),
            what="late channel",
        )
        assert late == [freed]
        for n in [*names, "late"]:
            if n != "d2":
                rest.delete(COMPUTE_DOMAINS, n, ns)
        for n in [*names, "late"]:
            wait_gone(lambda n=n: rest.get_or_none(COMPUTE_DOMAINS, n, ns), f"{n} deleted")


def test_recreates_a_deleted_claim_template(control_plane: ControlPlane, rest: Rest) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-heal"), unique("cd-system")
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("heal", mode="host"), ns)
        first = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "heal-channel", ns), what="RCT")
        rest.delete(CLAIM_TEMPLATES, "heal-channel", ns)
        again = wait_for(
            lambda: (
                (o := rest.get_or_none(CLAIM_TEMPLATES, "heal-channel", ns)) is not None
                and o["metadata"]["uid"] != first["metadata"]["uid"]
                and o
            ),
            what="RCT recreated",
        )
        assert (
            again["metadata"]["labels"][cd.DOMAIN_LABEL]
            == first["metadata"]["labels"][cd.DOMAIN_LABEL]
        )
        _delete_and_wait(rest, ns, "heal")


def _controller_process(cp: ControlPlane, driver_ns: str, lease: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FABRICDRA_METRICS_PORT": "0"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricdra.cli",
            "controller",
            "--kubeconfig",
            str(cp.kubeconfig),
            "--namespace",
            driver_ns,
            "--identity",
            lease,
            "--resync-seconds",
            "5",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_killed_mid_reconcile_resumes_without_duplicates(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """SIGKILL the controller process at several points of a domain's creation; a fresh
    process must finish the job with exactly one of everything and the same channel."""
    ns, driver_ns = new_namespace(control_plane, "cd-crash"), unique("cd-system")
    for i, delay in enumerate((0.3, 0.8, 1.5, 2.5)):
        name = f"crash{i}"
        proc = _controller_process(control_plane, driver_ns, f"crash-{i}-a")
        try:
            rest.create(COMPUTE_DOMAINS, domain_body(name), ns)
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        seen = rest.get(COMPUTE_DOMAINS, name, ns)
        channel_before = seen.get("status", {}).get("channels")
        # The killed process still holds the leader lease: the new one waits it out (15 s);
        # a second replica started meanwhile must not act before then either.
        proc = _controller_process(control_plane, driver_ns, f"crash-{i}-b")
        try:
            obj = wait_for(
                lambda name=name: (
                    (o := rest.get(COMPUTE_DOMAINS, name, ns))
                    and condition(o, cd.READY)
                    and o.get("status", {}).get("channels")
                    and o
                ),
                what="resumed",
                timeout=60,
            )
            if channel_before:
                assert obj["status"]["channels"] == channel_before
            uid = obj["metadata"]["uid"]
            sel = f"{cd.DOMAIN_LABEL}={uid}"
            wait_for(
                lambda sel=sel: (
                    len(rest.list(DAEMON_SETS, driver_ns, label_selector=sel)["items"]) == 1
                ),
                what="one DaemonSet",
            )
            assert len(rest.list(CLAIM_TEMPLATES, driver_ns, label_selector=sel)["items"]) == 1
            assert len(rest.list(CLAIM_TEMPLATES, ns, label_selector=sel)["items"]) == 1
            assert obj["metadata"]["finalizers"].count(cd.FINALIZER) == 1
            _delete_and_wait(rest, ns, name)
            assert rest.list(DAEMON_SETS, driver_ns, label_selector=sel)["items"] == []
            assert rest.list(CLAIM_TEMPLATES, driver_ns, label_selector=sel)["items"] == []
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    every = [
        c
        for o in rest.list(COMPUTE_DOMAINS)["items"]
        for c in o.get("status", {}).get("channels", [])
    ]
    assert len(every) == len(set(every))


def test_two_replicas_one_leader_and_failover(control_plane: ControlPlane, rest: Rest) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-ha"), unique("cd-system")
    lease = unique("cd-lease")
    cfg = {
        "namespace": driver_ns,
        "daemon": DaemonSettings(namespace=driver_ns),
        "resync_seconds": 5.0,
        "lease_name": lease,
    }
    first = Controller(control_plane.api_client(), ControllerConfig(identity="one", **cfg))
    second = Controller(control_plane.api_client(), ControllerConfig(identity="two", **cfg))
    first.start()
    assert first.elector is not None
    assert first.elector.leading.wait(30)
    second.start()
    try:
        assert second.elector is not None
        time.sleep(3)  # several renew periods: the standby must stay standby
        assert not second.elector.leading.is_set()
        rest.create(COMPUTE_DOMAINS, domain_body("ha", mode="host"), ns)
        wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "ha-channel", ns), what="RCT")
        first.stop()  # releases the lease: the standby takes over at once
        assert second.elector.leading.wait(20)
        rest.delete(CLAIM_TEMPLATES, "ha-channel", ns)
        wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "ha-channel", ns), what="healed")
        _delete_and_wait(rest, ns, "ha")
    finally:
        first.stop()
        second.stop()


def test_controller_needs_only_its_documented_permissions(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """The whole controller path (objects, channel, node slice, claim admission, status,
    cleanup) as a non-admin user bound to rbac.CONTROLLER cluster-wide and to
    rbac.CONTROLLER_NAMESPACED only in its own namespace (the chart's release namespace, which
    exists before it starts). On the way it brings a DeviceClass an older version made (another
    selector) to this version's shape."""
    user = unique("fabricdra-controller")
    rest.create(RBAC_ROLES, rbac.cluster_role(user, rbac.CONTROLLER))
    rest.create(RBAC_BINDINGS, rbac.binding_for_user(user, user, user))
    kubeconfig = control_plane.kubeconfig_for(user, user)
    ns, driver_ns = (
        new_namespace(control_plane, "cd-rbac"),
        new_namespace(control_plane, "cd-system"),
    )
    rest.create(RBAC_NS_ROLES, rbac.role(user, driver_ns, rbac.CONTROLLER_NAMESPACED), driver_ns)
    rest.create(
        RBAC_NS_BINDINGS, rbac.role_binding_for_user(user, driver_ns, user, user), driver_ns
    )
    stale = {"selectors": [{"cel": {"expression": "device.driver == 'an-older-version'"}}]}
    live = rest.get_or_none(DEVICE_CLASSES, cd.CHANNEL_CLASS)
    if live is None:
        rest.create(DEVICE_CLASSES, {"metadata": {"name": cd.CHANNEL_CLASS}, "spec": stale})
    else:
        rest.replace(DEVICE_CLASSES, cd.CHANNEL_CLASS, {**live, "spec": stale})
    node = unique("rbac-node")
    create_plugin_node(control_plane, node, fabric="rack-r")
    give_addresses(control_plane, node, "10.2.0.1")
    cfg = ControllerConfig(
        namespace=driver_ns,
        daemon=DaemonSettings(namespace=driver_ns),
        resync_seconds=5.0,
        lease_name=unique("cd-rbac"),
    )
    from kubernetes import config as kube_config

    controller = Controller(kube_config.new_client_from_config(config_file=str(kubeconfig)), cfg)
    controller.start()
    try:
        assert controller.elector is not None
        assert controller.elector.leading.wait(30)
        wait_for(lambda: rest.get_or_none(SLICES, slice_name(node)), what="node slice")
        channel_class = rest.get(DEVICE_CLASSES, cd.CHANNEL_CLASS)["spec"]["selectors"]
        assert "an-older-version" not in channel_class[0]["cel"]["expression"]
        assert cd.DRIVER in channel_class[0]["cel"]["expression"]
        rest.create(COMPUTE_DOMAINS, domain_body("r", rct="r-imex"), ns)
        template = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "r-imex", ns), what="rct")
        uid = template["metadata"]["labels"][cd.DOMAIN_LABEL]
        claim = allocate_claim(rest, ns, template, node, "r-0", binding_conditions=True)
        admitted = wait_for(
            lambda: [
                c
                for d in rest.get(CLAIMS, "r-0", ns).get("status", {}).get("devices", [])
                for c in d.get("conditions", [])
                if c["type"] == cd.ADMITTED_CONDITION
            ],
            what="claim admitted",
        )
        assert admitted[0]["status"] == "True"
        assert claim
        report_daemon(rest, driver_ns, uid, node, ready=True, ip="10.2.0.1")
        wait_for(
            lambda: (
                (condition(rest.get(COMPUTE_DOMAINS, "r", ns), cd.READY) or {}).get("status")
                == "True"
            ),
            what="Ready",
        )
        _delete_and_wait(rest, ns, "r")
    finally:
        controller.stop()


def test_never_takes_over_a_template_it_did_not_create(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-theirs"), unique("cd-system")
    theirs = {
        "metadata": {"name": "shared-name"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]
                }
            }
        },
    }
    before = rest.create(CLAIM_TEMPLATES, theirs, ns)
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("clash", rct="shared-name", mode="host"), ns)
        ready = wait_for(
            lambda: condition(rest.get(COMPUTE_DOMAINS, "clash", ns), cd.READY),
            what="Ready condition",
        )
        assert (ready["status"], ready["reason"]) == ("False", "CreatingObjects")
        assert "belongs to something else" in ready["message"]
        _delete_and_wait(rest, ns, "clash")
    after = rest.get(CLAIM_TEMPLATES, "shared-name", ns)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"] == before["spec"]


def test_api_server_refuses_all_channels_in_host_mode(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """The CRD's own validation, not just the controller: in host mode the host's channels are
    shared by every domain on it, so a domain may not ask for all of them."""
    ns = unique("cd-allhost")
    control_plane.create_namespace(ns)
    body = domain_body("greedy", mode="host")
    body["spec"]["channel"]["allocationMode"] = "All"
    with pytest.raises(ApiError) as err:
        rest.create(COMPUTE_DOMAINS, body, ns)
    assert err.value.status == 422
    assert "allocationMode All needs imexMode managed" in err.value.message
    body["spec"]["imexMode"] = "managed"
    rest.create(COMPUTE_DOMAINS, body, ns)  # fine where the IMEX domain is the domain's own


def test_a_report_naming_a_foreign_ip_is_ignored(control_plane: ControlPlane, rest: Rest) -> None:
    """Issue 19: a node's report may name only one of its own Node's addresses; another node's
    IP (a compromised node redirecting its peers' IMEX traffic) is ignored, with an event."""
    ns, driver_ns = new_namespace(control_plane, "cd-foreign"), unique("cd-system")
    node, other = unique("own-ip"), unique("other-ip")
    create_plugin_node(control_plane, node, fabric="rack-f")
    create_plugin_node(control_plane, other, fabric="rack-f")
    give_addresses(control_plane, node, "10.3.0.1", "10.3.1.1")
    give_addresses(control_plane, other, "10.3.0.2")
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("f", rct="f-imex"), ns)
        template = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "f-imex", ns), what="rct")
        uid = template["metadata"]["labels"][cd.DOMAIN_LABEL]
        allocate_claim(rest, ns, template, node, "f-0")

        def row_ip() -> str | None:
            nodes = rest.get(COMPUTE_DOMAINS, "f", ns).get("status", {}).get("nodes") or []
            return nodes[0].get("ipAddress") if nodes and nodes[0].get("ready") else None

        # One of its own addresses (not the first): taken.
        report_daemon(rest, driver_ns, uid, node, ready=True, ip="10.3.1.1")
        wait_for(lambda: row_ip() == "10.3.1.1", what="own second address taken")
        # The other node's address: ignored, the Node's own address used, and said so.
        report_daemon(rest, driver_ns, uid, node, ready=True, ip="10.3.0.2")
        wait_for(lambda: row_ip() == "10.3.0.1", what="foreign address ignored")
        events = wait_for(
            lambda: [
                e
                for e in rest.list(EVENTS, ns)["items"]
                if e["involvedObject"].get("name") == "f" and e["reason"] == "ForeignReportIP"
            ],
            what="ForeignReportIP event",
        )
        assert events[0]["type"] == "Warning"
        assert "10.3.0.2" in events[0]["message"]
        assert node in events[0]["message"]
        _delete_and_wait(rest, ns, "f")
