"""`PluginServer`: serves kubelet's plugin registration, DRA v1 + v1beta1 and the DRA health
stream for any `DraDriver`, over two unix sockets.

    server = PluginServer(driver, PluginPaths.for_driver(driver.driver_name), health=broadcaster)
    server.start()      # DRA socket first, then the registration socket kubelet watches
    ...
    server.stop()       # registration socket first (kubelet deregisters), then the DRA socket

`metrics` (a `ClaimMetrics`, optional) receives each claim's prepare/unprepare time and
failures, labelled by driver name: the driver's process owns its metrics registry, and this
shared server imports no driver's module.

`on_registration(status)` is called for each NotifyRegistrationStatus (e.g. to republish at
once: kubelet deletes the node's ResourceSlices when it starts, then registers the plugin).

Kubelet's side of the contract, as this server meets it (kubelet v1.34-v1.36):
- registration: `<registry_dir>/<driver>-reg.sock` (`<driver>-<pod uid>-reg.sock` with
  rolling updates, see `PluginPaths.for_driver`) answers `GetInfo` with type `DRAPlugin`,
  the driver name, the absolute DRA socket path and the services in the order kubelet should
  pick them: `v1.DRAPlugin`, `v1beta1.DRAPlugin` (1.32/1.33 kubelets know only the latter),
  then `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth` when a health broadcaster is
  given (a 1.37 kubelet picks v1, older ones know only v1alpha1).
- `<plugin_dir>/dra.sock` (`dra-<pod uid>.sock`) serves `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`,
  `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`, `v1.DRAResourceHealth` and
  `v1alpha1.DRAResourceHealth`.
- every claim in a request gets exactly one entry in the response (kubelet fails the whole
  batch otherwise); a driver exception becomes that claim's `error`.
- driver calls are serialized by one lock, like the Go helper's default, unless the driver
  says it `locks_itself` (then it is called concurrently and serializes what it must; a
  driver that reads the API or waits must, see `claims.py`: a slow claim never delays
  another). The lock is waited for only until kubelet's deadline, and a call kubelet has
  given up on (cancelled, or its deadline passed) never reaches the driver.
- each driver call runs inside `serving(Call(...))`: the deadline is kubelet's (the gRPC
  deadline, at most `KUBELET_DEADLINE`), and `active()` follows the gRPC context, so a driver
  stops working for a call kubelet has given up on.
"""

from __future__ import annotations

import gc
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

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

from .driver import KUBELET_DEADLINE, Call, ClaimRef, DraDriver, PreparedDevice, serving
from .healthstream import HealthBroadcaster

log = structlog.get_logger("fabricdra.kubelet")

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration constants.go
DRA_V1_SERVICE = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE = "v1beta1.DRAPlugin"
HEALTH_V1_SERVICE = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1_SERVICE = "v1alpha1.DRAResourceHealth"
# Newest first: a 1.37+ kubelet picks the newest health service both sides know, and older
# kubelets skip names they do not know (as 1.32 skipped v1.DRAPlugin).
HEALTH_SERVICES = (HEALTH_V1_SERVICE, HEALTH_V1ALPHA1_SERVICE)

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")

# sockaddr_un.sun_path is 108 bytes including the terminating NUL, but gRPC's server (core,
# as in grpcio 1.7x) refuses paths longer than 105 bytes: the limit that holds for us.
MAX_SOCKET_PATH = 105
# What may go into a socket file name as the instance: a pod UID is a lowercase UUID.
_INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MIN_INSTANCE = 8  # characters of a UID kept at least when a socket path must be shortened


class PluginServerError(Exception):
    """The server cannot start (bad socket path, address in use...)."""


@dataclass(frozen=True, slots=True)
class PluginPaths:
    """Where the sockets go. Both paths must be the same inside and outside the container."""

    registration_socket: Path
    dra_socket: Path

    @classmethod
    def for_driver(
        cls,
        driver_name: str,
        *,
        registry_dir: str | os.PathLike[str] = DEFAULT_REGISTRY_DIR,
        plugin_dir: str | os.PathLike[str] | None = None,
        instance: str | None = None,
    ) -> PluginPaths:
        """kubelet's conventional layout: `<registry_dir>/<driver>-reg.sock` and
        `<plugin_dir or /var/lib/kubelet/plugins/<driver>>/dra.sock`.

        With `instance` (the pod's UID), the names upstream's helper uses for rolling updates
        (k8s.io/dynamic-resource-allocation/kubeletplugin, `RollingUpdate(uid)`):
        `<driver>-<uid>-reg.sock` and `dra-<uid>.sock`. Two pods of one driver then never
        share a socket path, so neither replaces or removes the other's, and kubelet 1.33+
        keeps both registered while they overlap.

        A whole UID makes paths 37 bytes longer, and a socket path must stay within
        `MAX_SOCKET_PATH`: where the whole UID does not fit (compute-domain.fabricdra.io under
        /var/lib/kubelet misses by 2 bytes; a longer kubelet root dir), its longest prefix
        that fits both paths is used, if that keeps at least `MIN_INSTANCE` characters (about
        32 random bits: two pods of one node never meet on it in practice). Otherwise the
        whole UID, and `start` names the path that is too long."""
        plugin = Path(plugin_dir) if plugin_dir is not None else DEFAULT_PLUGINS_DIR / driver_name
        registry = Path(registry_dir).absolute()
        plugin = plugin.absolute()
        part = ""
        if instance:
            if not _INSTANCE.fullmatch(instance):
                raise PluginServerError(
                    f"instance {instance!r} is not a pod UID (letters, digits, '-', '.', '_')"
                )
            fixed = max(
                len(os.fsencode(registry / f"{driver_name}--reg.sock")),
                len(os.fsencode(plugin / "dra-.sock")),
            )
            room = MAX_SOCKET_PATH - fixed
            if len(instance) > room and len(instance[:room].rstrip("-")) >= MIN_INSTANCE:
                instance = instance[:room].rstrip("-")
            part = f"-{instance}"
        return cls(
            registration_socket=registry / f"{driver_name}{part}-reg.sock",
            dra_socket=plugin / f"dra{part}.sock",
        )


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    registered: bool
    error: str


@dataclass(frozen=True)
class ClaimMetrics:
    """Prometheus collectors, each with one label (the driver name): time per claim as
    histograms (`observe`), failed claims as counters (`inc`)."""

    prepare_seconds: Any
    unprepare_seconds: Any
    prepare_errors: Any
    unprepare_errors: Any


class _Claims:
    """The claim-level logic both DRA API versions share (they differ only in `share_id`)."""

    def __init__(
        self, driver: DraDriver, lock: threading.Lock, metrics: ClaimMetrics | None
    ) -> None:
        self.driver = driver
        self.metrics = metrics
        self.lock: threading.Lock | None = None if getattr(driver, "locks_itself", False) else lock

    def prepare(self, pb: Any, request: Any, with_share_id: bool, call: Call) -> Any:
        with serving(call):
            return self._prepare(pb, request, with_share_id, call)

    def unprepare(self, pb: Any, request: Any, call: Call) -> Any:
        with serving(call):
            return self._unprepare(pb, request, call)

    @contextmanager
    def _driver(self, call: Call) -> Iterator[None]:
        """The right to call the driver for one claim of `call`: never for a call kubelet
        gave up on, and the server's lock (serialized drivers) waited for only until
        kubelet's deadline — a claim another call holds up fails instead of answering late."""
        if not call.active():
            raise GaveUp("kubelet gave up on this call before the driver was asked")
        if self.lock is None:
            yield
            return
        if not self.lock.acquire(timeout=max(0.0, call.remaining())):
            raise GaveUp("another claim held the driver until kubelet's deadline")
        try:
            # It went while this call waited for the lock; or so little is left that kubelet
            # has (its deadline runs from the send, ours from when the call was read: ours can
            # trail it, and the cancellation reach us after the lock).
            if not call.active() or call.remaining() < LATE_START:
                raise GaveUp("kubelet gave up on this call before the driver was asked")
            yield
        finally:
            self.lock.release()

    def _prepare(self, pb: Any, request: Any, with_share_id: bool, call: Call) -> Any:
        response = pb.NodePrepareResourcesResponse()
        name = self.driver.driver_name
        for c in request.claims:
            claim = ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid)
            entry = response.claims[c.uid]
            start = time.perf_counter()
            try:
                if not (c.uid and c.name and c.namespace):
                    raise ValueError(f"claim {claim}: namespace, name and uid are all required")
                with self._driver(call):
                    devices = self.driver.prepare(claim)
                entry.devices.extend(_device(pb, d, with_share_id) for d in devices)
                log.info("claim prepared", claim=str(claim), devices=len(devices))
            except Exception as e:
                if self.metrics is not None:
                    self.metrics.prepare_errors.labels(name).inc()
                log.warning("claim prepare failed", claim=str(claim), error=str(e))
                entry.Clear()
                entry.error = f"prepare {claim}: {e}"
            finally:
                if self.metrics is not None:
                    self.metrics.prepare_seconds.labels(name).observe(time.perf_counter() - start)
        return response

    def _unprepare(self, pb: Any, request: Any, call: Call) -> Any:
        response = pb.NodeUnprepareResourcesResponse()
        name = self.driver.driver_name
        for c in request.claims:
            claim = ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid)
            entry = response.claims[c.uid]  # present (and empty) on success: kubelet needs it
            start = time.perf_counter()
            try:
                if not c.uid:
                    raise ValueError(f"claim {claim}: uid is required")
                with self._driver(call):
                    self.driver.unprepare(claim)
                log.info("claim unprepared", claim=str(claim))
            except Exception as e:
                if self.metrics is not None:
                    self.metrics.unprepare_errors.labels(name).inc()
                log.warning("claim unprepare failed", claim=str(claim), error=str(e))
                entry.error = f"unprepare {claim}: {e}"
            finally:
                if self.metrics is not None:
                    elapsed = time.perf_counter() - start
                    self.metrics.unprepare_seconds.labels(name).observe(elapsed)
        return response


# Under this much of kubelet's deadline left after waiting for the lock, the driver is not asked.
LATE_START = 0.2


class GaveUp(Exception):
    """The driver was not asked: kubelet had gone, or its deadline came first."""


def _call(context: Any) -> Call:
    """The driver's view of a gRPC call: kubelet's deadline (capped at KUBELET_DEADLINE) and
    whether the caller is still there."""
    remaining = context.time_remaining()
    budget = KUBELET_DEADLINE if remaining is None else min(remaining, KUBELET_DEADLINE)
    return Call(time.monotonic() + budget, context.is_active)


def _device(pb: Any, d: PreparedDevice, with_share_id: bool) -> Any:
    device = pb.Device(
        request_names=list(d.request_names),
        pool_name=d.pool_name,
        device_name=d.device_name,
        cdi_device_ids=list(d.cdi_device_ids),
    )
    if with_share_id and d.share_id is not None:
        device.share_id = d.share_id
    return device


class _DraV1(v1_grpc.DRAPluginServicer):
    def __init__(self, claims: _Claims) -> None:
        self.claims = claims

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return self.claims.prepare(v1_pb2, request, True, _call(context))

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return self.claims.unprepare(v1_pb2, request, _call(context))


class _DraV1beta1(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, claims: _Claims) -> None:
        self.claims = claims

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return self.claims.prepare(v1beta1_pb2, request, False, _call(context))

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return self.claims.unprepare(v1beta1_pb2, request, _call(context))


class _Health:
    """NodeWatchResources of one health API version (`pb`: its generated messages)."""

    def __init__(self, broadcaster: HealthBroadcaster, pb: Any) -> None:
        self.broadcaster = broadcaster
        self.pb = pb

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        # Wake the wait below when kubelet goes away, so the worker thread is freed.
        context.add_callback(self.broadcaster.wake)
        version, devices = self.broadcaster.snapshot()
        log.info("health stream opened", devices=len(devices), api=self.pb.DESCRIPTOR.package)
        while context.is_active():
            yield _health_response(self.pb, devices)
            # Next send: on a change, or after resend_seconds as a refresh.
            update = self.broadcaster.wait(version, self.broadcaster.resend_seconds)
            if update is None:
                return
            version, devices = update
        log.info("health stream closed")


def _health_response(pb: Any, devices: Sequence[Any]) -> Any:
    now = int(time.time())
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
                # "Healthy" -> HEALTHY: v1 and v1alpha1 name their enum values alike
                health=pb.HealthStatus.Value(d.health.upper()),
                last_updated_time=now,
                message=d.message or "",
            )
            for d in devices
        ]
    )


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, server: PluginServer) -> None:
        self.server = server

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.server.driver.driver_name,
            endpoint=str(self.server.paths.dra_socket),
            supported_versions=self.server.supported_versions,
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        status = RegistrationStatus(request.plugin_registered, request.error)
        self.server._registration_status(status)
        if not status.registered:
            context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {status.error}")
        return reg_pb2.RegistrationStatusResponse()


class PluginServer:
    """Registration + DRA (v1, v1beta1) + health over unix sockets for one `DraDriver`."""

    def __init__(
        self,
        driver: DraDriver,
        paths: PluginPaths,
        *,
        health: HealthBroadcaster | None = None,
        on_registration: Callable[[RegistrationStatus], None] | None = None,
        metrics: ClaimMetrics | None = None,
        # Each open health stream holds a worker, and a prepare waiting on a slow API read
        # holds one until its budget ends: enough workers that an unprepare still gets one.
        max_workers: int = 16,
    ) -> None:
        self.driver = driver
        self.on_registration = on_registration
        self.metrics = metrics
        self.paths = paths
        self.health = health
        self.max_workers = max_workers
        self.supported_versions = [DRA_V1_SERVICE, DRA_V1BETA1_SERVICE]
        if health is not None:
            self.supported_versions.extend(HEALTH_SERVICES)
        self.status: RegistrationStatus | None = None
        self.registered = threading.Event()
        self._dra: grpc.Server | None = None
        self._registration: grpc.Server | None = None

    def _registration_status(self, status: RegistrationStatus) -> None:
        self.status = status
        if status.registered:
            log.info("registered with kubelet", driver=self.driver.driver_name)
            self.registered.set()
        else:
            log.error("kubelet refused the registration", error=status.error)
            self.registered.clear()
        if self.on_registration is not None:
            self.on_registration(status)

    def start(self) -> None:
        """DRA socket first (kubelet may call it the moment it sees the registration socket),
        then the registration socket."""
        if self._dra is not None:
            raise PluginServerError("plugin server already started")
        if self.health is not None:
            self.health.reopen()
        # What start-up allocated (modules, the client, the first inventory) lives as long as
        # the process: out of the collector's sight, a full collection inside a prepare scans
        # only what serving allocates (unfrozen, one took 121 ms in the middle of a prepare).
        gc.collect()
        gc.freeze()
        claims = _Claims(self.driver, threading.Lock(), self.metrics)
        dra = self._serve(self.paths.dra_socket)
        # The generated add_* functions are untyped (protoc's grpc plugin emits no hints).
        _add(v1_grpc.add_DRAPluginServicer_to_server, _DraV1(claims), dra)
        _add(v1beta1_grpc.add_DRAPluginServicer_to_server, _DraV1beta1(claims), dra)
        if self.health is not None:
            _add(
                health_v1_grpc.add_DRAResourceHealthServicer_to_server,
                _Health(self.health, health_v1_pb2),
                dra,
            )
            _add(
                health_grpc.add_DRAResourceHealthServicer_to_server,
                _Health(self.health, health_pb2),
                dra,
            )
        dra.start()
        self._dra = dra
        try:
            registration = self._serve(self.paths.registration_socket)
            _add(reg_grpc.add_RegistrationServicer_to_server, _Registration(self), registration)
            registration.start()
        except BaseException:
            self.stop()
            raise
        self._registration = registration
        log.info(
            "plugin server started",
            driver=self.driver.driver_name,
            dra_socket=str(self.paths.dra_socket),
            registration_socket=str(self.paths.registration_socket),
            services=self.supported_versions,
        )

    def _serve(self, socket_path: Path) -> grpc.Server:
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise PluginServerError(
                f"socket path {socket_path} is longer than the {MAX_SOCKET_PATH} bytes "
                "a unix socket address can hold"
            )
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        _remove_socket(socket_path)  # a stale socket of our own earlier run
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.max_workers, thread_name_prefix=socket_path.name
            ),
            options=[("grpc.so_reuseport", 0)],
        )
        try:
            port = server.add_insecure_port(f"unix://{socket_path}")
        except RuntimeError as e:
            raise PluginServerError(f"cannot listen on {socket_path}: {e}") from e
        if port == 0:
            raise PluginServerError(f"cannot listen on {socket_path}")
        return server

    def stop(self, grace: float = 1.0) -> None:
        """Registration socket first (kubelet stops routing to us), then DRA; both removed.
        Only this server's own two paths: with per-pod names a newer pod's sockets in the
        same folders are never touched."""
        if self.health is not None:
            self.health.close()
        for server, path in (
            (self._registration, self.paths.registration_socket),
            (self._dra, self.paths.dra_socket),
        ):
            if server is not None:
                server.stop(grace).wait()
                _remove_socket(path)
        self._registration = self._dra = None
        log.info("plugin server stopped", driver=self.driver.driver_name)

    def __enter__(self) -> PluginServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _add(add: Callable[..., None], servicer: object, server: grpc.Server) -> None:
    add(servicer, server)


def _remove_socket(path: Path) -> None:
    """Remove `path` only when it is a socket: never another file someone put there."""
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass
