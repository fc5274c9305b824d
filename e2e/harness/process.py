"""Daemons the harness starts: one process group each, output to a log file, always stoppable.

Every daemon runs in its own session (setsid), so stopping it signals the whole group,
including anything it forked. Daemons tied to the test process also get PR_SET_PDEATHSIG, so
that even a SIGKILLed pytest takes them down with it; the registry below is the second net,
stopping whatever is still running when the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from e2e.harness.errors import HarnessError

_PR_SET_PDEATHSIG = 1
_running: set[Daemon] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (racy; callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _tied_to_parent(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """argv (and preexec hook) for a child that gets SIGKILL when this process dies.

    util-linux's setpriv sets the death signal and execs the daemon in place (same pid), so
    no Python runs between fork and exec (preexec_fn is unsafe once threads exist, and the
    kubernetes client starts some); preexec_fn is only the fallback without setpriv.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "KILL", "--", *argv], None
    return argv, _die_with_parent


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


class Daemon:
    """One long-running process, its log file, and a stop() that always ends it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """`die_with_parent=False` is for daemons meant to outlive this process (up.sh)."""
        self.name = name
        self._stopped = False
        self.argv = list(argv)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        argv, preexec = _tied_to_parent(self.argv) if die_with_parent else (self.argv, None)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=preexec,
            )
        if die_with_parent:
            with _lock:
                _running.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self, what: str) -> HarnessError:
        """An error naming this daemon, its log, and the log's last lines."""
        status = "running" if self.alive() else f"exited with {self.proc.returncode}"
        return HarnessError(f"{self.name} {what} ({status}); log {self.log}:\n{log_tail(self.log)}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it after `timeout`; safe to call twice."""
        with _lock:
            _running.discard(self)
        if self._stopped:
            return
        self._stopped = True
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; still sweep the group for forked children.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is as good as gone


def stop_recorded(pid: int, program: str, timeout: float = 15.0) -> None:
    """Stop the process group led by `pid`, recorded by another process (e.g. up.sh).

    Signals it only if `pid` still runs `program`, so a reused pid is never hit.
    """
    argv = _cmdline(pid)
    if not argv or Path(argv[0]).name != program:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not _gone(pid):
            time.sleep(0.1)
        if _gone(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            return


def kill_matching(match: Callable[[list[str]], bool]) -> list[int]:
    """SIGKILL every process whose argv satisfies `match`; returns their pids."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        argv = _cmdline(int(entry.name))
        if argv and match(argv):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


@atexit.register
def _stop_all() -> None:
    with _lock:
        leftovers = list(_running)
    for daemon in reversed(leftovers):
        daemon.stop(timeout=5.0)
