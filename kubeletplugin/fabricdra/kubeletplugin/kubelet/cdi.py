"""CDI (Container Device Interface) specs: a small typed model, the lowest `cdiVersion` a spec
needs, and atomic per-claim spec files.

Public surface:
- `DeviceNode`, `Mount`, `ContainerEdits`, `CdiDevice`, `CdiSpec` — frozen dataclasses for the
  subset of the CDI spec fabricdra writes; `CdiSpec.to_dict()` is the JSON document, with
  `cdiVersion` = `CdiSpec.min_version()`.
- `CdiWriter(cdi_dir, kind)`: `write(claim_uid, spec)` (temp file + rename, so a runtime
  never reads half a spec), `remove(claim_uid)`, `path_for(claim_uid)`, `device_id(name)`.
- `validate_kind`, `validate_device_name`: the CDI parser's naming rules; `CdiError` on
  violation.

Why the lowest version: a loader rejects a spec whose `cdiVersion` it does not know, and old
container runtimes vendor old CDI libraries (one that knows only up to 0.5.0 rejects "1.0.0").
Declaring what the content needs, and no more, keeps every runtime that can use it able to.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Versions in order; each entry says what first requires it (specs-go/version.go).
V030, V040, V050, V060 = "0.3.0", "0.4.0", "0.5.0", "0.6.0"
_ORDER = (V030, V040, V050, V060)

_VENDOR_CLASS = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class CdiError(ValueError):
    """A spec that no CDI loader would accept; the message names the offending value."""


def validate_kind(kind: str) -> None:
    vendor, sep, cls = kind.partition("/")
    if not sep or not _VENDOR_CLASS.match(vendor) or not _VENDOR_CLASS.match(cls):
        raise CdiError(
            f"CDI kind {kind!r} is not <vendor>/<class> (letters, digits, '_', '-', '.'; "
            "each starting with a letter and ending with a letter or digit)"
        )
    if len(vendor) > 253 or len(cls) > 63:
        raise CdiError(f"CDI kind {kind!r}: vendor over 253 or class over 63 characters")


def validate_device_name(name: str) -> None:
    if not _DEVICE_NAME.match(name):
        raise CdiError(
            f"CDI device name {name!r}: only letters, digits, '_', '-', '.', ':', "
            "starting and ending with a letter or digit"
        )


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str  # in the container
    host_path: str | None = None  # when it differs from `path` (needs 0.5.0)
    type: str | None = "c"
    major: int | None = None
    minor: int | None = None
    permissions: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path is not None and self.host_path != self.path:
            out["hostPath"] = self.host_path
        if self.type is not None:
            out["type"] = self.type
        if self.major is not None:
            out["major"] = self.major
        if self.minor is not None:
            out["minor"] = self.minor
        if self.permissions is not None:
            out["permissions"] = self.permissions
        return out


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None  # needs 0.4.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        if self.type is not None:
            out["type"] = self.type
        return out


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    env: tuple[str, ...] = ()  # "KEY=value"
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def __post_init__(self) -> None:
        for e in self.env:
            if e.find("=") < 1:
                raise CdiError(f"CDI env entry {e!r} is not KEY=value")

    def empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts)

    def min_version(self) -> str:
        needed = V030
        if any(m.type is not None for m in self.mounts):
            needed = V040
        if any(d.host_path is not None and d.host_path != d.path for d in self.device_nodes):
            needed = V050
        return needed

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [d.to_dict() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_dict() for m in self.mounts]
        return out


@dataclass(frozen=True, slots=True)
class CdiDevice:
    name: str
    edits: ContainerEdits
    annotations: Mapping[str, str] = field(default_factory=dict)

    def min_version(self) -> str:
        needed = self.edits.min_version()
        if self.name[:1].isdigit():
            needed = max(needed, V050, key=_ORDER.index)
        if self.annotations:
            needed = V060
        return needed


@dataclass(frozen=True, slots=True)
class CdiSpec:
    kind: str
    devices: tuple[CdiDevice, ...]
    edits: ContainerEdits = ContainerEdits()
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_kind(self.kind)
        if not self.devices:
            raise CdiError(f"CDI spec {self.kind}: a spec needs at least one device")
        seen: set[str] = set()
        for d in self.devices:
            validate_device_name(d.name)
            if d.name in seen:
                raise CdiError(f"CDI spec {self.kind}: device name {d.name!r} used twice")
            if d.edits.empty():
                raise CdiError(f"CDI device {d.name!r} has no container edits")
            seen.add(d.name)

    def min_version(self) -> str:
        versions = [self.edits.min_version(), *(d.min_version() for d in self.devices)]
        if self.annotations or "." in self.kind.partition("/")[2]:
            versions.append(V060)
        return max(versions, key=_ORDER.index)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cdiVersion": self.min_version(), "kind": self.kind}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        devices = []
        for d in self.devices:
            dev: dict[str, Any] = {"name": d.name}
            if d.annotations:
                dev["annotations"] = dict(d.annotations)
            dev["containerEdits"] = d.edits.to_dict()
            devices.append(dev)
        out["devices"] = devices
        if not self.edits.empty():
            out["containerEdits"] = self.edits.to_dict()
        return out

    def device_id(self, name: str) -> str:
        return f"{self.kind}={name}"


class CdiWriter:
    """One spec file per claim in a CDI spec folder, written atomically.

    The file name follows the CDI library's transient-spec convention,
    `<vendor>-<class>_<claimUID>.json`: unique per claim, and a `.json` so runtimes load it.
    """

    def __init__(self, cdi_dir: str | os.PathLike[str], kind: str) -> None:
        validate_kind(kind)
        self.dir = Path(cdi_dir)
        self.kind = kind

    def path_for(self, claim_uid: str) -> Path:
        if not claim_uid or "/" in claim_uid or claim_uid.startswith("."):
            raise CdiError(f"claim uid {claim_uid!r} cannot name a CDI spec file")
        return self.dir / f"{self.kind.replace('/', '-')}_{claim_uid}.json"

    def device_id(self, name: str) -> str:
        return f"{self.kind}={name}"

    def write(self, claim_uid: str, spec: CdiSpec) -> Path:
        if spec.kind != self.kind:
            raise CdiError(f"spec kind {spec.kind} is not this writer's {self.kind}")
        path = self.path_for(claim_uid)
        # Compact: json's C encoder only runs without indent (indenting a 16-device spec in
        # pure Python took a third of a prepare); `jq .` shows it indented.
        data = json.dumps(spec.to_dict(), separators=(",", ":"), sort_keys=True).encode() + b"\n"
        # No fsync: the spec folder is /var/run/cdi (tmpfs, emptied on boot), and after a
        # machine crash no container that used the spec survives either; atomicity is what
        # a runtime reading the folder needs.
        write_atomic(path, data, durable=False)
        return path

    def remove(self, claim_uid: str) -> bool:
        """Delete the claim's spec; False when there was none."""
        try:
            self.path_for(claim_uid).unlink()
        except FileNotFoundError:
            return False
        return True


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a part:
    a hidden temp file in the same folder (same filesystem; runtimes skip non-.json names),
    then rename. `durable` adds fsync of the file and the folder, for state that must survive
    a machine crash; a plugin crash never loses written data either way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
