"""Xid events: NVML *events*, not readings. `LiveXidEvents` holds one event set open (the node
agent keeps it for its life) and drains it without blocking; `ReplayedXidEvents` plays back what
a snapshot recorded. Both answer the same two questions (nvml/__init__.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .live import _text
from .snapshot import (
    NvmlReadings,
    SnapshotError,
    SnapshotXidEvent,
    load_snapshot,
    normalise_bus_id,
)

_NO_INSTANCE = 0xFFFFFFFF  # NVML's "not inside a MIG instance"
MAX_EVENTS_PER_DRAIN = 4096  # a storm must not hold a pass forever: the rest wait a pass


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One Xid event. `bus` None: NVML could not say which GPU it came from."""

    bus: str | None
    xid: int
    gpu_instance: int | None = None
    compute_instance: int | None = None


class XidEventsError(Exception):
    """The event set cannot be created or waited on; the message says why."""


class XidEventSource(Protocol):
    def register(self, buses: Iterable[str]) -> dict[str, str | None]:
        """Register these GPUs for Xid critical errors. For each GPU it could decide: None
        (registered) or why not (e.g. "not supported"); GPUs it cannot decide yet are left
        out and asked again next pass. Raises `XidEventsError` when no event set exists."""
        ...

    def drain(self) -> list[XidEvent]:
        """The events that arrived since the last drain, oldest first, without blocking."""
        ...

    def close(self) -> None: ...


class LiveXidEvents:
    """One NVML event set for the owner's life (as NVIDIA's device plugin does): GPUs are
    registered once for `nvmlEventTypeXidCriticalError`, and `drain` polls the set with a zero
    timeout until it is empty, so a discovery pass never waits on it. The NVML library stays
    initialised while the set is open (NVML counts nvmlInit calls, so the per-pass readings'
    init/shutdown do not close it)."""

    def __init__(self) -> None:
        self._pynvml: Any = None
        self._set: Any = None
        self._failed: str | None = None

    def _open(self) -> Any:
        if self._set is not None:
            return self._set
        if self._failed is not None:
            raise XidEventsError(self._failed)
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            self._failed = f"nvidia-ml-py: {e}"
            raise XidEventsError(self._failed) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:  # no driver here (yet): asked again next pass
            raise XidEventsError(f"nvmlInit: {e}") from None
        try:
            self._set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise XidEventsError(f"nvmlEventSetCreate: {e}") from None
        self._pynvml = pynvml
        return self._set

    def register(self, buses: Iterable[str]) -> dict[str, str | None]:
        event_set = self._open()
        nvml = self._pynvml
        wanted = set(buses)
        out: dict[str, str | None] = {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            raise XidEventsError(f"nvmlDeviceGetCount: {e}") from None
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                bus = normalise_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            except nvml.NVMLError:
                continue  # a lost GPU: health reports it from the readings
            if bus not in wanted:
                continue
            out[bus] = _register(nvml, handle, event_set)
        return out

    def drain(self) -> list[XidEvent]:
        event_set = self._open()
        nvml = self._pynvml
        out: list[XidEvent] = []
        while len(out) < MAX_EVENTS_PER_DRAIN:
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, 0)
            except nvml.NVMLError_Timeout:
                break  # empty
            except nvml.NVMLError as e:
                raise XidEventsError(f"nvmlEventSetWait: {e}") from None
            if not int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                bus: str | None = normalise_bus_id(
                    _text(nvml.nvmlDeviceGetPciInfo(data.device).busId)
                )
            except nvml.NVMLError:
                bus = None
            gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
            out.append(
                XidEvent(
                    bus,
                    int(data.eventData),
                    None if gi == _NO_INSTANCE else gi,
                    None if ci == _NO_INSTANCE else ci,
                )
            )
        return out

    def close(self) -> None:
        if self._set is None:
            return
        nvml, self._set, event_set = self._pynvml, None, self._set
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlEventSetFree(event_set)
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _register(nvml: Any, handle: Any, event_set: Any) -> str | None:
    """None when the GPU now reports Xid critical errors into `event_set`, else why not."""
    try:
        supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
    except nvml.NVMLError as e:
        return f"supported event types unreadable: {e}"
    if not supported & nvml.nvmlEventTypeXidCriticalError:
        return "the GPU does not report Xid critical-error events"
    try:
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
    except nvml.NVMLError_NotSupported:
        return "Xid event registration not supported (GPU or driver too old)"
    except nvml.NVMLError as e:
        return f"Xid event registration failed: {e}"
    return None


class ReplayedXidEvents:
    """Xid events from a recorded snapshot, read afresh on every call: registration answers
    from `xidEventsSupported`/`xidEventsReason` (a GPU without them is left undecided, as an
    older snapshot says nothing about events), events from `xidEvents`, each delivered once
    in the recorded order."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self._delivered: dict[str, int] = {}

    def _load(self) -> NvmlReadings:
        try:
            return load_snapshot(self.path)
        except SnapshotError as e:
            raise XidEventsError(str(e)) from None

    def register(self, buses: Iterable[str]) -> dict[str, str | None]:
        gpus = self._load().gpus
        out: dict[str, str | None] = {}
        for bus in buses:
            gpu = gpus.get(bus)
            if gpu is None or gpu.xidEventsSupported is None:
                continue
            out[bus] = (
                None
                if gpu.xidEventsSupported
                else gpu.xidEventsReason or "Xid events not supported (recorded)"
            )
        return out

    def drain(self) -> list[XidEvent]:
        out: list[XidEvent] = []
        for bus, gpu in sorted(self._load().gpus.items()):
            events = gpu.xidEvents or []
            for e in events[self._delivered.get(bus, 0) :]:
                out.append(XidEvent(bus, e.xid, e.gpuInstanceId, e.computeInstanceId))
            self._delivered[bus] = len(events)
        return out

    def close(self) -> None:
        pass


def record_xid_events(
    readings: NvmlReadings, seconds: float, source: XidEventSource | None = None
) -> NvmlReadings:
    """`readings` with each GPU's Xid event support and the events that arrived within
    `seconds` (for `fabricdra nvml-snapshot`). A source that cannot open records nothing."""
    source = source or LiveXidEvents()
    gpus = dict(readings.gpus)
    try:
        registered = source.register(gpus)
        events: list[XidEvent] = []
        deadline = time.monotonic() + seconds
        while True:
            events.extend(source.drain())
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    except XidEventsError:
        return readings
    finally:
        source.close()
    for bus, why in registered.items():
        seen = [
            {"xid": e.xid, "gpuInstanceId": e.gpu_instance, "computeInstanceId": e.compute_instance}
            for e in events
            if e.bus == bus
        ]
        gpus[bus] = gpus[bus].model_copy(
            update={
                "xidEventsSupported": why is None,
                "xidEventsReason": why,
                "xidEvents": [SnapshotXidEvent.model_validate(x) for x in seen],
            }
        )
    return dataclasses.replace(readings, gpus=gpus, errors=dict(readings.errors))
