"""The reusable plugin server over real unix sockets, acting as kubelet with the generated
stubs, with a small in-test driver (the devices driver is tested in
tests/integration/test_kubelet_grpc.py)."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from fabricdra.kubeletplugin import metrics
from fabricdra.kubeletplugin.kubelet import (
    ClaimRef,
    DeviceHealth,
    HealthBroadcaster,
    PluginPaths,
    PluginServer,
    PluginServerError,
    PreparedDevice,
    PrepareError,
)
from fabricdra.kubeletplugin.kubelet.server import MAX_SOCKET_PATH
from fabricdra.proto.gen.dra_health_v1 import api_pb2 as health_v1_pb2
from fabricdra.proto.gen.dra_health_v1 import api_pb2_grpc as health_v1_grpc
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2 as health_pb2
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from fabricdra.proto.gen.dra_v1beta1 import api_pb2 as v1beta1_pb2
from fabricdra.proto.gen.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc
from fabricdra.proto.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from fabricdra.proto.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc

from .socketdir import socket_dir


class RecordingDriver:
    driver_name = "test.fabricdra.io"

    def __init__(self) -> None:
        self.prepared: list[ClaimRef] = []
        self.unprepared: list[ClaimRef] = []

    def prepare(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        if claim.name == "bad":
            raise PrepareError("device gpu-9 is not on this node")
        self.prepared.append(claim)
        return [
            PreparedDevice(
                pool_name="node-a",
                device_name="gpu-0",
                cdi_device_ids=(f"k8s.test.fabricdra.io/claim={claim.uid}-gpu-0",),
                request_names=("gpu",),
                share_id="s1",
            )
        ]

    def unprepare(self, claim: ClaimRef) -> None:
        self.unprepared.append(claim)


@pytest.fixture
def sockets() -> Iterator[PluginPaths]:
    with socket_dir() as base:
        yield PluginPaths.for_driver(
            RecordingDriver.driver_name, registry_dir=base / "reg", plugin_dir=base / "plugin"
        )


@pytest.fixture
def server(sockets: PluginPaths) -> Iterator[tuple[PluginServer, RecordingDriver]]:
    driver = RecordingDriver()
    srv = PluginServer(driver, sockets, health=HealthBroadcaster(resend_seconds=0.2))
    srv.start()
    yield srv, driver
    srv.stop()


def channel(path: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{path}")


def test_sockets_and_registration(server: tuple[PluginServer, RecordingDriver]) -> None:
    srv, _ = server
    for path in (srv.paths.dra_socket, srv.paths.registration_socket):
        assert stat.S_ISSOCK(path.stat().st_mode)
    assert srv.paths.registration_socket.name == "test.fabricdra.io-reg.sock"
    with channel(srv.paths.registration_socket) as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=30)
        assert info.type == "DRAPlugin"
        assert info.name == "test.fabricdra.io"
        assert info.endpoint == str(srv.paths.dra_socket)
        # Health newest first: a 1.37 kubelet takes v1, a 1.34-1.36 one v1alpha1.
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True))
        assert srv.registered.is_set()
        with pytest.raises(grpc.RpcError) as e:
            stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=False, error="no such version")
            )
        assert "no such version" in str(e.value.details())
        assert not srv.registered.is_set()


def test_stop_removes_both_sockets(sockets: PluginPaths) -> None:
    srv = PluginServer(RecordingDriver(), sockets)
    with srv:
        assert sockets.dra_socket.exists()
    assert not sockets.dra_socket.exists()
    assert not sockets.registration_socket.exists()


def test_no_health_service_advertised_without_a_broadcaster(sockets: PluginPaths) -> None:
    with PluginServer(RecordingDriver(), sockets):
        with channel(sockets.registration_socket) as ch:
            info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=30)
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        with channel(sockets.dra_socket) as dra:
            stream = health_grpc.DRAResourceHealthStub(dra).NodeWatchResources(
                health_pb2.NodeWatchResourcesRequest(), timeout=30
            )
            with pytest.raises(grpc.RpcError) as e:
                next(iter(stream))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(
    ("pb", "stub_class"),
    [(v1_pb2, v1_grpc.DRAPluginStub), (v1beta1_pb2, v1beta1_grpc.DRAPluginStub)],
)
def test_prepare_and_unprepare_both_versions(
    server: tuple[PluginServer, RecordingDriver], pb: object, stub_class: type
) -> None:
    srv, driver = server
    with channel(srv.paths.dra_socket) as ch:
        stub = stub_class(ch)
        good = pb.Claim(namespace="ns", name="good", uid="u-1")  # type: ignore[attr-defined]
        bad = pb.Claim(namespace="ns", name="bad", uid="u-2")  # type: ignore[attr-defined]
        resp = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[good, bad]),  # type: ignore[attr-defined]
            timeout=45,
        )
        assert set(resp.claims) == {"u-1", "u-2"}
        (device,) = resp.claims["u-1"].devices
        assert device.pool_name == "node-a"
        assert device.device_name == "gpu-0"
        assert list(device.cdi_device_ids) == ["k8s.test.fabricdra.io/claim=u-1-gpu-0"]
        assert list(device.request_names) == ["gpu"]
        if pb is v1_pb2:
            assert device.share_id == "s1"
        assert resp.claims["u-1"].error == ""
        assert "gpu-9 is not on this node" in resp.claims["u-2"].error
        assert "ns/bad" in resp.claims["u-2"].error
        assert not resp.claims["u-2"].devices
        assert driver.prepared == [ClaimRef("ns", "good", "u-1")]

        resp = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[good, bad]),  # type: ignore[attr-defined]
            timeout=45,
        )
        assert set(resp.claims) == {"u-1", "u-2"}  # an entry for every claim, even on success
        assert all(r.error == "" for r in resp.claims.values())
        assert [c.uid for c in driver.unprepared] == ["u-1", "u-2"]


def test_claim_without_uid_is_refused(server: tuple[PluginServer, RecordingDriver]) -> None:
    srv, driver = server
    with channel(srv.paths.dra_socket) as ch:
        resp = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            v1_pb2.NodePrepareResourcesRequest(claims=[v1_pb2.Claim(namespace="ns", name="x")])
        )
    assert "uid are all required" in resp.claims[""].error
    assert driver.prepared == []


def test_health_stream_sends_snapshot_changes_and_refreshes(
    server: tuple[PluginServer, RecordingDriver],
) -> None:
    srv, _ = server
    assert srv.health is not None
    srv.health.publish([DeviceHealth("node-a", "rdma-0", "Healthy")])
    with channel(srv.paths.dra_socket) as ch:
        stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest(), timeout=60
        )
        first = next(stream)
        assert [(d.device.device_name, d.health) for d in first.devices] == [
            ("rdma-0", health_pb2.HEALTHY)
        ]
        assert first.devices[0].last_updated_time > 0
        changed = threading.Timer(
            0.05,
            srv.health.publish,
            [[DeviceHealth("node-a", "rdma-0", "Unhealthy", "link down: port 1 Disabled")]],
        )
        changed.start()
        second = next(stream)
        while second.devices[0].health == health_pb2.HEALTHY:  # a refresh may come first
            second = next(stream)
        assert second.devices[0].health == health_pb2.UNHEALTHY
        assert second.devices[0].message == "link down: port 1 Disabled"
        refresh = next(stream)  # nothing changed: resent after resend_seconds
        # The same readings, stamped with the time they were sent (a resend is a fresh reading
        # to kubelet's per-device timeout), so only the stamp may move forward.
        assert [(d.device, d.health, d.message) for d in refresh.devices] == [
            (d.device, d.health, d.message) for d in second.devices
        ]
        assert refresh.devices[0].last_updated_time >= second.devices[0].last_updated_time
        stream.cancel()


@pytest.mark.parametrize(
    ("grpc_mod", "pb"),
    [(health_v1_grpc, health_v1_pb2), (health_grpc, health_pb2)],
    ids=["v1", "v1alpha1"],
)
def test_both_health_versions_stream_the_same_snapshot(
    server: tuple[PluginServer, RecordingDriver], grpc_mod: Any, pb: Any
) -> None:
    srv, _ = server
    assert srv.health is not None
    srv.health.publish(
        [
            DeviceHealth("node-a", "gpu-0", "Unknown", "no NVML reading"),
            DeviceHealth("node-a", "rdma-0", "Unhealthy", "link down"),
            DeviceHealth("node-a", "rdma-1", "Healthy"),
        ]
    )
    with channel(srv.paths.dra_socket) as ch:
        stream = grpc_mod.DRAResourceHealthStub(ch).NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=60
        )
        first = next(stream)
        stream.cancel()
    assert [
        (d.device.pool_name, d.device.device_name, d.health, d.message) for d in first.devices
    ] == [
        ("node-a", "gpu-0", pb.UNKNOWN, "no NVML reading"),
        ("node-a", "rdma-0", pb.UNHEALTHY, "link down"),
        ("node-a", "rdma-1", pb.HEALTHY, ""),
    ]
    assert all(d.last_updated_time > 0 for d in first.devices)


def test_unchanged_publish_is_not_a_change() -> None:
    b = HealthBroadcaster()
    assert b.publish([DeviceHealth("p", "d", "Healthy")])
    assert not b.publish([DeviceHealth("p", "d", "Healthy")])
    assert b.publish([DeviceHealth("p", "d", "Unknown", "x" * 2000)])
    _, (dev,) = b.snapshot()
    assert dev.message is not None
    assert len(dev.message) == 1024
    assert dev.message.endswith("...")


def test_too_long_socket_path_is_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    paths = PluginPaths.for_driver("test.fabricdra.io", registry_dir=deep, plugin_dir=deep)
    with pytest.raises(PluginServerError, match="longer than"):
        PluginServer(RecordingDriver(), paths).start()


def test_a_stale_socket_is_replaced_but_a_regular_file_is_not_removed(
    sockets: PluginPaths,
) -> None:
    with PluginServer(RecordingDriver(), sockets):
        pass
    sockets.dra_socket.parent.mkdir(parents=True, exist_ok=True)
    sockets.dra_socket.write_text("not ours")
    with pytest.raises(PluginServerError):
        PluginServer(RecordingDriver(), sockets).start()
    assert sockets.dra_socket.read_text() == "not ours"


def test_rolling_update_names_each_pods_sockets_like_upstream(tmp_path: Path) -> None:
    """With the pod UID (k8s.io/dynamic-resource-allocation/kubeletplugin RollingUpdate):
    `<registry>/<driver>-<uid>-reg.sock` and `<plugin dir>/dra-<uid>.sock`."""
    paths = PluginPaths.for_driver(
        "test.fabricdra.io",
        registry_dir=tmp_path / "reg",
        plugin_dir=tmp_path / "p",
        instance="u-1",
    )
    assert paths.registration_socket == tmp_path / "reg" / "test.fabricdra.io-u-1-reg.sock"
    assert paths.dra_socket == tmp_path / "p" / "dra-u-1.sock"


def test_the_old_pods_exit_leaves_the_new_pods_sockets() -> None:
    """A rolling update with maxSurge: the new pod starts while the old one serves, then the
    old one stops. The new pod's sockets (and kubelet's way to it) must survive."""
    with socket_dir() as base:

        def paths(uid: str) -> PluginPaths:
            return PluginPaths.for_driver(
                RecordingDriver.driver_name,
                registry_dir=base / "reg",
                plugin_dir=base / "plugin",
                instance=uid,
            )

        old, new = (
            PluginServer(RecordingDriver(), paths("old")),
            PluginServer(RecordingDriver(), paths("new")),
        )
        old.start()
        new.start()
        # Both are there for kubelet (1.33+ keeps both registered and uses the newer one).
        assert sorted(p.name for p in (base / "reg").iterdir()) == [
            "test.fabricdra.io-new-reg.sock",
            "test.fabricdra.io-old-reg.sock",
        ]
        old.stop()
        try:
            assert stat.S_ISSOCK(new.paths.registration_socket.stat().st_mode)
            assert stat.S_ISSOCK(new.paths.dra_socket.stat().st_mode)
            assert not old.paths.registration_socket.exists()
            assert not old.paths.dra_socket.exists()
            with channel(new.paths.registration_socket) as ch:
                info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=30)
            assert info.endpoint == str(new.paths.dra_socket)
            with channel(new.paths.dra_socket) as ch:
                resp = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                    v1_pb2.NodePrepareResourcesRequest(
                        claims=[v1_pb2.Claim(namespace="ns", name="c", uid="u1")]
                    ),
                    timeout=30,
                )
            assert resp.claims["u1"].devices[0].device_name == "gpu-0"
        finally:
            new.stop()


def test_a_uid_too_long_for_the_socket_path_is_cut_to_fit(tmp_path: Path) -> None:
    """The UID's longest prefix that keeps both paths within what gRPC's server can bind
    (105 bytes); each pod's names still differ from another pod's."""
    uid = "500b959b-bb7b-4b3b-8680-8f004d989de5"

    def paths(root: str, driver: str, u: str = uid) -> PluginPaths:
        return PluginPaths.for_driver(
            driver,
            registry_dir=f"{root}/plugins_registry",
            plugin_dir=f"{root}/plugins/{driver}",
            instance=u,
        )

    # The harness's kubelet root under /tmp, 15 bytes longer than /var/lib/kubelet.
    cut = paths("/tmp/fdra-e2e-c940m0v6/kubelet", "compute-domain.fabricdra.io")
    assert len(str(cut.registration_socket)) == MAX_SOCKET_PATH == 105
    assert (
        cut.registration_socket.name == "compute-domain.fabricdra.io-500b959b-bb7b-4b3b-8-reg.sock"
    )
    assert cut.dra_socket.name == "dra-500b959b-bb7b-4b3b-8.sock"
    other = paths("/tmp/fdra-e2e-c940m0v6/kubelet", "compute-domain.fabricdra.io", "61c0a8f2-0d3e")
    assert other.registration_socket != cut.registration_socket
    # Under /var/lib/kubelet: whole for devices.fabricdra.io, as upstream names it; the longer
    # driver name misses by 2 bytes.
    devices = paths("/var/lib/kubelet", "devices.fabricdra.io")
    assert devices.registration_socket.name == f"devices.fabricdra.io-{uid}-reg.sock"
    assert devices.dra_socket.name == f"dra-{uid}.sock"
    cd = paths("/var/lib/kubelet", "compute-domain.fabricdra.io")
    assert cd.registration_socket.name == f"compute-domain.fabricdra.io-{uid[:34]}-reg.sock"


def test_every_socket_path_the_server_accepts_can_be_bound(tmp_path: Path) -> None:
    """The length check is gRPC's real limit: a path of exactly MAX_SOCKET_PATH bytes is
    served, one byte more is refused with the clear error, not gRPC's."""
    base = Path("/tmp") / f"fdra-len-{os.getpid()}"
    base.mkdir(exist_ok=True)
    try:
        for extra, ok in ((0, True), (1, False)):
            name = "r" * (MAX_SOCKET_PATH + extra - len(str(base)) - 1)
            paths = PluginPaths(registration_socket=base / name, dra_socket=base / "d.sock")
            server = PluginServer(RecordingDriver(), paths)
            if ok:
                with server:
                    assert stat.S_ISSOCK((base / name).stat().st_mode)
            else:
                with pytest.raises(PluginServerError, match="longer than the 105 bytes"):
                    server.start()
    finally:
        for p in base.iterdir():
            p.unlink()
        base.rmdir()


class BlockingDriver(RecordingDriver):
    """A serialized driver (no `locks_itself`) whose prepare of claim "block" waits."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def prepare(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        if claim.name == "block":
            self.entered.set()
            self.release.wait(30)
        return super().prepare(claim)


def _handled(driver: str) -> float:
    value = metrics.REGISTRY.get_sample_value("fabricdra_prepare_seconds_count", {"driver": driver})
    return value or 0.0


def test_a_call_kubelet_gave_up_on_while_it_waited_never_reaches_the_driver(
    sockets: PluginPaths,
) -> None:
    """kubelet's deadline passed while the call waited behind another claim for the server's
    lock: the driver is not asked (it would prepare for nobody, and hold the lock again)."""
    driver = BlockingDriver()
    srv = PluginServer(driver, sockets, metrics=metrics.claim_metrics())
    srv.start()
    try:
        with channel(sockets.dra_socket) as ch:
            stub = v1_grpc.DRAPluginStub(ch)

            def request(name: str) -> Any:
                claim = v1_pb2.Claim(namespace="ns", name=name, uid=f"uid-{name}")
                return v1_pb2.NodePrepareResourcesRequest(claims=[claim])

            handled = _handled(driver.driver_name)
            blocked = stub.NodePrepareResources.future(request("block"), timeout=30)
            assert driver.entered.wait(10)
            # The server stops waiting for the lock at the deadline it saw; its answer (the
            # claim's error) may reach the caller just before the caller's own deadline fires.
            answer: Any = None
            try:
                answer = stub.NodePrepareResources(request("late"), timeout=1)
            except grpc.RpcError as e:
                answer = e.code()
            if isinstance(answer, grpc.StatusCode):
                assert answer == grpc.StatusCode.DEADLINE_EXCEEDED
            else:
                assert "until kubelet's deadline" in answer.claims["uid-late"].error
            driver.release.set()
            assert blocked.result(timeout=10).claims["uid-block"].error == ""
            # wait until the server has finished the late call's handler too
            for _ in range(200):
                if _handled(driver.driver_name) >= handled + 2:
                    break
                time.sleep(0.1)
            assert _handled(driver.driver_name) >= handled + 2
    finally:
        srv.stop()
    assert [c.name for c in driver.prepared] == ["block"]
