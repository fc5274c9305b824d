"""The node agent as a whole against the real API server: it publishes, serves kubelet,
republishes when kubelet wiped the node's slices, reports health, serves metrics — and the
`fabricdra kubelet-plugin` process stops cleanly on SIGTERM."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import ControlPlane
from e2e.harness.poll import wait_for
from e2e.harness.process import free_port
from fabricdra.kubeletplugin.agent import Agent, AgentConfig, health_reports
from fabricdra.kubeletplugin.kinds import accelerator, rdma
from fabricdra.kubeletplugin.kubelet import ClaimRef
from fabricdra.kubeletplugin.kubelet.driver import PrepareError
from fabricdra.kubeletplugin.resourceslices import TAINT_KEY
from fabricdra.kubeletplugin.verification import Tools
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2 as health_pb2
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from fabricdra.proto.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from fabricdra.proto.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from tests.integration.kubelethost import Host, build_host, create_claim
from tests.sysfs.builder import SysfsBuilder

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
_ids = itertools.count()


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        body = yaml.safe_load((ROOT / "api/crds/nodedevices.fabricdra.io.yaml").read_text())
        with contextlib.suppress(ApiException):  # 409: another module installed it
            ext.create_custom_resource_definition(body)


def slice_devices(api: Any, node: str) -> list[str]:
    slices = (
        client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}").items
    )
    return sorted(d.name for s in slices for d in (s.spec.devices or []))


def taint_keys(api: Any, node: str) -> dict[str, list[str]]:
    """Every published device of `node`, with its taints' keys."""
    return {
        d.name: [t.key for t in d.taints or []]
        for s in client.ResourceV1Api(api)
        .list_resource_slice(field_selector=f"spec.nodeName={node}")
        .items
        for d in s.spec.devices or []
    }


def agent_config(base: Path, host: Host, node: str, **kw: Any) -> AgentConfig:
    # The active probes (tools) off: these tests are about the agent, not verification.
    kw.setdefault("verify_tools", Tools(run_bandwidth=False))
    return AgentConfig(
        node_name=node,
        sysfs_root=host.root / "sys",
        nvml_snapshot=host.nvml_snapshot,
        cdi_dir=base / "cdi",
        toolkit_cdi_dirs=(),
        plugin_dir=base / "plugin",
        registry_dir=base / "registry",
        state_dir=base / "state",
        dev_root=host.layout.dev_root,
        proc_root=host.layout.proc_root,
        **kw,
    )


def cli_argv(control_plane: ControlPlane, config: AgentConfig, *extra: str) -> list[str]:
    """`fabricdra kubelet-plugin` on the fake host's folders (no toolkit CDI folders)."""
    return [
        sys.executable,
        "-m",
        "fabricdra.cli",
        "kubelet-plugin",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--sysfs-root",
        str(config.sysfs_root),
        "--nvml-snapshot",
        str(config.nvml_snapshot),
        "--plugin-dir",
        str(config.plugin_dir),
        "--registry-dir",
        str(config.registry_dir),
        "--dev-root",
        str(config.dev_root),
        "--proc-root",
        str(config.proc_root),
        "--toolkit-cdi-dirs",
        "",
        "--verify-active=off",
        *extra,
    ]


@pytest.fixture
def node(control_plane: ControlPlane) -> str:
    name = f"agent-{next(_ids)}-{os.getpid()}"
    control_plane.create_node(name)
    control_plane.create_namespace(name)
    return name


@pytest.fixture
def running(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> Iterator[tuple[Agent, AgentConfig, Any]]:
    base = tmp_path_factory.mktemp("ag")
    host = build_host(base / "host", vf_nics=(), broken_nics=(2,))
    # One pass at start; later passes only when woken (registration) within the test.
    config = agent_config(base, host, node, discovery_interval=3600, metrics_port=free_port())
    with control_plane.api_client() as api:
        api.user_agent = "fabricdra-kubelet-plugin-test/0"
        agent = Agent(config, api)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,))
        thread.start()
        try:
            wait_for(agent.server.paths.registration_socket.exists, what="the registration socket")
            yield agent, config, api
        finally:
            agent.stop_event_wakes(stop)
            thread.join(timeout=20)
        assert not thread.is_alive()
        assert not agent.server.paths.dra_socket.exists()
        assert not agent.server.paths.registration_socket.exists()


def test_agent_publishes_serves_and_republishes(
    running: tuple[Agent, AgentConfig, Any], node: str
) -> None:
    agent, config, api = running
    published = slice_devices(api, node)
    assert "gpu-0000-18-00-0" in published
    assert "rdma-0000-19-00-0" in published

    # kubelet starts: it deletes the node's slices, then registers the plugin
    resource = client.ResourceV1Api(api)
    for s in resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        resource.delete_resource_slice(s.metadata.name)
    assert slice_devices(api, node) == []
    with grpc.insecure_channel(f"unix://{agent.server.paths.registration_socket}") as ch:
        stub = reg_grpc.RegistrationStub(ch)
        assert stub.GetInfo(reg_pb2.InfoRequest(), timeout=30).name == "devices.fabricdra.io"
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True))
    assert wait_for(lambda: slice_devices(api, node), what="republished slices") == published

    # prepare resolves names against the agent's current inventory
    uid = create_claim(
        api,
        node,
        "pair",
        [
            {"request": "gpu", "device": "gpu-0000-18-00-0", "pool": node},
            {"request": "nic", "device": "rdma-0000-19-00-0", "pool": node},
        ],
    )
    with grpc.insecure_channel(f"unix://{agent.server.paths.dra_socket}") as ch:
        resp = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            v1_pb2.NodePrepareResourcesRequest(
                claims=[v1_pb2.Claim(namespace=node, name="pair", uid=uid)]
            ),
            timeout=45,
        )
        assert resp.claims[uid].error == ""
        assert (config.cdi_dir / f"k8s.devices.fabricdra.io-device_{uid}.json").exists()
        assert json.loads(config.checkpoint_path.read_text())["claims"][0]["uid"] == uid

        stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest(), timeout=60
        )
        health = {d.device.device_name: d for d in next(stream).devices}
        stream.cancel()
    assert health["rdma-0000-4c-00-0"].health == health_pb2.UNHEALTHY
    assert health["rdma-0000-4c-00-0"].device.pool_name == node
    assert health["rdma-0000-19-00-0"].health == health_pb2.HEALTHY
    assert health["gpu-0000-18-00-0"].health == health_pb2.HEALTHY  # NVML: no ECC, no throttle

    with urllib.request.urlopen(f"http://127.0.0.1:{config.metrics_port}/metrics") as r:
        text = r.read().decode()
    assert 'fabricdra_prepare_seconds_count{driver="devices.fabricdra.io"}' in text
    assert 'fabricdra_devices{health="Unhealthy",type="rdma"} 1.0' in text
    assert "fabricdra_discovery_pass_seconds_count" in text


def test_the_cli_process_runs_and_stops_on_sigterm(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    base = tmp_path_factory.mktemp("cli")
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node)
    env = {
        **os.environ,
        "FABRICDRA_NODE_NAME": node,  # flags and env vars both work; this one by env
        "FABRICDRA_CDI_DIR": str(config.cdi_dir),
    }
    argv = cli_argv(control_plane, config, "--state-dir", str(config.state_dir))
    argv += ["--rdma-mode", "shared", "--rdma-shared-holders", "4", "--metrics-port", "0"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        reg = config.registry_dir / "devices.fabricdra.io-reg.sock"
        wait_for(lambda: reg.exists() or proc.poll() is not None, what="the registration socket")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with control_plane.api_client() as api:
            devices = wait_for(lambda: slice_devices(api, node), what="published slices")
        assert "rdma-0000-19-00-0" in devices or "rdma-0000-19-00-0-s0" in devices
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = proc.stderr.read() if proc.stderr else ""
    assert '"event": "stopping"' in logs
    assert not reg.exists()
    assert not (config.plugin_dir / "dra.sock").exists()


def test_a_surge_roll_of_two_agent_processes_keeps_the_new_ones_sockets_and_port(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    """Two agent processes of a rolling update (old pod, new pod; pod UIDs by env as the chart
    passes them) on the same folders and, as in the host network, the same metrics port: the
    new one comes up while the old one serves (its own sockets; the port once free), and the
    old one's SIGTERM removes only the old one's sockets."""
    base = tmp_path_factory.mktemp("surge")
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node)
    port = free_port()
    argv = cli_argv(control_plane, config, "--node-name", node, "--cdi-dir", str(config.cdi_dir))
    argv += ["--metrics-port", str(port)]
    procs: dict[str, subprocess.Popen[str]] = {}

    def sockets(uid: str) -> list[Path]:
        return [
            config.registry_dir / f"devices.fabricdra.io-{uid}-reg.sock",
            config.plugin_dir / f"dra-{uid}.sock",
        ]

    try:
        # The old pod first (it holds the port), then the new one beside it.
        for uid in ("old-1111", "new-2222"):
            env = {**os.environ, "FABRICDRA_POD_UID": uid}
            proc = procs[uid] = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
            wait_for(
                lambda uid=uid, proc=proc: (
                    all(p.exists() for p in sockets(uid)) or proc.poll() is not None
                ),
                what=f"the sockets of {uid}",
                timeout=60,
            )
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        procs["old-1111"].send_signal(signal.SIGTERM)
        assert procs["old-1111"].wait(timeout=20) == 0
        new = procs["new-2222"]

        def metrics() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return str(r.read().decode())
            except OSError:
                return None

        # The port is the new process's once the old one has gone (it retries every second).
        wait_for(
            lambda: metrics() if procs["old-1111"].poll() is not None else None, what="metrics"
        )
        left = sorted(p.name for p in config.registry_dir.iterdir())
        alive = new.poll() is None
        new.send_signal(signal.SIGTERM)
        assert new.wait(timeout=20) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = procs["new-2222"].stderr.read() if procs["new-2222"].stderr else ""
    assert alive
    assert left == ["devices.fabricdra.io-new-2222-reg.sock"]
    assert '"event": "metrics port in use (another pod?); retrying"' in logs
    assert '"event": "metrics served"' in logs
    assert not any(p.exists() for uid in procs for p in sockets(uid))


def test_cli_refuses_bad_flags_in_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fabricdra.cli",
            "kubelet-plugin",
            "--node-name",
            "n",
            "--rdma-mode",
            "shared",
            "--rdma-shared-holders",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "holders per endpoint must be at least 1" in run.stderr


def test_each_pass_reads_the_node_afresh(
    running: tuple[Agent, AgentConfig, Any],
) -> None:
    """Links resolved in one pass are not trusted in the next: netdev names that move between
    NICs (udev renames, hot plug) show up on the following pass."""
    agent, config, _ = running
    before = agent.pass_once()
    first, second = "rdma-0000-19-00-0", "rdma-0000-3b-00-0"
    a = rdma.payload_of(before.get(first)).endpoint.name  # type: ignore[arg-type]
    b = rdma.payload_of(before.get(second)).endpoint.name  # type: ignore[arg-type]
    assert a
    assert b
    assert a != b
    net = config.sysfs_root / "class" / "net"
    target_a, target_b = os.readlink(net / a), os.readlink(net / b)
    (net / a).unlink()
    (net / b).unlink()
    os.symlink(target_b, net / a)
    os.symlink(target_a, net / b)
    after = agent.pass_once()
    assert rdma.payload_of(after.get(first)).endpoint.name == b  # type: ignore[arg-type]
    assert rdma.payload_of(after.get(second)).endpoint.name == a  # type: ignore[arg-type]


def test_slices_come_back_when_kubelets_wipe_lands_after_the_republish(
    running: tuple[Agent, AgentConfig, Any], node: str
) -> None:
    """kubelet deletes the node's slices in the background when it starts; the deletion can
    land after the pass its registration triggered. The next discovery pass is an hour away
    here: the slices must come back long before it."""
    agent, _, api = running
    published = slice_devices(api, node)
    with grpc.insecure_channel(f"unix://{agent.server.paths.registration_socket}") as ch:
        reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=True)
        )
    passes = agent.passes
    wait_for(lambda: agent.passes > passes, what="the pass the registration triggered")
    resource = client.ResourceV1Api(api)
    for s in resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        resource.delete_resource_slice(s.metadata.name)  # the late wipe
    assert wait_for(lambda: slice_devices(api, node), what="slices back after a late wipe") == (
        published
    )


def test_a_failures_first_seen_time_survives_a_plugin_restart(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    base = tmp_path_factory.mktemp("fs")
    host = build_host(base / "host", vf_nics=(), broken_nics=(2,))
    config = agent_config(base, host, node, discovery_interval=3600)

    def taint_time(api: Any) -> str | None:
        for s in (
            client.ResourceV1Api(api)
            .list_resource_slice(field_selector=f"spec.nodeName={node}")
            .items
        ):
            for d in s.spec.devices or []:
                if d.name == "rdma-0000-4c-00-0" and d.taints:
                    return str(d.taints[0].time_added)
        return None

    with control_plane.api_client() as api:
        times = []
        for _ in range(2):
            agent = Agent(config, api)
            agent.seed_history()
            agent.pass_once()
            times.append(wait_for(lambda: taint_time(api), what="the failed link's taint"))
            time.sleep(1.1)  # the clock moves on (times have one-second resolution)
        assert times[0] == times[1]


def test_a_critical_xid_taints_the_gpu_and_survives_a_plugin_restart(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    """An Xid event (replayed from the recorded NVML answers) taints its GPU in the published
    slice; NVML never repeats the event, yet a restarted plugin keeps the taint and its time."""
    base = tmp_path_factory.mktemp("xid")
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node, discovery_interval=3600)
    snapshot = json.loads(host.nvml_snapshot.read_text())
    gpu_bus = sorted(snapshot)[0]
    device = "gpu-" + gpu_bus.replace(":", "-").replace(".", "-")
    for entry in snapshot.values():
        entry.update(xidEventsSupported=True, xidEvents=[])

    def record(events: list[dict[str, int]]) -> None:
        snapshot[gpu_bus]["xidEvents"] = events
        host.nvml_snapshot.write_text(json.dumps(snapshot))

    def taint_time(api: Any) -> str | None:
        for s in (
            client.ResourceV1Api(api)
            .list_resource_slice(field_selector=f"spec.nodeName={node}")
            .items
        ):
            for d in s.spec.devices or []:
                for t in d.taints or []:
                    if d.name == device and t.key == TAINT_KEY:
                        return str(t.time_added)
        return None

    with control_plane.api_client() as api:
        record([])
        agent = Agent(config, api)
        agent.pass_once()
        assert wait_for(lambda: slice_devices(api, node), what="the first publish")
        assert taint_time(api) is None
        record([{"xid": 79}])
        agent.pass_once()
        first = wait_for(lambda: taint_time(api), what="the Xid's taint")
        agent.families.nvidia.xids.close()

        record([])  # a new process: the event is not delivered again
        time.sleep(1.1)  # the clock moves on (times have one-second resolution)
        restarted = Agent(config, api)
        restarted.pass_once()
        assert taint_time(api) == first
        restarted.families.nvidia.xids.close()


def test_a_gpu_that_falls_off_the_bus_stays_published_tainted_until_a_restart(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    """Issue 17: the kernel removing a GPU's PCI function used to unpublish it, so the claims
    holding it lost their health signal. No claim holds this one: a restarted agent publishes
    only what is on the bus (a held one is kept: the test below)."""
    base = tmp_path_factory.mktemp("bus")
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node, discovery_interval=3600)
    snapshot = json.loads(host.nvml_snapshot.read_text())
    gone = sorted(snapshot)[0]
    device = "gpu-" + gone.replace(":", "-").replace(".", "-")

    with control_plane.api_client() as api:
        agent = Agent(config, api)
        agent.pass_once()
        assert wait_for(lambda: device in taint_keys(api, node), what="the first publish")
        assert taint_keys(api, node)[device] == []
        SysfsBuilder(config.sysfs_root).remove_pci(gone)  # Xid 79: the kernel drops the GPU
        del snapshot[gone]
        host.nvml_snapshot.write_text(json.dumps(snapshot))
        inventory = agent.pass_once()
        assert wait_for(
            lambda: TAINT_KEY in taint_keys(api, node).get(device, []), what="the taint"
        )
        lost = inventory.get(device)
        assert lost is not None
        assert (lost.health, accelerator.payload_of(lost).lost) == ("Unhealthy", True)
        assert any(
            h.device_name == device and h.health == "Unhealthy"
            for h in health_reports(node, inventory)
        )
        agent.families.nvidia.xids.close()

        restarted = Agent(config, api)  # a new process publishes what is on the bus
        restarted.pass_once()
        assert wait_for(
            lambda: device not in taint_keys(api, node), what="the GPU withdrawn after a restart"
        )
        restarted.families.nvidia.xids.close()


def test_a_lost_gpu_a_claim_holds_stays_published_unhealthy_across_a_restart(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    """Issue 29 point 5: a GPU that fell off the bus while a prepared claim holds it stays
    published, tainted, and Unhealthy in kubelet's health stream after the agent restarts,
    until kubelet unprepares the claim; then it goes. (The restarted agent knows its record
    from the state folder: the kernel no longer lists it.)"""
    base = tmp_path_factory.mktemp("held-lost")
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node, discovery_interval=3600)
    snapshot = json.loads(host.nvml_snapshot.read_text())
    gone = sorted(snapshot)[0]
    device = "gpu-" + gone.replace(":", "-").replace(".", "-")

    def streamed(agent: Agent) -> dict[str, int]:
        """The first message kubelet's health stream gets from `agent`'s server."""
        agent.server.start()
        try:
            with grpc.insecure_channel(f"unix://{agent.server.paths.dra_socket}") as ch:
                stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                    health_pb2.NodeWatchResourcesRequest(), timeout=60
                )
                health = {d.device.device_name: d.health for d in next(stream).devices}
                stream.cancel()
        finally:
            agent.server.stop()
        return health

    with control_plane.api_client() as api:
        agent = Agent(config, api)
        agent.pass_once()
        uid = create_claim(api, node, "held", [{"request": "gpu", "device": device, "pool": node}])
        held = ClaimRef(node, "held", uid)
        assert [d.device_name for d in agent.driver.prepare(held)] == [device]
        SysfsBuilder(config.sysfs_root).remove_pci(gone)  # Xid 79: the kernel drops the GPU
        del snapshot[gone]
        host.nvml_snapshot.write_text(json.dumps(snapshot))
        agent.pass_once()
        assert TAINT_KEY in taint_keys(api, node)[device]
        agent.families.nvidia.xids.close()

        restarted = Agent(config, api)  # a new process: the kernel no longer lists the GPU
        inventory = restarted.pass_once()
        lost = inventory.get(device)
        assert lost is not None, "the held GPU was withdrawn after the restart"
        assert (lost.health, accelerator.payload_of(lost).lost) == ("Unhealthy", True)
        assert TAINT_KEY in taint_keys(api, node)[device]
        assert streamed(restarted)[device] == health_pb2.UNHEALTHY
        # a new claim of it is refused (it is lost), as before the restart
        late = create_claim(api, node, "late", [{"request": "gpu", "device": device, "pool": node}])
        with pytest.raises(PrepareError):
            restarted.driver.prepare(ClaimRef(node, "late", late))

        restarted.driver.unprepare(held)  # kubelet releases the claim: the GPU goes
        restarted.pass_once()
        assert device not in taint_keys(api, node)
        assert device not in streamed(restarted)
        restarted.families.nvidia.xids.close()

        again = Agent(config, api)  # and it does not come back after another restart
        assert again.pass_once().get(device) is None
        again.families.nvidia.xids.close()


def test_a_critical_xid_between_passes_is_published_within_seconds(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    """The next discovery pass is an hour away; the Xid event set is drained between passes,
    and a new critical Xid publishes the taint at once. An application Xid does not."""
    base = tmp_path_factory.mktemp("xidrun")
    host = build_host(base / "host", vf_nics=())
    snapshot = json.loads(host.nvml_snapshot.read_text())
    for entry in snapshot.values():
        entry.update(xidEventsSupported=True, xidEvents=[])
    host.nvml_snapshot.write_text(json.dumps(snapshot))
    first, second = sorted(snapshot)[:2]
    config = agent_config(base, host, node, discovery_interval=3600)

    def tainted(api: Any) -> list[str]:
        return sorted(
            d.name
            for s in client.ResourceV1Api(api)
            .list_resource_slice(field_selector=f"spec.nodeName={node}")
            .items
            for d in s.spec.devices or []
            if any(t.key == TAINT_KEY for t in d.taints or [])  # not the verification gate's
        )

    with control_plane.api_client() as api:
        agent = Agent(config, api)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,))
        thread.start()
        try:
            wait_for(lambda: slice_devices(api, node), what="the first publish")
            passes = agent.passes
            snapshot[second]["xidEvents"] = [{"xid": 13}]  # the application's own
            host.nvml_snapshot.write_text(json.dumps(snapshot))
            snapshot[first]["xidEvents"] = [{"xid": 79}]
            host.nvml_snapshot.write_text(json.dumps(snapshot))
            name = "gpu-" + first.replace(":", "-").replace(".", "-")
            assert wait_for(lambda: tainted(api), what="the Xid's taint") == [name]
            assert agent.passes == passes + 1
        finally:
            agent.stop_event_wakes(stop)
            thread.join(timeout=20)
        assert not thread.is_alive()


class SweepReader:
    """The agent's claim reader (reads the real API server); reads of claims named `hang-*`
    hang until `release` (a stalled API server), and every read is counted."""

    def __init__(self, api: Any) -> None:
        from fabricdra.kubeletplugin.prepare import ApiClaimReader

        self.real = ApiClaimReader(api)
        self.release = threading.Event()
        self.hanging = threading.Event()
        self.reads: dict[str, int] = {}

    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        self.reads[name] = self.reads.get(name, 0) + 1
        if name.startswith("hang-"):
            self.hanging.set()
            self.release.wait(60)
        return self.real.read_claim(namespace, name, timeout)

    def warn(self, claim: dict[str, Any], reason: str, message: str, timeout: float) -> None:
        self.real.warn(claim, reason, message, timeout)


@contextlib.contextmanager
def agent_running(
    base: Path, control_plane: ControlPlane, node: str, reader: SweepReader, **kw: Any
) -> Iterator[tuple[Agent, AgentConfig]]:
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node, **kw)
    with control_plane.api_client() as api:
        agent = Agent(config, api, claims=reader)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,))
        thread.start()
        try:
            wait_for(agent.server.paths.registration_socket.exists, what="the registration socket")
            yield agent, config
        finally:
            reader.release.set()
            agent.stop_event_wakes(stop)
            thread.join(timeout=30)
        assert not thread.is_alive()


def _prepare(agent: Agent, namespace: str, name: str, uid: str) -> str:
    with grpc.insecure_channel(f"unix://{agent.server.paths.dra_socket}") as ch:
        resp = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            v1_pb2.NodePrepareResourcesRequest(
                claims=[v1_pb2.Claim(namespace=namespace, name=name, uid=uid)]
            ),
            timeout=45,
        )
    error: str = resp.claims[uid].error
    return error


def test_the_sweep_never_frees_a_device_kubelet_has_not_unprepared(
    tmp_path_factory: pytest.TempPathFactory,
    control_plane: ControlPlane,
    crds: None,
    node: str,
) -> None:
    """A force-deleted pod's claim is gone from the API while its container may still run
    (kubelet unprepares once it has stopped it): the sweep must leave its NIC held, or a
    second claim gets a NIC a running container still uses."""
    base = tmp_path_factory.mktemp("sw")
    nic = "rdma-0000-19-00-0"
    with control_plane.api_client() as api:
        reader = SweepReader(api)
        with agent_running(
            base, control_plane, node, reader, discovery_interval=0.3, sweep_interval=0.2
        ) as (agent, config):
            first = create_claim(
                api, node, "first", [{"request": "nic", "device": nic, "pool": node}]
            )
            assert _prepare(agent, node, "first", first) == ""
            kept = create_claim(
                api, node, "kept", [{"request": "nic", "device": "rdma-0000-3b-00-0", "pool": node}]
            )
            assert _prepare(agent, node, "kept", kept) == ""
            client.ResourceV1Api(api).delete_namespaced_resource_claim("first", node)
            # each sweep reads "kept": three more reads, and a whole sweep began (and ended)
            # after the delete
            seen = reader.reads.get("kept", 0)
            wait_for(
                lambda: reader.reads.get("kept", 0) >= seen + 3, what="a sweep after the delete"
            )
            assert (config.cdi_dir / f"k8s.devices.fabricdra.io-device_{first}.json").exists()
            second = create_claim(
                api, node, "second", [{"request": "nic", "device": nic, "pool": node}]
            )
            assert "already prepared for claim" in _prepare(agent, node, "second", second)
            # kubelet's unprepare is what frees it
            with grpc.insecure_channel(f"unix://{agent.server.paths.dra_socket}") as ch:
                done = v1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
                    v1_pb2.NodeUnprepareResourcesRequest(
                        claims=[v1_pb2.Claim(namespace=node, name="first", uid=first)]
                    ),
                    timeout=45,
                )
            assert done.claims[first].error == ""
            assert _prepare(agent, node, "second", second) == ""


def test_a_hanging_sweep_stops_no_discovery_pass(
    tmp_path_factory: pytest.TempPathFactory,
    control_plane: ControlPlane,
    crds: None,
    node: str,
) -> None:
    """Three claim reads that hang once stopped discovery, Xid and health updates for 30 s:
    the sweep runs off the pass thread."""
    from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint, ClaimEntry, current_boot_id

    base = tmp_path_factory.mktemp("sh")
    with control_plane.api_client() as api:
        reader = SweepReader(api)
        config = agent_config(base, build_host(base / "host0", vf_nics=()), node)
        checkpoint = Checkpoint(config.checkpoint_path, boot_id=current_boot_id())
        for i in range(3):
            checkpoint.put(ClaimEntry(f"uid-hang-{i}", node, f"hang-{i}", ()))
        with agent_running(
            base, control_plane, node, reader, discovery_interval=0.3, sweep_interval=0.2
        ) as (agent, _):
            assert reader.hanging.wait(20)
            passes = agent.passes
            wait_for(lambda: agent.passes >= passes + 2, what="passes while the sweep hangs")


def _rdma_modes(api: Any, node: str) -> dict[str, str]:
    slices = (
        client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}").items
    )
    return {
        d.name: d.attributes["rdmaMode"].string
        for s in slices
        for d in s.spec.devices or []
        if d.attributes and "rdmaMode" in d.attributes
    }


def _versions(api: Any, node: str) -> dict[str, str]:
    slices = (
        client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}").items
    )
    return {s.metadata.name: s.metadata.resource_version for s in slices}


def test_the_node_label_picks_the_rdma_mode_and_a_held_nic_keeps_its_own(
    tmp_path_factory: pytest.TempPathFactory,
    control_plane: ControlPlane,
    crds: None,
    node: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Issue 20 point 4: the agent follows `fabricdra.io/rdma-mode` for its life (re-read each
    pass); an endpoint a prepared claim holds stays as it was published until unprepared; an
    unchanged pass writes nothing; an invalid value falls back to --rdma-mode with an error
    and one Warning event on the NodeDevices record; `off` withdraws the NICs, not the GPUs."""
    base = tmp_path_factory.mktemp("mode")
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node, discovery_interval=3600, verification_gate=False)
    held = "rdma-0000-19-00-0"

    def label(value: str) -> None:
        patch = {"metadata": {"labels": {"fabricdra.io/rdma-mode": value}}}
        client.CoreV1Api(api).patch_node(node, patch)

    with control_plane.api_client() as api:
        agent = Agent(config, api)
        agent.pass_once()
        modes = _rdma_modes(api, node)
        assert len(modes) == 8
        assert set(modes.values()) == {"exclusive"}  # no label: --rdma-mode (exclusive)

        uid = create_claim(api, node, "held", [{"request": "nic", "device": held, "pool": node}])
        claim = ClaimRef(node, "held", uid)
        assert [d.device_name for d in agent.driver.prepare(claim)] == [held]

        label("shared")
        agent.pass_once()
        modes = _rdma_modes(api, node)
        assert modes.pop(held) == "exclusive"  # held: not flipped under its claim
        assert set(modes.values()) == {"shared"}
        before = _versions(api, node)
        agent.pass_once()
        assert _versions(api, node) == before  # an unchanged pass writes nothing

        agent.driver.unprepare(claim)
        agent.pass_once()
        assert set(_rdma_modes(api, node).values()) == {"shared"}

        label("partitioned")
        capfd.readouterr()
        agent.pass_once()
        agent.pass_once()
        assert set(_rdma_modes(api, node).values()) == {"exclusive"}  # the default
        logged = capfd.readouterr()
        assert "invalid node label; using the default RDMA mode" in logged.out + logged.err
        events = (
            client.CoreV1Api(api)
            .list_namespaced_event(
                "default", field_selector=f"involvedObject.name={node},reason=InvalidRdmaMode"
            )
            .items
        )
        assert len(events) == 1  # once per invalid value, not once per pass
        assert events[0].involved_object.kind == "NodeDevices"
        assert "'partitioned'" in events[0].message

        label("off")
        agent.pass_once()
        assert _rdma_modes(api, node) == {}
        assert "gpu-0000-18-00-0" in slice_devices(api, node)
        agent.families.nvidia.xids.close()


def test_a_hold_whose_claim_left_the_api_no_longer_keeps_its_mode(
    tmp_path_factory: pytest.TempPathFactory,
    control_plane: ControlPlane,
    crds: None,
    node: str,
) -> None:
    """A checkpoint entry kubelet has not unprepared (yet, or ever) whose claim is gone from the
    API (deleted, or recreated under another UID) no longer keeps its endpoint in the held
    mode: the scheduler no longer sees that allocation, so an `exclusive` offering in shared
    mode would hand the NIC to an exclusive request (the install test's claim `x`). The entry
    itself stays (only kubelet's unprepare frees a device), so prepare refuses new claims of
    the NIC: it is offered in no mode until kubelet unprepares, then in the node's. A hold
    whose claim still exists keeps its mode. Only claims whose hold changes what is offered
    are read, and a claim found gone is not read again."""
    base = tmp_path_factory.mktemp("gone")
    host = build_host(base / "host", vf_nics=())
    config = agent_config(base, host, node, discovery_interval=3600, verification_gate=False)
    gone, kept = "rdma-0000-19-00-0", "rdma-0000-3b-00-0"
    with control_plane.api_client() as api:
        resource = client.ResourceV1Api(api)
        reader = SweepReader(api)
        agent = Agent(config, api, claims=reader)
        agent.pass_once()
        refs = {}
        for name, device in (("gone", gone), ("kept", kept)):
            uid = create_claim(
                api, node, name, [{"request": "nic", "device": device, "pool": node}]
            )
            refs[name] = ClaimRef(node, name, uid)
            assert [d.device_name for d in agent.driver.prepare(refs[name])] == [device]
        reads = dict(reader.reads)
        agent.pass_once()
        assert reader.reads == reads  # the node's mode is the held one: nothing to read
        client.CoreV1Api(api).patch_node(
            node, {"metadata": {"labels": {"fabricdra.io/rdma-mode": "shared"}}}
        )
        agent.pass_once()
        modes = _rdma_modes(api, node)
        assert (modes[gone], modes[kept]) == ("exclusive", "exclusive")
        assert (reader.reads["gone"], reader.reads["kept"]) == (
            reads["gone"] + 1,
            reads["kept"] + 1,
        )

        resource.delete_namespaced_resource_claim("gone", node)
        wait_for(
            lambda: (
                not [
                    c
                    for c in resource.list_namespaced_resource_claim(node).items
                    if c.metadata.name == "gone"
                ]
            ),
            what="the claim deleted",
        )
        agent.pass_once()
        modes = _rdma_modes(api, node)
        assert gone not in modes  # withheld: no claim could be prepared on it
        assert modes.pop(kept) == "exclusive"  # its claim exists: never moved under it
        assert set(modes.values()) == {"shared"}  # no exclusive offering left for a new claim
        reads = dict(reader.reads)
        agent.pass_once()
        assert (reader.reads["gone"], reader.reads["kept"]) == (reads["gone"], reads["kept"] + 1)
        assert [e.uid for e in agent.driver.checkpoint.entries()] == sorted(
            [refs["gone"].uid, refs["kept"].uid]
        )
        # the entry still holds the NIC: a new claim of it is refused until kubelet unprepares
        late = create_claim(api, node, "late", [{"request": "nic", "device": gone, "pool": node}])
        with pytest.raises(PrepareError):
            agent.driver.prepare(ClaimRef(node, "late", late))
        agent.driver.unprepare(refs["gone"])
        agent.pass_once()
        assert _rdma_modes(api, node)[gone] == "shared"  # unprepared: the node's mode
        agent.families.nvidia.xids.close()
