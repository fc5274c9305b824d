"""The safety rules of a prepare, shared by every driver (docs/kubelet-plugin.md, "Deadlines").

Upstream's helper (k8s.io/dynamic-resource-allocation/kubeletplugin) reads a call's claims
before it takes its lock and hands the driver only device work; these are the same rules for
a driver of `PluginServer`:

- API reads happen before any lock, one attempt each, and each ends within `api_timeout()`:
  at most `READ_BUDGET` seconds, and at least `DEADLINE_MARGIN` before kubelet's deadline
  (`read_claim` reads and checks the claim itself).
- a wait (`wait_until`) is bounded the same way and ends as soon as kubelet has gone;
- `ensure_wanted()` right before writing: a call kubelet gave up on writes nothing.
- spec files named by a checkpoint entry are removed only inside the driver's own CDI folder
  (`remove_recorded_specs`): a stale or foreign checkpoint never deletes anything else.
- `find_stale` / `ClaimSweeper`: checkpointed claims gone from the API are *reported*, never
  freed. Only kubelet's NodeUnprepareResources frees a device: a claim can be gone from the
  API while a container still uses its devices (a force-deleted pod runs until kubelet kills
  it, then kubelet unprepares), and freeing then handed a NIC to a second claim.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from fabricdra.kube.rest import CLAIMS, ApiError, NotFound, Rest

from .cdi import CdiWriter
from .checkpoint import Checkpoint, ClaimEntry
from .driver import ClaimRef, PreparedDevice, PrepareError, current_call

log = structlog.get_logger("fabricdra.kubelet")

READ_BUDGET = 10.0  # seconds one API read of a prepare may take
DEADLINE_MARGIN = 5.0  # seconds kept before kubelet's deadline to write and answer
POLL_SECONDS = 1.0  # between two looks of a `wait_until`


class ClaimReader(Protocol):
    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        """The ResourceClaim as JSON (`resource.k8s.io/v1`), in one attempt within `timeout`
        seconds; raise when it cannot be read (`ApiError` with status 404: it does not
        exist)."""
        ...


class RestClaimReader:
    """Claims read through `Rest` (one attempt per call)."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        return self.rest.call("GET", CLAIMS.path(namespace, name), timeout=timeout)


def ensure_wanted() -> None:
    """Raise when kubelet has cancelled the current call or given up on it."""
    if not current_call().active():
        raise PrepareError("kubelet gave up on this call; nothing was prepared")


def api_timeout(budget: float = READ_BUDGET) -> float:
    """Seconds the next API call of the current kubelet call may take: at most `budget`,
    ending `DEADLINE_MARGIN` before kubelet's deadline. Raises when kubelet has gone or too
    little time is left."""
    ensure_wanted()
    timeout = min(budget, current_call().remaining() - DEADLINE_MARGIN)
    if timeout <= 0:
        raise PrepareError("too little time left before kubelet's deadline to read the API")
    return timeout


def read_claim(reader: ClaimReader, claim: ClaimRef) -> dict[str, Any]:
    """The claim kubelet named (same UID), read in one attempt within `api_timeout()`.
    Call it before taking any lock."""
    try:
        obj = reader.read_claim(claim.namespace, claim.name, api_timeout())
    except NotFound:
        raise PrepareError(f"ResourceClaim {claim.namespace}/{claim.name} not found") from None
    except ApiError as e:
        raise PrepareError(f"cannot read the ResourceClaim: {e}") from None
    uid = (obj.get("metadata") or {}).get("uid")
    if uid != claim.uid:
        raise PrepareError(
            f"ResourceClaim {claim.namespace}/{claim.name} has uid {uid}, "
            f"not {claim.uid}: it was deleted and recreated"
        )
    return obj


def wait_until(
    check: Callable[[], tuple[bool, str]], seconds: float, *, poll: float = POLL_SECONDS
) -> None:
    """Call `check` every `poll` seconds until it answers (True, _), at most `seconds` and
    never past `DEADLINE_MARGIN` before kubelet's deadline; stop at once when kubelet has
    gone. Raises
    `PrepareError` with check's last message when time runs out."""
    call = current_call()
    limit = max(0.0, min(seconds, call.remaining() - DEADLINE_MARGIN))
    deadline = time.monotonic() + limit
    while True:
        ensure_wanted()
        ready, message = check()
        if ready:
            return
        # No look starts within a poll of the end: it would find too little time to read.
        if time.monotonic() + poll >= deadline:
            raise PrepareError(f"{message} (waited {limit:.0f}s; kubelet retries)")
        time.sleep(poll)


def recorded_answer(checkpoint: Checkpoint, uid: str, pool: str) -> list[PreparedDevice] | None:
    """What kubelet was told for claim `uid` by an earlier prepare (the checkpoint), while
    every spec file it wrote is still there; None: prepare it (again). A repeated prepare
    answers this without reading the API or waiting for anything."""
    entry = checkpoint.get(uid)
    if entry is None or entry.devices is None:
        return None
    if not all(Path(p).exists() for p in entry.cdi_specs):
        return None
    return [
        PreparedDevice(
            pool_name=pool,
            device_name=r.device_name,
            cdi_device_ids=r.cdi_device_ids,
            request_names=r.request_names,
            share_id=r.share_id,
        )
        for r in entry.devices
    ]


def remove_recorded_specs(entry: ClaimEntry, cdi: CdiWriter) -> None:
    """Delete the spec files `entry` names — only files directly in `cdi`'s folder with the
    writer's own name pattern; anything else (a path a stale or foreign checkpoint names
    outside the folder, `..` tricks, a symlink) is left alone and logged."""
    folder = os.path.realpath(cdi.dir)
    prefix = f"{cdi.kind.replace('/', '-')}_"
    for spec in entry.cdi_specs:
        path = Path(spec)
        if (
            path.is_absolute()
            and os.path.realpath(path.parent) == folder
            and path.name.startswith(prefix)
            and path.name.endswith(".json")
        ):
            if path.is_symlink():
                log.warning("not removing a symlink named as a spec", path=spec)
                continue
            path.unlink(missing_ok=True)
        else:
            log.warning(
                "checkpoint names a spec outside this driver's CDI folder; left alone",
                path=spec,
                cdi_dir=str(cdi.dir),
                claim=entry.uid,
            )


def drop_other_boots(checkpoint: Checkpoint, cdi: CdiWriter) -> None:
    """At start-up: the spec files of entries of another boot go (their containers are gone;
    /var/run/cdi is emptied on boot, but the folder is configurable)."""
    for entry in checkpoint.dropped:
        remove_recorded_specs(entry, cdi)
    if checkpoint.dropped:
        log.info("dropped the checkpoint entries of another boot", claims=len(checkpoint.dropped))


def is_gone(reader: ClaimReader, entry: ClaimEntry, timeout: float = READ_BUDGET) -> bool:
    """Whether `entry`'s claim is gone from the API: not found, or recreated under another
    UID. An API error other than 404 is not "gone" (a transient error must not count as a
    delete); a read that cannot reach the server raises."""
    try:
        obj = reader.read_claim(entry.namespace, entry.name, timeout)
    except NotFound:
        return True
    except ApiError:
        return False
    return (obj.get("metadata") or {}).get("uid") != entry.uid


def find_stale(checkpoint: Checkpoint, reader: ClaimReader) -> list[ClaimEntry]:
    """Checkpointed claims gone from the API (`is_gone`). Nothing is changed: see the module
    docstring."""
    return [entry for entry in checkpoint.entries() if is_gone(reader, entry)]


class ClaimSweeper:
    """Runs `find_stale` every `interval` seconds on its own thread (a hung API read never
    holds up the caller's loop) and logs each stale claim once."""

    def __init__(
        self, checkpoint: Checkpoint, reader: ClaimReader, interval: float, driver: str
    ) -> None:
        self.checkpoint = checkpoint
        self.reader = reader
        self.interval = interval
        self.driver = driver
        self.stale: list[ClaimEntry] = []  # what the last sweep found
        self.sweeps = 0  # sweeps finished
        self._reported: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claim-sweep", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the loop; a read in progress ends within its own timeout (the thread is a
        daemon: a process exit never waits for it)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception:
                log.exception("claim sweep failed", driver=self.driver)

    def sweep(self) -> list[ClaimEntry]:
        stale = find_stale(self.checkpoint, self.reader)
        for entry in stale:
            if entry.uid not in self._reported:
                log.warning(
                    "claim gone from the API is still prepared here; its devices stay held "
                    "until kubelet unprepares it",
                    driver=self.driver,
                    claim=f"{entry.namespace}/{entry.name}",
                    uid=entry.uid,
                )
        self._reported = {e.uid for e in stale}
        self.stale = stale
        self.sweeps += 1
        return stale
