"""What an IMEX daemon container needs from the host's NVIDIA driver (pure: roots in, CDI edits
out), injected at prepare of its daemon claim, as NVIDIA's driver does:

- the `nvidia-imex` and `nvidia-imex-ctl` executables of the *installed* driver (IMEX must
  match the kernel module's version, so an image cannot bring its own), found under the
  driver root in `usr/bin`, `usr/sbin` or `bin`, bind-mounted read-only at `/usr/bin/<name>`;
- the `fabric-imex-mgmt` capability device, without which IMEX cannot manage the fabric:
  `/dev/nvidia-caps/nvidia-cap<minor>`, where the minor is `DeviceFileMinor` of
  `<proc>/driver/nvidia/capabilities/fabric-imex-mgmt` and the major is the `nvidia-caps`
  entry of `<proc>/devices`.

The driver root is a host path (the CDI mount source: `/` for a driver installed on the host,
`/run/nvidia/driver` under the GPU operator); `view` is where this plugin sees that same tree
(its own mount of it), used only to look for the files. What is missing is reported, not
guessed: the daemon then says "nvidia-imex not found", which reaches the domain's status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fabricdra.kubeletplugin.kubelet.cdi import DeviceNode, Mount

IMEX_EXECUTABLES = ("nvidia-imex", "nvidia-imex-ctl")
BIN_DIRS = ("usr/bin", "usr/sbin", "bin")
CAPS_DEVICE = "nvidia-caps"
FABRIC_CAPABILITY = "driver/nvidia/capabilities/fabric-imex-mgmt"


@dataclass(frozen=True)
class ImexInjection:
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    missing: tuple[str, ...] = field(default=())  # what was looked for and not found


def char_major(proc_root: Path, name: str) -> int | None:
    """The major of character device `name` in <proc_root>/devices (None if not listed)."""
    try:
        text = (proc_root / "devices").read_text()
    except OSError:
        return None
    character = False
    for line in text.splitlines():
        line = line.strip()
        if line.endswith("devices:"):
            character = line.startswith("Character")
            continue
        parts = line.split()
        if character and len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None


def capability_minor(proc_root: Path) -> int | None:
    """`DeviceFileMinor` of the fabric-imex-mgmt capability (None: the driver has none)."""
    try:
        text = (proc_root / FABRIC_CAPABILITY).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def imex_injection(driver_root: Path, view: Path, proc_root: Path) -> ImexInjection:
    mounts, missing = [], []
    for name in IMEX_EXECUTABLES:
        found = next((d for d in BIN_DIRS if (view / d / name).is_file()), None)
        if found is None:
            missing.append(f"{name} (under {driver_root} in {', '.join(BIN_DIRS)})")
            continue
        mounts.append(
            Mount(
                str(driver_root / found / name),
                f"/usr/bin/{name}",
                ("ro", "nosuid", "nodev", "bind"),
            )
        )
    nodes = []
    minor, major = capability_minor(proc_root), char_major(proc_root, CAPS_DEVICE)
    if minor is None:
        missing.append(f"{proc_root / FABRIC_CAPABILITY}")
    elif major is None:
        missing.append(f"{CAPS_DEVICE} in {proc_root / 'devices'}")
    else:
        nodes.append(
            DeviceNode(
                path=f"/dev/nvidia-caps/nvidia-cap{minor}",
                type="c",
                major=major,
                minor=minor,
                permissions="rw",
            )
        )
    return ImexInjection(tuple(mounts), tuple(nodes), tuple(missing))
