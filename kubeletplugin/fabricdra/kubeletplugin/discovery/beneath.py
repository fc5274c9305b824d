"""Kernel-confined opens: openat2(2) with RESOLVE_BENEATH.

The kernel resolves the whole symlink chain itself and refuses (EXDEV) any step that would
leave the directory it starts from, which is exactly the sysfs containment rule, at the cost of
one system call instead of one lstat/readlink per path component in Python. Python's `os` has
no openat2, so it is called through libc's syscall(2).

`Beneath.create()` returns None where the kernel (before 5.6) or a seccomp filter refuses the
call; callers then use their own component-wise resolver, which gives the same answers.
"""

from __future__ import annotations

import ctypes
import errno
import os

# <linux/openat2.h>; the syscall number is the same on every architecture (unified table).
_SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


class Beneath:
    """Opens paths relative to one directory, never leaving it."""

    def __init__(self, root: str, syscall: ctypes._NamedFuncPointer) -> None:
        self._syscall = syscall
        self._dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        confined = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
        # One prepared request per kind of open: building the struct per call costs more
        # than the call.
        # O_NONBLOCK: a FIFO planted in the tree must not hang the pass.
        self._read = _OpenHow(os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, 0, confined)
        self._path = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, confined)
        self._dir = _OpenHow(os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0, confined)
        self._size = ctypes.sizeof(_OpenHow)
        # The hot calls pass these addresses as they are: a ctypes.byref per call costs
        # more than the rest of the argument conversion.
        self._read_at = ctypes.addressof(self._read)
        self._path_at = ctypes.addressof(self._path)
        self._dir_at = ctypes.addressof(self._dir)

    @classmethod
    def create(cls, root: str) -> Beneath | None:
        # os.uname, not platform.system (what it reads): importing platform compiles ~10
        # regexes, ~3 % of `fabricdra inventory`'s CPU time.
        if os.uname().sysname != "Linux":
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            syscall = libc.syscall
        except (OSError, AttributeError):
            return None
        syscall.restype = ctypes.c_long
        syscall.argtypes = (
            ctypes.c_long,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
        )
        beneath = cls(root, syscall)
        try:
            os.close(beneath.open_path(b"."))
        except OSError as e:
            beneath.close()
            if e.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                return None  # no openat2 here (old kernel, seccomp): use the walker
            raise
        return beneath

    def open_read(self, rel: bytes) -> int:
        fd: int = self._syscall(_SYS_OPENAT2, self._dirfd, rel, self._read_at, self._size)
        if fd < 0:
            raise _last_error()
        return fd

    def open_path(self, rel: bytes) -> int:
        fd: int = self._syscall(_SYS_OPENAT2, self._dirfd, rel, self._path_at, self._size)
        if fd < 0:
            raise _last_error()
        return fd

    def open_dir(self, rel: bytes) -> int:
        fd: int = self._syscall(_SYS_OPENAT2, self._dirfd, rel, self._dir_at, self._size)
        if fd < 0:
            raise _last_error()
        return fd

    @property
    def dirfd(self) -> int:
        """The root directory, for *at() calls that read no more than one link's text."""
        return self._dirfd

    def close(self) -> None:
        if self._dirfd >= 0:
            os.close(self._dirfd)
            self._dirfd = -1

    def __del__(self) -> None:
        self.close()


def _last_error() -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))
