"""Asking the host's own IMEX service whether it serves (ComputeDomains with `imexMode: host`).

    check = HostImexCheck(ctl="nvidia-imex-ctl", driver_root_view=Path("/driver-root"),
                          socket=Path("/etc/nvidia-imex/imex_ctrl.sock"))
    ready, message = check.query(timeout=10)

The administrator runs `nvidia-imex` on every host; the node plugin runs in a container, which
has neither the host's `nvidia-imex-ctl` nor (without the host network) the host's loopback, on
which the service's TCP command port listens. So, as NVIDIA's own host-managed mode does, the
plugin asks over the service's command *unix socket* (`IMEX_CMD_UNIX_DOMAIN_PATH` in the host's
IMEX config, with `IMEX_CMD_ENABLED=1`), whose folder the chart mounts read-only, with the
host's own tool: `nvidia-imex-ctl -u <socket> -q`, which prints `READY` once the local service
serves. The tool is the one of the host's driver install (it must speak its service's
protocol): a bare `ctl` name is looked up in the driver root as this plugin sees it (`usr/bin`,
`usr/sbin`, `bin`), then on PATH. No socket given: the tool's own default (its config file,
`/etc/nvidia-imex/config.cfg`, on a plugin run on the host itself).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .imexfiles import BIN_DIRS

READY_MESSAGE = "host IMEX service READY"


def find_tool(name: str, driver_root_view: Path) -> str | None:
    """The executable `name`: a path as given; a bare name under the driver root first (the
    host's install), then on PATH."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    for folder in BIN_DIRS:
        path = driver_root_view / folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which(name)


@dataclass(frozen=True)
class HostImexCheck:
    ctl: str = "nvidia-imex-ctl"
    driver_root_view: Path = Path("/")
    socket: Path | None = None  # the service's command socket, as this plugin sees it
    args: tuple[str, ...] = field(default=("-q",))

    def command(self) -> list[str] | str:
        """The query's argv, or why it cannot be run (a message)."""
        tool = find_tool(self.ctl, self.driver_root_view)
        if tool is None:
            where = (
                ""
                if os.sep in self.ctl
                else f" in {self.driver_root_view} ({', '.join(BIN_DIRS)}) nor on PATH"
            )
            return (
                f"host IMEX mode: {self.ctl} not found{where}; is the host's nvidia-imex "
                "package installed (chart: driverRoot)?"
            )
        if self.socket is None:
            return [tool, *self.args]
        try:
            is_socket = stat.S_ISSOCK(self.socket.stat().st_mode)
        except OSError:
            is_socket = False
        if not is_socket:
            return (
                f"host IMEX mode: no IMEX command socket at {self.socket}: the host's "
                f"nvidia-imex needs IMEX_CMD_ENABLED=1 and IMEX_CMD_UNIX_DOMAIN_PATH={self.socket} "
                "in its config (/etc/nvidia-imex/config.cfg), and a restart"
            )
        return [tool, "-u", str(self.socket), *self.args]

    def query(self, timeout: float = 10.0) -> tuple[bool, str]:
        """Whether the host's IMEX service answers READY, and what it said within `timeout`."""
        cmd = self.command()
        if isinstance(cmd, str):
            return False, cmd
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except OSError as e:  # found but not runnable here (a foreign binary, a bad loader)
            return False, f"host IMEX mode: cannot run {cmd[0]}: {e}"
        except subprocess.TimeoutExpired:
            return False, f"host IMEX mode: {' '.join(cmd)} did not answer in {timeout:.0f} s"
        answer = done.stdout.strip()
        if answer != "READY":
            said = answer or done.stderr.strip() or f"exit status {done.returncode}"
            return False, f"host IMEX service not ready: {' '.join(cmd)} answered {said}"
        return True, READY_MESSAGE
