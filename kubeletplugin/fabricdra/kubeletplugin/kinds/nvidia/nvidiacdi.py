"""The NVIDIA container toolkit's CDI spec, where the host has one (`nvidia-ctk cdi generate`,
kind `nvidia.com/gpu`): the ids prepare returns for granted GPUs and MIG instances, so the
runtime mounts the driver libraries the supported way.

A toolkit device is matched to a GPU by UUID (its name, with the `uuid` naming strategy) or
else by the device nodes it injects, which holds whatever naming strategy generated it: a
whole GPU's device holds exactly its `/dev/nvidiaN` and no capability node; a MIG instance's
device holds exactly its parent's `/dev/nvidiaN` and exactly the instance's
`/dev/nvidia-caps/nvidia-capN` pair. A device with any other GPU or capability node (the
toolkit's `all`, which sorts first under the `type-index` strategy) is never a match: it would
hand the container GPUs or instances nobody was granted. The toolkit's `all` device is never
used, even where its nodes equal one device's (a node with one GPU, or one MIG instance), and a
device found by UUID is used only when its device nodes are exactly the grant's.

The cache is kept per file: a file is re-read only when its stat changes, and a changed file
that is not the toolkit's (no `nvidia.com/gpu` in it: another driver's spec, rewritten on every
prepare of its own) is recognised from its bytes without being parsed. The merged device table
is rebuilt only when a toolkit file itself changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

log = structlog.get_logger("fabricdra.nvidiacdi")

TOOLKIT_KIND = "nvidia.com/gpu"
DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


ALL = "all"  # the toolkit's device with every GPU: never one grant's
_GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")
_CAP_NODE = re.compile(r"/dev/nvidia-caps/nvidia-cap[0-9]+")


@dataclass(frozen=True, slots=True)
class ToolkitDevice:
    name: str
    node_paths: frozenset[str]  # container paths of its device nodes

    @property
    def gpu_nodes(self) -> frozenset[str]:
        return frozenset(p for p in self.node_paths if _GPU_NODE.fullmatch(p))

    @property
    def cap_nodes(self) -> frozenset[str]:
        return frozenset(p for p in self.node_paths if _CAP_NODE.fullmatch(p))

    @property
    def cdi_id(self) -> str:
        return f"{TOOLKIT_KIND}={self.name}"


# libyaml's loader where PyYAML has it: a toolkit spec with its mounts is tens of kilobytes.
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_Stamp = tuple[int, int, int, int]  # mtime_ns, ctime_ns, size, inode


class ToolkitSpecs:
    def __init__(self, spec_dirs: Sequence[Path] = DEFAULT_SPEC_DIRS) -> None:
        self.spec_dirs = tuple(spec_dirs)
        # path -> (stat stamp, its toolkit devices; None: not a toolkit spec)
        self._files: dict[str, tuple[_Stamp, dict[str, ToolkitDevice] | None]] = {}
        self._key: tuple[tuple[str, _Stamp], ...] | None = None
        self._devices: dict[str, ToolkitDevice] = {}
        self._pinned: dict[str, ToolkitDevice] | None = None

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Within the block, every lookup uses one look at the folders (a prepare of 8 GPUs
        looks up 8 times; the folder may hold dozens of other drivers' specs)."""
        self._pinned = self.devices()
        try:
            yield
        finally:
            self._pinned = None

    def devices(self) -> dict[str, ToolkitDevice]:
        if self._pinned is not None:
            return self._pinned
        seen: dict[str, tuple[_Stamp, dict[str, ToolkitDevice] | None]] = {}
        toolkit: list[tuple[str, _Stamp]] = []
        for path, st in self._scan():
            stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
            cached = self._files.get(path)
            if cached is None or cached[0] != stamp:
                cached = (stamp, _load(Path(path)))
            seen[path] = cached
            if cached[1] is not None:
                toolkit.append((path, stamp))
        self._files = seen  # files gone from the folders leave the cache
        key = tuple(toolkit)
        if key != self._key:
            merged: dict[str, ToolkitDevice] = {}
            for path, _ in toolkit:  # later folders win, as in the CDI library
                merged.update(seen[path][1] or {})
            self._devices, self._key = merged, key
        return self._devices

    def _scan(self) -> Iterable[tuple[str, os.stat_result]]:
        for d in self.spec_dirs:
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                # Our own per-claim specs share the folder: skipping them keeps the cache
                # valid across prepares (each writes one) and the toolkit lookup cheap.
                if "fabricdra.io" in e.name:
                    continue
                if e.name.endswith((".json", ".yaml")):
                    try:
                        if e.is_file():
                            yield e.path, e.stat()
                    except OSError:  # removed between the listing and the stat
                        continue

    def gpu_id(self, uuid: str | None, minor: int | None) -> str | None:
        """The toolkit id of one whole GPU: a device holding exactly its node
        `/dev/nvidia<minor>` and no capability node, by UUID first, else by that node."""
        if minor is None:
            return None  # nothing to check a device against
        node = f"/dev/nvidia{minor}"

        def exact(d: ToolkitDevice) -> bool:
            return d.name != ALL and d.gpu_nodes == {node} and not d.cap_nodes

        return self._find(uuid, exact)

    def mig_id(
        self, uuid: str | None, minor: int | None = None, cap_paths: Sequence[str] = ()
    ) -> str | None:
        """The toolkit id of one MIG instance: a device holding exactly the parent GPU's node
        `/dev/nvidia<minor>` and exactly the instance's capability pair, by UUID first, else
        by those nodes. Without the nodes to check against: None."""
        if minor is None or not cap_paths:
            return None
        node, caps = f"/dev/nvidia{minor}", frozenset(cap_paths)

        def exact(d: ToolkitDevice) -> bool:
            return d.name != ALL and d.gpu_nodes == {node} and d.cap_nodes == caps

        return self._find(uuid, exact)

    def _find(self, uuid: str | None, exact: Callable[[ToolkitDevice], bool]) -> str | None:
        devices = self.devices()
        if uuid and uuid in devices:
            if exact(devices[uuid]):
                return devices[uuid].cdi_id
            log.warning(
                "toolkit CDI device named by the UUID holds other device nodes: not used",
                uuid=uuid,
                nodes=sorted(devices[uuid].node_paths),
            )
            return None
        for d in sorted(devices.values(), key=lambda d: d.name):
            if exact(d):
                return d.cdi_id
        return None


def _load(path: Path) -> dict[str, ToolkitDevice] | None:
    """The toolkit devices of one spec file; None when it is not a toolkit spec."""
    try:
        data = path.read_bytes()
    except OSError as e:
        log.warning("cannot read CDI spec", path=str(path), error=str(e))
        return None
    if TOOLKIT_KIND.encode() not in data:  # another driver's spec: not worth parsing
        return None
    try:
        doc: Any = json.loads(data) if path.suffix == ".json" else yaml.load(data, _YAML_LOADER)
    except (ValueError, yaml.YAMLError) as e:
        log.warning("cannot read CDI spec", path=str(path), error=str(e))
        return None
    if not isinstance(doc, dict) or doc.get("kind") != TOOLKIT_KIND:
        return None
    out: dict[str, ToolkitDevice] = {}
    for dev in doc.get("devices") or []:
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            continue
        nodes = (dev.get("containerEdits") or {}).get("deviceNodes") or []
        paths = frozenset(n["path"] for n in nodes if isinstance(n, dict) and "path" in n)
        out[dev["name"]] = ToolkitDevice(dev["name"], paths)
    return out
