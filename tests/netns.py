"""A network namespace of its own, with real interfaces and addresses the kernel answers for:
what a test points `proc_root` at to play "the host's network namespace" without touching the
machine's own (needs root, `unshare` and `ip`; veth pairs, since the dummy link type may be
absent)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType


class IsolatedNetns:
    """`with IsolatedNetns(tmp, {"ens0np0": ["192.0.2.10/24", "2001:db8::10/64"]}) as ns:`
    each named interface (a veth, up) carries the addresses; `ns.proc_root / "1"` is the
    namespace's holder process, as `<proc>/1` is the host's init."""

    def __init__(self, base: Path, interfaces: dict[str, list[str]]) -> None:
        self.proc_root = base / "proc"
        lines = ["set -e", "ip link set lo up"]
        for i, (name, addresses) in enumerate(interfaces.items()):
            lines.append(f"ip link add {name} type veth peer name peer{i}")
            lines.append(f"ip link set {name} up")
            lines.append(f"ip link set peer{i} up")
            for a in addresses:
                family = "-6" if ":" in a else "-4"
                nodad = " nodad" if ":" in a else ""
                lines.append(f"ip {family} addr add {a} dev {name}{nodad}")
        lines += ["echo ready", "exec sleep 3600"]
        self._script = "\n".join(lines)
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> IsolatedNetns:
        self._proc = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", self._script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if line.strip() != "ready":
            self._proc.kill()
            _, err = self._proc.communicate()
            raise RuntimeError(f"network namespace set-up failed: {err.strip()}")
        self.proc_root.mkdir(parents=True, exist_ok=True)
        (self.proc_root / "1").symlink_to(f"/proc/{self._proc.pid}")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.communicate()
