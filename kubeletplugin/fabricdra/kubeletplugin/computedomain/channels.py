"""IMEX channel device nodes: `/dev/nvidia-caps-imex-channels/channel<N>`, a character device
whose major is the `nvidia-caps-imex-channels` entry of `/proc/devices` and whose minor is the
channel id. Both roots are parameters so tests hand in a real file and real device nodes."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

PROC_DEVICES_NAME = "nvidia-caps-imex-channels"
CHANNEL_DIR = "nvidia-caps-imex-channels"


class ChannelError(Exception):
    """The host cannot provide an IMEX channel; the message says what is missing."""


def imex_major(proc_root: Path) -> int | None:
    """The major number of `nvidia-caps-imex-channels` in <proc_root>/devices, or None when
    the driver did not register it (no NVIDIA driver, or one without IMEX channels)."""
    path = proc_root / "devices"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ChannelError(f"{path} does not exist") from None
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.endswith("devices:"):
            section = line
            continue
        parts = line.split()
        if len(parts) == 2 and parts[1] == PROC_DEVICES_NAME and section.startswith("Character"):
            try:
                return int(parts[0])
            except ValueError:
                raise ChannelError(
                    f"{path}: bad major {parts[0]!r} for {PROC_DEVICES_NAME}"
                ) from None
    return None


@dataclass(frozen=True)
class ChannelNode:
    channel: int
    major: int

    @property
    def container_path(self) -> str:
        return f"/dev/{CHANNEL_DIR}/channel{self.channel}"


def ensure_host_node(dev_root: Path, node: ChannelNode) -> Path:
    """Make sure the host has the channel's device node (what `nvidia-modprobe -i` does):
    create it when missing, refuse one that is not that device."""
    path = dev_root / CHANNEL_DIR / f"channel{node.channel}"
    want = os.makedev(node.major, node.channel)
    try:
        st = path.lstat()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, want)
        except FileExistsError:  # another prepare made it meanwhile
            pass
        except PermissionError as e:
            raise ChannelError(f"cannot create {path}: {e}") from None
        st = path.lstat()
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != want:
        raise ChannelError(
            f"{path} exists but is not the character device {node.major}:{node.channel}"
        )
    return path
