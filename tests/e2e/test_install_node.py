"""In-cluster scenarios 3, 5 and 6 of the install: shared RDMA, a link going down under a
running pod, and the node agent killed during a prepare (tests/e2e/installkit.py says how the
node and the release are made)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.images import TEST_IMAGE
from fabricdra.kubeletplugin.healthevents import COMPONENT as HEALTH_COMPONENT
from fabricdra.kubeletplugin.kubelet import PluginPaths
from tests.e2e.installkit import (
    DRIVER,
    EXAMPLES,
    NAMESPACE,
    Installed,
    namespace,
    offered_untainted,
    own_slices,
    run_pod,
    wait_running,
)

pytestmark = pytest.mark.e2e

NODE_PODS = "app.kubernetes.io/component=node"


# -- helpers -------------------------------------------------------------------------------


def roll_to(installed: Installed, values: dict[str, Any]) -> None:
    """helm upgrade to `values`, then wait until the node DaemonSet has rolled: one pod, of
    the new template, Ready."""
    installed.chart.install(installed.cluster.kubeconfig, NAMESPACE, values=values)
    with installed.cluster.api_client() as api:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)

        def rolled() -> bool:
            ds = apps.read_namespaced_daemon_set("fabricdra-node", NAMESPACE)
            st = ds.status
            pods = core.list_namespaced_pod(NAMESPACE, label_selector=NODE_PODS).items
            return (
                st.observed_generation == ds.metadata.generation
                and st.updated_number_scheduled == 1
                and st.number_ready == 1
                and len(pods) == 1
            )

        wait_for(rolled, timeout=240, what="the node DaemonSet to roll")


def claim(name: str, device_class: str, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": exactly}]}},
    }


def on_endpoint(rdma_device: str) -> str:
    return f'device.attributes["{DRIVER}"].rdmaDevice == "{rdma_device}"'


def allocated_device(api: client.ApiClient, ns: str, name: str) -> str:
    obj = client.ResourceV1Api(api).read_namespaced_resource_claim(name, ns)
    results = obj.status.allocation.devices.results
    assert len(results) == 1
    return str(results[0].device)


def unschedulable(api: client.ApiClient, ns: str, pod: str) -> bool:
    """The scheduler has looked at the pod and found no place for it (not: not yet looked)."""
    status = client.CoreV1Api(api).read_namespaced_pod(pod, ns).status
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in status.conditions or []
    )


def verbs_of(installed: Installed) -> dict[str, str]:
    return {
        ep.rdmaDevice: ep.verbsDevice
        for iface in installed.host.discovery.interfaces or []
        for ep in iface.endpoints()
        if ep.rdmaDevice and ep.verbsDevice
    }


def log_lines(api: client.ApiClient, ns: str, pod: str) -> list[str]:
    log = wait_for(
        lambda: client.CoreV1Api(api).read_namespaced_pod_log(pod, ns) or None,
        what=f"the output of {pod}",
    )
    return str(log).split()


def node_pod(api: client.ApiClient) -> Any:
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=NODE_PODS).items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


# -- scenario 3: shared RDMA ---------------------------------------------------------------


def test_shared_endpoint_serves_two_pods_and_exclusive_requests_never_land_on_it(
    installed: Installed,
) -> None:
    """rdma.mode shared: two claims of rdma-shared.fabricdra.io, pinned to one endpoint, both
    get it and both pods see its verbs device. An exclusive request finds nothing in shared
    mode (every endpoint is offered in exactly one mode): the scheduler reports it
    unschedulable. Back in exclusive mode, an exclusive claim pinned to an endpoint another
    claim holds is unschedulable too, and an unpinned one gets a different endpoint."""
    node = installed.cluster.node_name
    verbs = verbs_of(installed)
    try:
        roll_to(installed, {**installed.values, "rdma": {"mode": "shared"}})
        with installed.cluster.api_client() as api:

            def shared_offered() -> list[Any] | None:
                devices = offered_untainted(api, node) or []
                shared = [
                    d
                    for d in devices
                    if d.attributes.get("rdmaMode") and d.attributes["rdmaMode"].string == "shared"
                ]
                return shared or None

            shared = wait_for(shared_offered, timeout=120, what="shared RDMA endpoints")
            endpoint = shared[0].attributes["rdmaDevice"].string
        cmd = "ls /dev/infiniband; sleep 3600"
        with namespace(installed, "shared") as (api, ns):
            resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
            for name in ("a", "b"):
                resource.create_namespaced_resource_claim(
                    ns, claim(name, "rdma-shared.fabricdra.io", on_endpoint(endpoint))
                )
                run_pod(api, ns, name, name, command=cmd)
            resource.create_namespaced_resource_claim(ns, claim("x", "rdma.fabricdra.io"))
            run_pod(api, ns, "x", "x", command=cmd)
            for name in ("a", "b"):
                wait_running(core, ns, name)
            seen = {name: log_lines(api, ns, name) for name in ("a", "b")}
            given = {name: allocated_device(api, ns, name) for name in ("a", "b")}
            wait_for(lambda: unschedulable(api, ns, "x"), timeout=120, what="x refused")
            x_claim = resource.read_namespaced_resource_claim("x", ns)
            x_pod = core.read_namespaced_pod("x", ns)
        assert given["a"] == given["b"]
        for name in ("a", "b"):
            assert sorted(seen[name]) == sorted([verbs[endpoint], "rdma_cm"]), name
        assert x_claim.status is None or x_claim.status.allocation is None
        assert x_pod.spec.node_name is None
    finally:
        roll_to(installed, installed.values)

    with installed.cluster.api_client() as api:
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
    with namespace(installed, "exclusive") as (api, ns):
        resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
        resource.create_namespaced_resource_claim(ns, claim("first", "rdma.fabricdra.io"))
        run_pod(api, ns, "first", "first", command="sleep 3600")
        wait_running(core, ns, "first")
        taken = allocated_device(api, ns, "first")
        devices = {d.name: d for s in own_slices(api, node) for d in s.spec.devices or []}
        taken_endpoint = devices[taken].attributes["rdmaDevice"].string
        resource.create_namespaced_resource_claim(
            ns, claim("pinned", "rdma.fabricdra.io", on_endpoint(taken_endpoint))
        )
        run_pod(api, ns, "pinned", "pinned", command="sleep 3600")
        resource.create_namespaced_resource_claim(ns, claim("second", "rdma.fabricdra.io"))
        run_pod(api, ns, "second", "second", command="sleep 3600")
        wait_running(core, ns, "second")
        second = allocated_device(api, ns, "second")
        wait_for(lambda: unschedulable(api, ns, "pinned"), timeout=120, what="pinned refused")
        pinned = resource.read_namespaced_resource_claim("pinned", ns)
    assert devices[taken].attributes["rdmaMode"].string == "exclusive"
    assert second != taken
    assert pinned.status is None or pinned.status.allocation is None


# -- scenario 5: a link goes down ----------------------------------------------------------


def _link_files(installed: Installed, rdma_device: str) -> dict[Path, str | None]:
    """The files the kernel changes when an RDMA NIC's link drops: every port's `state` and
    `phys_state` (the RDMA subsystem) and the netdev's `operstate` and `carrier`. Value: the
    content now (None: the file is not there)."""
    sys_root = installed.host.root / "sys"
    ib = (sys_root / "class" / "infiniband" / rdma_device).resolve()
    files = [
        p
        for port in sorted((ib / "ports").iterdir())
        for p in (port / "state", port / "phys_state")
    ]
    netdev = next(
        ep.name
        for iface in installed.host.discovery.interfaces or []
        for ep in iface.endpoints()
        if ep.rdmaDevice == rdma_device
    )
    assert netdev, f"{rdma_device} has no netdev"
    net = (sys_root / "class" / "net" / netdev).resolve()
    files += [net / "operstate", net / "carrier"]
    return {p: p.read_text() if p.exists() else None for p in files}


def _write_down(files: dict[Path, str | None]) -> None:
    # As the kernel shows a pulled cable: port DOWN/Polling, interface down without carrier.
    for path in files:
        content = {
            "state": "1: DOWN\n",
            "phys_state": "2: Polling\n",
            "operstate": "down\n",
            "carrier": "0\n",
        }[path.name]
        path.write_text(content)


def _restore(files: dict[Path, str | None]) -> None:
    for path, content in files.items():
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(content)


def _link_taint(device: Any) -> list[Any]:
    return [
        t
        for t in device.taints or []
        if t.key == "fabricdra.io/unhealthy" and t.value == "rdma-link-down"
    ]


def _health_events(api: client.ApiClient, node: str, device: str) -> list[Any]:
    """fabricdra's Events on the Node about `device` (the namespace `default`, as kubelet's)."""
    events = client.CoreV1Api(api).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node}"
    )
    return [
        e
        for e in events.items
        if e.source is not None
        and e.source.component == HEALTH_COMPONENT
        and e.message.startswith(f"device {device} ")
    ]


def test_a_link_going_down_taints_the_device_and_the_running_pod_keeps_it(
    installed: Installed,
) -> None:
    """The port files of the NIC a running pod holds are rewritten as the kernel shows a lost
    link: the next discovery pass taints that device in the ResourceSlice (1.36 model:
    NoSchedule, so nothing running is evicted), its value the reason's cause
    (`rdma-link-down`, docs/attributes.md); the pod keeps running and its claim stays
    allocated and reserved for it. With the files restored, the taint goes away. The Node gets
    exactly one fabricdra Event per change: `Warning DeviceUnhealthy` naming the device, the
    reason in full and the taint, then `Normal DeviceHealthy` (only fabricdra's Events about
    this device are counted: the controller manager writes its own on the Node)."""
    node = installed.cluster.node_name
    with namespace(installed, "link") as (api, ns):
        resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        resource.create_namespaced_resource_claim(ns, claim("nic", "rdma.fabricdra.io"))
        run_pod(api, ns, "p", "nic", command="sleep 3600")
        before = wait_running(core, ns, "p")
        name = allocated_device(api, ns, "nic")

        def device() -> Any:
            found = [d for s in own_slices(api, node) for d in s.spec.devices or []]
            return next(d for d in found if d.name == name)

        rdma_device = device().attributes["rdmaDevice"].string
        files = _link_files(installed, rdma_device)
        earlier = {e.metadata.uid for e in _health_events(api, node, name)}

        def new_events(reason: str) -> list[Any]:
            found = [e for e in _health_events(api, node, name) if e.metadata.uid not in earlier]
            return found if any(e.reason == reason for e in found) else []

        try:
            _write_down(files)
            tainted = wait_for(
                lambda: device() if _link_taint(device()) else None,
                timeout=120,
                what=f"the link taint on {name}",
            )
            wait_for(lambda: new_events("DeviceUnhealthy"), what="the DeviceUnhealthy Event")
            still = core.read_namespaced_pod("p", ns)
            kept = resource.read_namespaced_resource_claim("nic", ns)
        finally:
            _restore(files)
        healed = wait_for(
            lambda: device() if not device().taints else None,
            timeout=120,
            what=f"the taint on {name} to go",
        )
        events = wait_for(lambda: new_events("DeviceHealthy"), what="the DeviceHealthy Event")
        after = core.read_namespaced_pod("p", ns)

    assert [t.effect for t in _link_taint(tainted)] == ["NoSchedule"]
    assert still.status.phase == "Running"
    assert still.status.container_statuses[0].restart_count == 0
    assert [r.uid for r in kept.status.reserved_for] == [before.metadata.uid]
    assert [r.device for r in kept.status.allocation.devices.results] == [name]
    assert healed.taints is None or healed.taints == []
    assert after.status.phase == "Running"
    assert sorted((e.type, e.reason) for e in events) == [
        ("Normal", "DeviceHealthy"),
        ("Warning", "DeviceUnhealthy"),
    ]
    down = next(e for e in events if e.reason == "DeviceUnhealthy")
    assert (down.involved_object.kind, down.involved_object.name) == ("Node", node)
    assert down.message.startswith(f"device {name} (rdma) is Unhealthy")
    assert "every port is down" in down.message  # the reason in full
    assert "(taint fabricdra.io/unhealthy=rdma-link-down)" in down.message
    up = next(e for e in events if e.reason == "DeviceHealthy")
    assert up.message.startswith(f"device {name} (rdma) is Healthy, was Unhealthy")


# -- issue 32 point 1: device health in the pod's status -----------------------------------


def _pod_health(api: client.ApiClient, ns: str, pod: str, device: str) -> str | None:
    """The health kubelet shows for `device` in the pod's
    `status.containerStatuses[].allocatedResourcesStatus` (ResourceHealthStatus, on by default
    in 1.36), read from the pod's JSON (the field is newer than the client's models). kubelet
    names a device by its first CDI id (`…/device=<device>-<claim uid>`) when it has one."""
    raw = client.CoreV1Api(api).read_namespaced_pod(pod, ns, _preload_content=False)
    status = json.loads(raw.data).get("status") or {}
    for c in status.get("containerStatuses") or []:
        for entry in c.get("allocatedResourcesStatus") or []:
            for r in entry.get("resources") or []:
                rid = str(r.get("resourceID", ""))
                if rid.endswith(f"/{device}") or f"={device}-" in rid:
                    return str(r.get("health", ""))
    return None


def test_a_devices_health_reaches_the_pods_status(installed: Installed) -> None:
    """The health stream on a 1.36 kubelet: the registration advertises `v1.DRAResourceHealth`
    (1.37) before `v1alpha1.DRAResourceHealth`; this kubelet knows only v1alpha1 and takes
    it. A NIC's link goes down under a running pod: kubelet shows the device Unhealthy in the
    pod's allocatedResourcesStatus, and Healthy again once the link is back. The claim comes
    from a template: kubelet 1.36 finds a container's claim for this status only through the
    pod's `status.resourceClaimStatuses`, which only generated claims have."""
    node = installed.cluster.node_name
    with namespace(installed, "health") as (api, ns):
        resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "nic"},
            "spec": {"spec": claim("nic", "rdma.fabricdra.io")["spec"]},
        }
        resource.create_namespaced_resource_claim_template(ns, template)
        pod = {
            "metadata": {"name": "p"},
            "spec": {
                "restartPolicy": "Never",
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "nic"}],
                "containers": [
                    {
                        "name": "c",
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "sleep 3600"],
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
            },
        }
        core.create_namespaced_pod(ns, pod)
        running = wait_running(core, ns, "p")
        (generated,) = [s.resource_claim_name for s in running.status.resource_claim_statuses]
        name = allocated_device(api, ns, generated)
        healthy = wait_for(
            lambda: _pod_health(api, ns, "p", name) == "Healthy",
            timeout=120,
            what=f"{name} Healthy in the pod's allocatedResourcesStatus",
        )
        rdma_device = next(
            d.attributes["rdmaDevice"].string
            for s in own_slices(api, node)
            for d in s.spec.devices or []
            if d.name == name
        )
        files = _link_files(installed, rdma_device)
        try:
            _write_down(files)
            sick = wait_for(
                lambda: _pod_health(api, ns, "p", name) == "Unhealthy",
                timeout=120,
                what=f"{name} Unhealthy in the pod's allocatedResourcesStatus",
            )
        finally:
            _restore(files)
        healed = wait_for(
            lambda: _pod_health(api, ns, "p", name) == "Healthy",
            timeout=120,
            what=f"{name} Healthy again in the pod's allocatedResourcesStatus",
        )
    assert (healthy, sick, healed) == (True, True, True)


# -- scenario 6: the agent killed during a prepare -----------------------------------------


def _agent_pids(pod_uid: str) -> list[int]:
    """Host PIDs of the devices plugin process in the node pod (its cgroup names the pod)."""
    marks = (f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(m in cgroup for m in marks) and b"kubelet-plugin" in cmdline:
            pids.append(int(entry.name))
    return pids


def _queued_at(socket_path: Path) -> tuple[int, int]:
    """What waits unread at the server side of `socket_path`, per `ss`: connections not yet
    accepted (Recv-Q of the listening socket) and request bytes not yet read (Recv-Q of the
    accepted connections). gRPC binds `unix://<path>` as `//<path>`: slashes are collapsed
    before comparing."""
    out = subprocess.run(["ss", "-xanH"], capture_output=True, text=True, check=True).stdout
    pending = unread = 0
    for line in out.splitlines():
        fields = line.split()  # Netid State Recv-Q Send-Q Local Port Peer Port
        if len(fields) >= 5 and re.sub("/+", "/", fields[4]) == str(socket_path):
            if fields[1] == "LISTEN":
                pending += int(fields[2])
            else:
                unread += int(fields[2])
    return pending, unread


def _being_torn_down(api: client.ApiClient, checkpoint: Path) -> list[str]:
    """The claims the devices plugin holds prepared whose namespace is gone or going (their
    unprepare is still to come)."""
    if not checkpoint.exists():
        return []
    core, out = client.CoreV1Api(api), []
    for entry in json.loads(checkpoint.read_text()).get("claims") or []:
        try:
            going = core.read_namespace(entry["namespace"]).metadata.deletion_timestamp
        except client.ApiException as e:
            if e.status != 404:
                raise
            going = True
        if going:
            out.append(f"{entry['namespace']}/{entry['name']}")
    return out


# More than keepalive frames could add (an HTTP/2 PING is 17 bytes); a NodePrepareResources
# request carries the claim's namespace, name and UID in its own HEADERS and DATA frames.
REQUEST_BYTES = 64


def test_agent_killed_during_a_prepare_restarts_and_leaves_no_cdi_spec(
    installed: Installed,
) -> None:
    """The devices plugin process is frozen (SIGSTOP), a pod with a claim is created, and the
    test waits until kubelet's NodePrepareResources for it sits unread at the plugin's DRA
    socket (`ss`: a new connection, or request-sized bytes, queued there while the process
    cannot read; nothing else calls that socket while it is frozen). Then the process is
    SIGKILLed: kubelet's prepare call is in flight and never answered, and the claim was
    allocated and reserved but not prepared. What this proves: the container restarts in the
    same pod, re-serves its sockets, kubelet's retried prepare succeeds and the pod runs with
    its CDI spec; after pod and claim are deleted no CDI spec of the claim is left in the CDI
    folder, nor a checkpoint entry. It does not prove a kill between the agent's own steps
    (checkpoint write, spec write): that crash window is covered by the checkpoint-first
    order the unit tests check, not here."""
    cdi_dir = Path(installed.values.get("cdiDir", "/var/run/cdi"))
    checkpoint = installed.cluster.plugins_dir / DRIVER / "checkpoint.json"
    with installed.cluster.api_client() as api:
        wait_for(
            lambda: offered_untainted(api, installed.cluster.node_name),
            timeout=120,
            what="untainted devices",
        )
        # The earlier scenarios' claims unprepared: kubelet's unprepare of one of them, queued
        # at the frozen plugin, would pass for this claim's prepare (seen: the claim was not
        # even allocated yet, its devices still held by the scenario before).
        wait_for(
            lambda: not _being_torn_down(api, checkpoint),
            timeout=180,
            what="the earlier scenarios' claims unprepared",
        )
        pod = node_pod(api)
        pod_uid = pod.metadata.uid
        restarts = {c.name: c.restart_count for c in pod.status.container_statuses}
    dra_socket = PluginPaths.for_driver(
        DRIVER,
        registry_dir=installed.cluster.plugins_registry_dir,
        plugin_dir=installed.cluster.plugins_dir / DRIVER,
        instance=pod_uid,
    ).dra_socket
    assert dra_socket.exists(), "the node pod serves its own per-pod DRA socket"
    pids = wait_for(lambda: _agent_pids(pod_uid) or None, what="the devices plugin's process")
    assert len(pids) == 1, pids
    pid = pids[0]
    stopped = False
    try:
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        _, baseline = _queued_at(dra_socket)
        with namespace(installed, "kill") as (api, ns):
            resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
            obj = yaml.safe_load((EXAMPLES / "gpu-nic-pxb.yaml").read_text())
            created = resource.create_namespaced_resource_claim(ns, obj)
            uid = created.metadata.uid
            run_pod(api, ns, "p", obj["metadata"]["name"], command="sleep 3600")

            def reserved_for_the_pod() -> Any:
                got = resource.read_namespaced_resource_claim(obj["metadata"]["name"], ns)
                return got if got.status.reserved_for else None

            def call_waiting() -> bool:
                pending, unread = _queued_at(dra_socket)
                return pending > 0 or unread >= baseline + REQUEST_BYTES

            # kubelet prepares only for a pod bound to its node, whose claim is reserved for it
            reserved = wait_for(reserved_for_the_pod, timeout=120, what="the claim reserved")

            wait_for(
                call_waiting,
                timeout=120,
                what="kubelet's prepare call waiting at the frozen plugin",
            )
            assert not any(uid in p.name for p in cdi_dir.iterdir()), "nothing prepared yet"
            os.kill(pid, signal.SIGKILL)
            stopped = False
            wait_running(core, ns, "p")
            specs = [p for p in cdi_dir.iterdir() if uid in p.name]
            with installed.cluster.api_client() as api2:
                after = node_pod(api2)
            core.delete_namespaced_pod("p", ns)
            wait_for(
                lambda: not list(core.list_namespaced_pod(ns).items),
                timeout=120,
                what="the pod gone",
            )
            resource.delete_namespaced_resource_claim(obj["metadata"]["name"], ns)

            def claim_gone() -> bool:
                try:
                    resource.read_namespaced_resource_claim(obj["metadata"]["name"], ns)
                except client.ApiException as e:
                    return e.status == 404
                return False

            wait_for(claim_gone, timeout=60, what="the claim gone")
            # kubelet unprepares when the pod is gone; the spec goes with it.
            wait_for(
                lambda: not [p for p in cdi_dir.iterdir() if uid in p.name],
                timeout=120,
                what="the claim's CDI spec removed",
            )
    finally:
        if stopped:  # (the liveness probe may have had it killed meanwhile)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert reserved.status.allocation is not None
    assert reserved.status.reserved_for
    assert specs, "the pod ran with the claim's CDI spec"
    assert after.metadata.uid == pod_uid  # the same pod: its container restarted
    devices = {c.name: c.restart_count for c in after.status.container_statuses}
    assert devices["devices"] == restarts["devices"] + 1
    assert not [p for p in cdi_dir.iterdir() if uid in p.name]
    assert uid not in checkpoint.read_text()
