"""Xid critical errors from NVML events, kept per GPU for the health decision.

    watch = XidWatch(LiveXidEvents(), state_file=state_dir / "xid-errors.json", boot_id=...)
    readings = watch.apply(readings)   # each discovery pass, before `health.gpu_health`
    if watch.poll(): ...               # between passes: a new critical Xid wants a pass now
    watch.close()                      # when the agent stops

Each pass registers the GPUs the readings name that are not registered yet, drains the event
set without blocking, and returns the readings with, per GPU:
- `xidErrors`: every critical Xid seen since boot, merged with a snapshot's own;
- `applicationXids`: the application Xids seen since boot (13, 31, 43, 45, 68, 109, as
  `health.APPLICATION_XIDS` says): never a fault, published as an informative taint;
- `xidEventsSupported` False and `xidEventsReason` where the GPU refused the registration, or
  where the event set cannot be created or read this pass: health then says Unknown, not
  Healthy, since an Xid could go unseen.
An event NVML cannot attribute to a GPU counts for every registered GPU (NVIDIA's device
plugin does the same: the Xid happened, and no GPU can be cleared of it).

Xids are one-shot events that NVML never repeats, so the critical ones seen are written to
`state_file` with the boot id: a restarted plugin keeps a GPU tainted (and the taint's time,
which the publisher keeps from the live slice), while a reboot — which resets the GPUs —
starts clean. Deleting the file and restarting the plugin clears it after a GPU reset without
reboot (docs/kubelet-plugin.md#health).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from ...discovery.nvml import NvmlReadings, XidEvent, XidEventsError, XidEventSource
from ...health import APPLICATION_XIDS

log = structlog.get_logger("fabricdra.xids")

STATE_VERSION = 1


@dataclass
class _Seen:
    xids: set[int] = field(default_factory=set)
    first_seen: str | None = None
    app: set[int] = field(default_factory=set)  # application Xids: informative only


class XidWatch:
    def __init__(
        self,
        source: XidEventSource | None,
        *,
        state_file: Path | None = None,
        boot_id: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.source = source
        self.state_file = state_file
        self.boot_id = boot_id
        self.clock = clock
        self.registered: dict[str, str | None] = {}  # bus -> None (registered) or why not
        self.seen: dict[str, _Seen] = {}
        # What the last pass could not read (None: it read): warned of when it starts or its
        # cause changes, not on every pass while it lasts (a driver without event support
        # fails every 2 s pass; health says Unknown on each, the log once).
        self.unreadable: str | None = None
        self._load()

    # -- one pass ------------------------------------------------------------------------

    def apply(self, readings: NvmlReadings | None) -> NvmlReadings | None:
        if readings is None or not readings.available or self.source is None:
            return readings
        try:
            missing = [bus for bus in readings.gpus if bus not in self.registered]
            if missing:
                for bus, why in self.source.register(missing).items():
                    self.registered[bus] = why
                    if why is not None:
                        log.warning("GPU cannot report Xid events", pciBusId=bus, reason=why)
            self._take(self.source.drain())
        except XidEventsError as e:
            if str(e) != self.unreadable:
                log.warning("Xid events unreadable", error=str(e))
            self.unreadable = str(e)
            return self._merge(readings, f"Xid events unreadable: {e}")
        if self.unreadable is not None:
            log.info("Xid events readable again")
            self.unreadable = None
        return self._merge(readings, None)

    def poll(self) -> bool:
        """Between passes: drain the set; True when a new critical Xid was recorded (the
        caller then runs a pass at once, so the taint does not wait for the next one). Only
        once the first pass registered GPUs; a failure is left to the next pass to report."""
        if self.source is None or not self.registered:
            return False
        try:
            return self._take(self.source.drain())
        except XidEventsError as e:
            log.info("Xid events unreadable between passes", error=str(e))
            return False

    def _take(self, events: list[XidEvent]) -> bool:
        changed = False
        for e in events:
            targets = (
                [e.bus]
                if e.bus is not None
                else [b for b, why in self.registered.items() if why is None]
            )
            if e.xid in APPLICATION_XIDS:
                # Not the GPU's fault; kept for the informative taint (effect None).
                log.info("application Xid (not a GPU fault)", pciBusId=e.bus, xid=e.xid)
                for bus in targets:
                    seen = self.seen.setdefault(bus, _Seen())
                    if e.xid not in seen.app:
                        seen.app.add(e.xid)
                        changed = True
                continue
            log.error(
                "critical Xid error",
                pciBusId=e.bus or "unknown (counted for every GPU)",
                xid=e.xid,
                gpuInstanceId=e.gpu_instance,
                computeInstanceId=e.compute_instance,
            )
            for bus in targets:
                seen = self.seen.setdefault(bus, _Seen())
                if e.xid not in seen.xids:
                    seen.xids.add(e.xid)
                    seen.first_seen = seen.first_seen or _stamp(self.clock())
                    changed = True
        if changed:
            self._save()
        return changed

    def _merge(self, readings: NvmlReadings, broken: str | None) -> NvmlReadings:
        gpus = dict(readings.gpus)
        for bus, gpu in readings.gpus.items():
            update: dict[str, Any] = {}
            seen = self.seen.get(bus)
            why = broken or self.registered.get(bus)
            if seen is not None or bus in self.registered:
                update["xidErrors"] = sorted(
                    set(gpu.xidErrors or ()) | (seen.xids if seen else set())
                )
            if seen is not None and seen.app:
                update["applicationXids"] = sorted(set(gpu.applicationXids or ()) | seen.app)
            if why is not None:
                update["xidEventsSupported"] = False
                update["xidEventsReason"] = why
            elif bus in self.registered:
                update["xidEventsSupported"] = True
            if update:
                gpus[bus] = gpu.model_copy(update=update)
        return dataclasses.replace(readings, gpus=gpus, errors=dict(readings.errors))

    def close(self) -> None:
        if self.source is not None:
            self.source.close()

    # -- what survives a restart ---------------------------------------------------------

    def _load(self) -> None:
        if self.state_file is None:
            return
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            self._set_aside(f"unreadable: {e}")
            return
        if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), dict):
            self._set_aside("not an object with a `gpus` object")
            return
        recorded_boot = raw.get("bootId")
        if self.boot_id and recorded_boot and recorded_boot != self.boot_id:
            log.info("Xid record of another boot dropped (the GPUs were reset)")
            return
        for bus, entry in raw["gpus"].items():
            try:
                xids = {int(x) for x in entry["xids"]}
                app = {int(x) for x in entry.get("appXids", ())}
            except (KeyError, TypeError, ValueError):
                log.error("Xid record entry unreadable; skipped", pciBusId=bus, entry=entry)
                continue
            self.seen[bus] = _Seen(xids, entry.get("firstSeen"), app)
        if any(s.xids for s in self.seen.values()):
            log.warning(
                "critical Xids recorded earlier in this boot",
                gpus={b: sorted(s.xids) for b, s in self.seen.items() if s.xids},
            )

    def _set_aside(self, why: str) -> None:
        """Keep a record we cannot read for a person to look at, instead of overwriting it."""
        assert self.state_file is not None
        aside = self.state_file.with_name(self.state_file.name + ".unreadable")
        with contextlib.suppress(OSError):
            os.replace(self.state_file, aside)
        log.error(
            "Xid record set aside; starting empty",
            path=str(self.state_file),
            kept=str(aside),
            error=why,
        )

    def _save(self) -> None:
        if self.state_file is None:
            return
        body = {
            "version": STATE_VERSION,
            "bootId": self.boot_id,
            "gpus": {
                bus: {"xids": sorted(s.xids), "firstSeen": s.first_seen}
                | ({"appXids": sorted(s.app)} if s.app else {})
                for bus, s in sorted(self.seen.items())
            },
        }
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(body, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_file)
        except OSError as e:  # the GPU is still tainted now; only a restart would forget
            log.error("Xid record not written", path=str(self.state_file), error=str(e))
            with contextlib.suppress(OSError):
                tmp.unlink()


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
