"""The plugin's checkpoint: what each prepared claim was given and what it created, so a
repeated prepare answers the same, unprepare removes exactly what was created (also after a
restart: kubelet may unprepare in a later plugin process, or a new pod), and prepare can refuse
a device another claim already holds.

Public surface: `Checkpoint(path, boot_id=...)` with `get(uid)`, `put(entry)`, `remove(uid)`,
`remove_if(entry)`, `entries()`, `exclusive()`, `dropped` (entries of another boot found at load);
`ClaimEntry` (namespace, name, uid, the CDI spec files written, the devices prepared);
`PreparedRecord` (one device of a prepared claim, as kubelet was told, plus whether it was
granted with admin access); `current_boot_id()`.

Every change rewrites the whole file atomically (temp + rename): a plugin crash leaves the old
or the new checkpoint, never a torn one. Nothing is fsynced: the entries only mean anything
within the boot that wrote them (a machine crash is a new boot, whose start-up drops them all),
and the syncs were the prepare path's largest and least predictable wait on a busy disk.

Two agent pods may share the file for a moment (a rolling update starts the new pod before the
old one exits, and kubelet may call either), so the file, not this object's memory, is the
state: every change takes an exclusive `flock` on `<checkpoint>.lock` and is applied to the
file's current content, and reads pick up a file another process rewrote. `exclusive()` holds
that lock across a driver's whole read-check-write (e.g. "is this device held by another
claim?" then "record it"). The lock is waited for at most `lock_timeout` (`LOCK_TIMEOUT`,
10 s, as NVIDIA's GPU driver), and inside a kubelet call never past `LOCK_MARGIN` before the
call's deadline (a call for several claims would otherwise wait 10 s for each and answer after
kubelet gave up): then `CheckpointLockTimeout`, a clear error for that one claim, never a hang
and never a late answer. A free lock is always taken, however little time is left.

A checkpoint that cannot be parsed, or of a version this plugin does not know, is a clear
error at start-up (`CheckpointError`), never silently treated as empty, since that would strand
the specs it names — except one of another boot (its boot id says so, or it was last written
before this boot began: what a machine crash may leave of an unsynced file, or what a newer
plugin wrote before a reboot into this one): its entries are of containers that are gone, so
it is set aside (renamed `<name>.unreadable`), logged, and the plugin starts empty. The
file records the boot it was written in: entries of another boot are dropped at load (the
containers that used them are gone, and /var/run/cdi with their specs), and listed in `dropped`
so the caller can remove the spec files they name. Version 1 files (no devices, no boot id) are
read as entries of this boot without recorded devices.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from .cdi import write_atomic
from .driver import current_call

log = structlog.get_logger("fabricdra.checkpoint")

VERSION = 2
READABLE = (1, 2)
# How long a change waits for `<checkpoint>.lock` (NVIDIA's GPU driver bounds its checkpoint
# flock at 10 s too): past it, a clear error for this claim instead of a kubelet call that
# hangs behind a stuck holder.
LOCK_TIMEOUT = 10.0
LOCK_MARGIN = 2.0  # seconds kept before kubelet's deadline to write and answer once locked
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
PROC_STAT = Path("/proc/stat")


class CheckpointError(Exception):
    """The checkpoint file exists but is not one this version can read."""


class CheckpointLockTimeout(CheckpointError):
    """`<checkpoint>.lock` stayed held (by another thread or process) for `lock_timeout`."""


def current_boot_id(path: Path = BOOT_ID_PATH) -> str | None:
    """The kernel's id of this boot; None where it cannot be read (never "a new boot")."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def current_boot_time(path: Path = PROC_STAT) -> float | None:
    """When this boot began (seconds since the epoch, the kernel's `btime`); None where it
    cannot be read."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    """One device of a prepared claim: kubelet's answer, and whether the request had admin
    access (such a grant holds nothing: it never makes another claim's prepare fail)."""

    device_name: str  # as allocated (a shared holder name stays a holder name)
    base_name: str  # the inventory device it resolved to
    cdi_device_ids: tuple[str, ...]
    request_names: tuple[str, ...]
    share_id: str | None
    admin_access: bool = False
    # The device the base device is part of (a MIG instance's GPU, a VF's PF): prepare's
    # in-use check must see the parent held too, also after the inventory changed.
    within: str | None = None
    # A share of a GPU offered shared: the capacities it consumes (memory in bytes, shares),
    # name-sorted, so prepare can check the sum of the shares beside it (gpusharing.py).
    consumed: tuple[tuple[str, int], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "device": self.device_name,
            "base": self.base_name,
            "cdiDeviceIds": list(self.cdi_device_ids),
            "requests": list(self.request_names),
        }
        if self.admin_access:
            out["adminAccess"] = True
        if self.share_id is not None:
            out["shareId"] = self.share_id
        if self.within is not None:
            out["within"] = self.within
        if self.consumed is not None:
            out["consumed"] = dict(self.consumed)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreparedRecord:
        return cls(
            device_name=str(d["device"]),
            base_name=str(d["base"]),
            cdi_device_ids=tuple(str(i) for i in d["cdiDeviceIds"]),
            request_names=tuple(str(r) for r in d.get("requests", ())),
            share_id=None if d.get("shareId") is None else str(d["shareId"]),
            admin_access=bool(d.get("adminAccess", False)),
            within=None if d.get("within") is None else str(d["within"]),
            consumed=None
            if d.get("consumed") is None
            else tuple(sorted((str(k), int(v)) for k, v in d["consumed"].items())),
        )


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    cdi_specs: tuple[str, ...]  # absolute paths of the spec files this claim wrote
    # What kubelet was told, in order; None for an entry of a version 1 checkpoint (its
    # devices were never recorded, so a repeated prepare resolves them afresh).
    devices: tuple[PreparedRecord, ...] | None = None
    consumers: tuple[str, ...] = ()  # uids of the pods the claim was reserved for

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "cdiSpecs": list(self.cdi_specs),
        }
        if self.devices is not None:
            out["devices"] = [d.to_dict() for d in self.devices]
        if self.consumers:
            out["consumers"] = list(self.consumers)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimEntry:
        devices = d.get("devices")
        return cls(
            uid=str(d["uid"]),
            namespace=str(d["namespace"]),
            name=str(d["name"]),
            cdi_specs=tuple(str(p) for p in d.get("cdiSpecs", ())),
            devices=None
            if devices is None
            else tuple(PreparedRecord.from_dict(x) for x in devices),
            consumers=tuple(str(c) for c in d.get("consumers", ())),
        )


class Checkpoint:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        boot_id: str | None = None,
        boot_time: float | None = None,
        lock_timeout: float = LOCK_TIMEOUT,
        lock_margin: float = LOCK_MARGIN,
    ) -> None:
        """`boot_time` None: read from /proc/stat."""
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self.lock_margin = lock_margin
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.boot_id = boot_id
        self.boot_time = boot_time if boot_time is not None else current_boot_time()
        # Re-entrant: a driver holds exclusive() around put/remove, which take it as well.
        self._lock = threading.RLock()
        self._flock_depth = 0
        self._flock_fd: int | None = None
        self.dropped: list[ClaimEntry] = []
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) last read
        self._claims: dict[str, ClaimEntry] = {}
        with self.exclusive():
            pass  # the first load (and its boot check) under the lock

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the checkpoint against every other thread and process (flock on the lock
        file) with this object's view refreshed from the file. Waits at most `lock_timeout`
        seconds for it, and never past `lock_margin` seconds before the current kubelet call's
        deadline, then raises `CheckpointLockTimeout`."""
        wait = max(0.0, min(self.lock_timeout, current_call().remaining() - self.lock_margin))
        deadline = time.monotonic() + wait
        if not self._lock.acquire(timeout=wait):  # 0: one try
            raise self._timeout("another thread of this plugin", wait)
        try:
            if self._flock_depth == 0:
                self._flock_fd = self._flock(deadline, wait)
            self._flock_depth += 1
            try:
                self._refresh()
                yield
            finally:
                self._flock_depth -= 1
                if self._flock_depth == 0 and self._flock_fd is not None:
                    os.close(self._flock_fd)  # closing the descriptor releases the flock
                    self._flock_fd = None
        finally:
            self._lock.release()

    def _flock(self, deadline: float, wait: float) -> int:
        """The lock file, flocked: polled without blocking until `deadline` (at least once),
        so the wait is bounded (flock itself has no timeout)."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        pause = 0.001
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout("another process (an agent pod of a rolling update?)", wait)
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.01)
        except BaseException:
            os.close(fd)
            raise

    def _timeout(self, holder: str, wait: float) -> CheckpointLockTimeout:
        why = "" if wait >= self.lock_timeout else " (all the time left before kubelet's deadline)"
        return CheckpointLockTimeout(
            f"checkpoint lock {self.lock_path} held by {holder} for more than "
            f"{wait:.3g} s{why}; nothing was changed"
        )

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        """Read the file again when another process replaced it since we last looked (each
        write is a rename, so a new inode; a cheap stat otherwise)."""
        seen = self._stat()
        if seen is not None and seen == self._seen:
            return
        self._claims = self._load()
        self._seen = seen

    def _load(self) -> dict[str, ClaimEntry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            version = doc.get("version")
            written_in = doc.get("bootId")
            if version not in READABLE:
                problem = f"version {version!r}, expected one of {', '.join(map(str, READABLE))}"
                if self._of_another_boot(written_in):
                    return self._set_aside(problem)
                raise CheckpointError(f"checkpoint {self.path}: {problem}")
            entries = [ClaimEntry.from_dict(c) for c in doc["claims"]]
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if self._of_another_boot(None):
                return self._set_aside(f"cannot be read: {e}")
            raise CheckpointError(f"checkpoint {self.path} cannot be read: {e}") from e
        # Only a known, different boot drops entries: an unreadable id is not a reboot.
        if written_in and self.boot_id and written_in != self.boot_id:
            self.dropped = entries
            return {}
        return {e.uid: e for e in entries}

    def _of_another_boot(self, written_in: Any) -> bool:
        """The file says (boot id) or shows (last written before this boot began) that it is
        of another boot: its entries are of containers that are gone."""
        if isinstance(written_in, str) and written_in and self.boot_id:
            return written_in != self.boot_id
        return self._written_before_boot()

    def _set_aside(self, problem: str) -> dict[str, ClaimEntry]:
        """A checkpoint of another boot this version cannot use (torn by a crash before it
        reached the disk; written by another version of the plugin): renamed
        `<name>.unreadable` for a person to read, logged, and the plugin starts empty. Its
        spec files are not removed: paths in a file we cannot read are not trusted."""
        aside = self.path.with_name(self.path.name + ".unreadable")
        os.replace(self.path, aside)
        log.error(
            "checkpoint of another boot cannot be used; set aside, starting empty",
            path=str(self.path),
            kept=str(aside),
            problem=problem,
        )
        return {}

    def _written_before_boot(self) -> bool:
        try:
            written = self.path.stat().st_mtime
        except OSError:
            return False
        return self.boot_time is not None and written < self.boot_time

    def get(self, uid: str) -> ClaimEntry | None:
        with self._lock:
            self._refresh()
            return self._claims.get(uid)

    def entries(self) -> list[ClaimEntry]:
        with self._lock:
            self._refresh()
            return sorted(self._claims.values(), key=lambda e: e.uid)

    def put(self, entry: ClaimEntry) -> None:
        with self.exclusive():
            if self._claims.get(entry.uid) == entry:
                return
            claims = {**self._claims, entry.uid: entry}
            self._save(claims)
            self._claims = claims

    def remove(self, uid: str) -> bool:
        with self.exclusive():
            if uid not in self._claims:
                return False
            claims = {k: v for k, v in self._claims.items() if k != uid}
            self._save(claims)
            self._claims = claims
            return True

    def remove_if(self, entry: ClaimEntry) -> bool:
        """Remove the claim's entry only while it is still exactly `entry` (a sweep must not
        drop what a prepare recorded after the sweep looked)."""
        with self.exclusive():
            if self._claims.get(entry.uid) != entry:
                return False
            claims = {k: v for k, v in self._claims.items() if k != entry.uid}
            self._save(claims)
            self._claims = claims
            return True

    def _save(self, claims: dict[str, ClaimEntry]) -> None:
        doc: dict[str, Any] = {
            "version": VERSION,
            "claims": [claims[k].to_dict() for k in sorted(claims)],
        }
        if self.boot_id:
            doc["bootId"] = self.boot_id
        # Compact: the whole file is rewritten on every change, and json's C encoder only
        # runs without indent (with it, 200 claims cost tens of ms per prepare).
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        write_atomic(self.path, data, 0o600, durable=False)
        self._seen = self._stat()
