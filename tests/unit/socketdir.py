"""Short folders for unix sockets in unit tests.

A unix socket's address holds at most 107 bytes, and pytest's `tmp_path` grows with its run
counter (`pytest-1234/`) and, under pytest-xdist, the worker (`popen-gw1/`): a socket under a
test's long name there was refused ("longer than the 105 bytes a unix socket address can
hold"). Sockets get a folder of their own directly under /tmp instead.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def short_dir() -> Path:
    """A new empty folder with a short path; the caller removes it (remove_dir)."""
    return Path(tempfile.mkdtemp(prefix="fdra-", dir="/tmp"))


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def socket_dir() -> Iterator[Path]:
    path = short_dir()
    try:
        yield path
    finally:
        remove_dir(path)
