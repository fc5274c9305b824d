"""Safe, bounded reads from a sysfs tree.

Every path is relative to a root (normally /sys). A sysfs path is a chain of symlinks, so each
access resolves the chain and refuses a result that lands outside the root: a fixture tree, a
container's view or a hostile mount can hold links anywhere. One attribute read is capped at
64 KiB. A reading is one of three things, and the rules downstream treat them differently:
the text, `Absent` (the kernel does not offer this file), or `Unreadable` (it exists, or might,
but could not be read — an inability to ask, which must never be read as an answer of no).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .beneath import Beneath

_T = TypeVar("_T")

READ_CAP = 64 * 1024
_READ_ASK = READ_CAP + 1  # one more than the cap tells "too large" apart
_MAX_LINK_HOPS = 40


@dataclass(frozen=True, slots=True)
class Absent:
    path: str

    def __str__(self) -> str:
        return f"{self.path}: absent"


@dataclass(frozen=True, slots=True)
class Unreadable:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: unreadable ({self.reason})"


Failure = Absent | Unreadable
Reading = str | Failure


class RootError(Exception):
    """The tree root itself is unusable (missing, not a directory)."""


# errno values that mean "no such file" rather than "could not read it".
_ABSENT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR})
# errno values from a kernel-confined open that the walker must look at: the path leaves the
# root (EXDEV, which includes an absolute link back into it) or loops (ELOOP); or a rename
# anywhere on the host raced a `..` step (EAGAIN: the kernel could not prove containment, and
# sysfs links are full of `..`). The walker accepts what is inside and names what is not.
_ASK_WALKER_ERRNOS = frozenset({errno.EXDEV, errno.ELOOP, errno.EAGAIN})


class SysfsTree:
    """Read-only view of a sysfs tree rooted at `root`."""

    def __init__(
        self, root: str | os.PathLike[str] = "/sys", *, kernel_confined: bool = True
    ) -> None:
        # os.path, not pathlib: importing pathlib (and urllib.parse, ipaddress) was ~3 % of
        # `fabricdra inventory`'s start-up (bench/startup.py).
        path = os.fspath(root)
        if not os.path.exists(path):
            raise RootError(f"sysfs root {path} does not exist")
        if not os.path.isdir(path):
            raise RootError(f"sysfs root {path} is not a directory")
        self.root = os.path.realpath(path)
        self._prefix = self.root.rstrip(os.sep) + os.sep
        # Resolving a symlink chain is the expensive part of a read; directory resolutions are
        # cached for one pass (a SysfsTree lives for one pass), attribute files are not.
        self._resolved: dict[str, str | Failure] = {}
        self._real: dict[str, str | Failure] = {}
        # Fast path: the kernel resolves and confines (openat2 RESOLVE_BENEATH); the Python
        # walker below remains the reference and the fallback, and answers identically.
        self._beneath = Beneath.create(self.root) if kernel_confined else None
        self._kernel_resolved: dict[str, str | Failure] = {}

    def close(self) -> None:
        if self._beneath is not None:
            self._beneath.close()

    # -- resolution ----------------------------------------------------------------------------

    def resolve(self, rel: str) -> str | Failure:
        """The path `rel` lands on after every symlink, relative to the root ("" is the root)."""
        rel = rel.strip("/")
        if self._beneath is None:
            return self._resolve(rel, 0)
        cached = self._kernel_resolved.get(rel)
        if cached is None:
            cached = self._derive(rel, self._beneath, 0)
        return cached

    def _derive(self, rel: str, beneath: Beneath, hops: int) -> str | Failure:
        """Resolve `rel` (not yet cached) from its parent's resolution plus one readlink(2) of
        the last component, instead of a kernel resolution of the whole chain (open, readlink
        of /proc/self/fd, close): sysfs paths share long prefixes, so most parents are already
        resolved. A resolution is a real path (no links in it), so a relative link target's
        leading `..` applies to it as text, and the rest is resolved the same way, confined
        to the root by construction. Anything out of the ordinary — a failure, a `.`/`..`/empty
        component, an absolute target, a target above the root, a long chain — is answered by
        the kernel resolution instead, so both give the same answers."""
        cache = self._kernel_resolved
        parent, _, name = rel.rpartition("/")
        result: str | Failure | None = None
        if name and name != "." and name != ".." and hops <= _MAX_LINK_HOPS:
            if parent:
                base = cache.get(parent)
                if base is None:
                    base = self._derive(parent, beneath, hops)
            else:
                base = ""
            if type(base) is str:
                candidate = f"{base}/{name}" if base else name
                try:
                    # Only the link's own text: the last component is not followed, and the
                    # ones before it are known not to be links.
                    target = os.readlink(candidate, dir_fd=beneath.dirfd)
                except OSError as e:
                    if e.errno == errno.EINVAL:  # there, and not a link
                        result = candidate
                    elif e.errno in _ABSENT_ERRNOS:
                        result = Absent(rel)
                except ValueError:  # a NUL in the name: the kernel resolution answers
                    pass
                else:
                    target_rel = _link_target(base, target)
                    if target_rel is not None:
                        landed = cache.get(target_rel)
                        if landed is None:
                            landed = self._derive(target_rel, beneath, hops + 1)
                        if type(landed) is str:
                            result = landed
                        elif isinstance(landed, Absent):
                            result = Absent(rel)
        if result is None:
            result = self._kernel_resolve(rel, beneath)
        cache[rel] = result
        return result

    def _kernel_resolve(self, rel: str, beneath: Beneath) -> str | Failure:
        try:
            fd = beneath.open_path(rel.encode() or b".")
        except OSError as e:
            return self._classify(rel, e, lambda: self._resolve(rel, 0))
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = ""
        finally:
            os.close(fd)
        if real == self.root:
            return ""
        if real.startswith(self._prefix):
            return real[len(self._prefix) :]
        return self._resolve(rel, 0)  # no usable /proc: the walker knows

    def _classify(self, rel: str, e: OSError, walker: Callable[[], _T]) -> _T | Failure:
        if e.errno in _ASK_WALKER_ERRNOS:
            return walker()
        if e.errno in _ABSENT_ERRNOS:
            return Absent(rel)
        return Unreadable(rel, e.strerror or str(e))

    def _resolve(self, rel: str, hops: int) -> str | Failure:
        # Component by component, each prefix resolved once per pass: sysfs paths share long
        # prefixes (devices/pci…/bridge/bridge/…), so this costs one lstat per new component
        # where os.path.realpath would lstat every component of every path again.
        cached = self._resolved.get(rel)
        if cached is not None:
            return cached
        if hops > _MAX_LINK_HOPS:
            return Unreadable(rel, "too many levels of symbolic links")
        parent, _, name = rel.rpartition("/")
        base = self._resolve(parent, hops) if parent else ""
        if isinstance(base, Absent | Unreadable):
            result: str | Failure = base if isinstance(base, Unreadable) else Absent(rel)
        elif name in ("", "."):
            result = base
        elif name == "..":
            result = Unreadable(rel, "climbs above the sysfs root") if not base else _dirname(base)
        else:
            result = self._step(rel, f"{base}/{name}" if base else name, hops)
        self._resolved[rel] = result
        return result

    def _step(self, rel: str, candidate: str, hops: int) -> str | Failure:
        """Resolve the last component of `candidate`, whose parent is already resolved. Many
        routes lead to one real path (class/net/X/device, physfn, virtfnN, …), so results are
        also cached by that path."""
        known = self._real.get(candidate)
        if known is None:
            known = self._step_uncached(rel, candidate, hops)
            self._real[candidate] = known
        if isinstance(known, Absent):
            return Absent(rel)
        if isinstance(known, Unreadable):
            return Unreadable(rel, known.reason)
        return known

    def _step_uncached(self, rel: str, candidate: str, hops: int) -> str | Failure:
        full = f"{self._prefix}{candidate}"
        try:
            st = os.lstat(full)
        except OSError as e:
            if e.errno in _ABSENT_ERRNOS:
                return Absent(rel)
            return Unreadable(rel, e.strerror or str(e))
        if not stat.S_ISLNK(st.st_mode):
            return candidate
        try:
            target = os.readlink(full)
        except OSError as e:
            return Unreadable(rel, e.strerror or str(e))
        if target.startswith("/"):
            if target != self.root and not target.startswith(self._prefix):
                return Unreadable(rel, f"links to {target}, outside the sysfs root")
            target_rel = target[len(self._prefix) :] if target != self.root else ""
        else:
            # The link's directory is already resolved (no links in it), so the target's
            # leading `..` can be applied to it as text; the rest is resolved component-wise.
            base = _dirname(candidate)
            parts = target.split("/")
            i = 0
            while i < len(parts) and parts[i] in ("..", ".", ""):
                if parts[i] == "..":
                    if not base:
                        return Unreadable(rel, f"links to {target}, above the sysfs root")
                    base = _dirname(base)
                i += 1
            rest = "/".join(parts[i:])
            target_rel = f"{base}/{rest}" if base and rest else (base or rest)
        resolved = self._resolve(target_rel.strip("/"), hops + 1)
        if isinstance(resolved, Absent):
            return Absent(rel)
        if isinstance(resolved, Unreadable):
            return Unreadable(rel, resolved.reason)
        return resolved

    def link_name(self, rel: str) -> str | Failure:
        """Basename of where the symlink `rel` lands (e.g. `device/subsystem` -> `pci`)."""
        target = self.resolve(rel)
        if isinstance(target, Absent | Unreadable):
            return target
        return os.path.basename(target)

    # -- reads ---------------------------------------------------------------------------------

    def read(self, rel: str) -> Reading:
        """One attribute, whitespace-stripped. Files over the cap are Unreadable, not truncated:
        half an attribute is not a reading."""
        beneath = self._beneath
        if beneath is None:
            return self._walk_read(rel)
        try:
            fd = beneath.open_read(rel.strip("/").encode())
        except OSError as e:
            return self._classify(rel, e, lambda: self._walk_read(rel))
        # _read_fd, inlined: this is the hottest path of a pass.
        try:
            data = os.read(fd, _READ_ASK)
            if not data and not stat.S_ISREG(os.fstat(fd).st_mode):
                return Unreadable(rel, "not a regular file")
        except OSError as e:
            return Unreadable(rel, e.strerror or str(e))
        finally:
            os.close(fd)
        if len(data) > READ_CAP:
            return Unreadable(rel, f"larger than the {READ_CAP // 1024} KiB read cap")
        return data.decode("utf-8", errors="replace").strip()

    def _walk_read(self, rel: str) -> Reading:
        parent, _, name = rel.strip("/").rpartition("/")
        base = self._resolve(parent, 0) if parent else ""
        if isinstance(base, Absent | Unreadable):
            return base
        full = f"{self._prefix}{base}/{name}" if base else f"{self._prefix}{name}"
        try:
            # O_NOFOLLOW: attributes are plain files; if this one is a link, resolve it properly.
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return self._read_through_link(rel)
            if e.errno in _ABSENT_ERRNOS:
                return Absent(rel)
            return Unreadable(rel, e.strerror or str(e))
        return self._read_fd(rel, fd)

    def _read_fd(self, rel: str, fd: int) -> Reading:
        # One read: sysfs hands out a whole attribute per read(2), and a regular file gives
        # everything up to the count asked for; a count of cap + 1 tells "too large" apart.
        try:
            data = os.read(fd, _READ_ASK)
            # Nothing read: make sure it is an empty attribute and not a FIFO or socket
            # planted in the tree (checked only here, where it is rare and cheap).
            if not data and not stat.S_ISREG(os.fstat(fd).st_mode):
                return Unreadable(rel, "not a regular file")
        except OSError as e:
            return Unreadable(rel, e.strerror or str(e))
        finally:
            os.close(fd)
        if len(data) > READ_CAP:
            return Unreadable(rel, f"larger than the {READ_CAP // 1024} KiB read cap")
        return data.decode("utf-8", errors="replace").strip()

    def _read_through_link(self, rel: str) -> Reading:
        target = self._resolve(rel.strip("/"), 0)
        if isinstance(target, Absent | Unreadable):
            return target
        if not target:
            return Unreadable(rel, "is the tree root, not an attribute")
        return self._walk_read(target)

    def read_int(self, rel: str, base: int = 10) -> int | Failure:
        text = self.read(rel)
        if isinstance(text, Absent | Unreadable):
            return text
        try:
            return int(text, base)
        except ValueError:
            return Unreadable(rel, f"not an integer: {text[:40]!r}")

    def listdir(self, rel: str) -> list[str] | Failure:
        """Sorted entries of a directory (sysfs order is not stable; ours is)."""
        if self._beneath is not None:
            try:
                fd = self._beneath.open_dir(rel.strip("/").encode() or b".")
            except OSError as e:
                if e.errno == errno.ENOTDIR:
                    # Which component is not a directory decides Absent or Unreadable.
                    return self._walk_listdir(rel)
                return self._classify(rel, e, lambda: self._walk_listdir(rel))
            try:
                return sorted(os.listdir(fd))
            except OSError as e:
                return Unreadable(rel, e.strerror or str(e))
            finally:
                os.close(fd)
        return self._walk_listdir(rel)

    def _walk_listdir(self, rel: str) -> list[str] | Failure:
        target = self._resolve(rel.strip("/"), 0)
        if isinstance(target, Absent | Unreadable):
            return target
        try:
            return sorted(os.listdir(os.path.join(self.root, target)))
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                # It exists (the path resolved) but is a file: there, but not listable.
                return Unreadable(rel, "not a directory")
            if e.errno in _ABSENT_ERRNOS:
                return Absent(rel)
            return Unreadable(rel, e.strerror or str(e))

    def exists(self, rel: str) -> bool:
        return not isinstance(self.resolve(rel), Absent | Unreadable)


def _link_target(base: str, target: str) -> str | None:
    """Where a relative link `target` found in the real directory `base` points, as a path
    relative to the root; None for an absolute or empty target or one that climbs above the
    root. Only the leading `..` are applied here; any later `.`/`..` stay for the resolver."""
    i = 0
    while target.startswith("../", i):
        i += 3
    rest = target[i:]
    ups = i // 3
    if rest == "..":
        ups += 1
        rest = ""
    if ups:
        if not base:
            return None
        pieces = base.rsplit("/", ups)
        if len(pieces) < ups:
            return None  # above the root
        base = pieces[0] if len(pieces) > ups else ""
    elif not rest or rest[0] == "/":
        return None
    rest = rest.rstrip("/")
    if not base:
        return rest
    return f"{base}/{rest}" if rest else base


def _dirname(path: str) -> str:
    return path.rpartition("/")[0]


def failed(reading: object) -> bool:
    return isinstance(reading, Absent | Unreadable)
