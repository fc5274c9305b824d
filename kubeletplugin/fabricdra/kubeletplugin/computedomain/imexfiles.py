"""What an IMEX daemon container needs from the host's NVIDIA driver (pure: roots in, CDI edits
out), injected at prepare of its daemon claim, as NVIDIA's driver does:

- the `nvidia-imex` and `nvidia-imex-ctl` executables of the *installed* driver (IMEX must
  match the kernel module's version, so an image cannot bring its own), found under the
  driver root in `usr/bin`, `usr/sbin` or `bin`, bind-mounted read-only at `/usr/bin/<name>`;
- the `fabric-imex-mgmt` capability device, without which IMEX cannot manage the fabric:
  `/dev/nvidia-caps/nvidia-cap<minor>`, where the minor is `DeviceFileMinor` of
  `<proc>/driver/nvidia/capabilities/fabric-imex-mgmt` and the major is the `nvidia-caps`
  entry of `<proc>/devices`;
- the driver's control device `/dev/nvidiactl` (the host's own node under the dev root): the
  driver's RM API, which every user-space client of the driver opens first;
- the driver's user-space libraries of the *running* kernel module's version (every
  `lib*.so.<version>` in the driver's library folder, and the soname links to them), mounted
  read-only under `/usr/lib/fabricdra-driver` (IMEX_LIBRARY_DIR): the daemon gives that folder
  to IMEX as its LD_LIBRARY_PATH. Only files of the loaded module's version: a library left
  from another driver version talking to this module fails its version handshake.
  NVIDIA's daemon gets the same (its "standard" CDI device: the container toolkit's common
  edits, see docs/compute-domains.md for the source lines);
- the driver version (`<proc>/driver/nvidia/version`), which the daemon checks before it
  starts IMEX: below MIN_RELOAD_DRIVER NVIDIA does not support the named peers re-resolved on
  SIGUSR1 that joins rely on (imex.py).

The driver root is a host path (the CDI mount source: `/` for a driver installed on the host,
`/run/nvidia/driver` under the GPU operator); `view` is where this plugin sees that same tree
(its own mount of it), used only to look for the files. What is missing is reported, not
guessed: the daemon then says "nvidia-imex not found", which reaches the domain's status.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from fabricdra.kubeletplugin.kubelet.cdi import DeviceNode, Mount

IMEX_EXECUTABLES = ("nvidia-imex", "nvidia-imex-ctl")
BIN_DIRS = ("usr/bin", "usr/sbin", "bin")
CAPS_DEVICE = "nvidia-caps"
FABRIC_CAPABILITY = "driver/nvidia/capabilities/fabric-imex-mgmt"
DRIVER_VERSION_FILE = "driver/nvidia/version"
CONTROL_DEVICE = "/dev/nvidiactl"
# Where the driver's libraries are, relative to the driver root (Debian/Ubuntu multiarch,
# then RHEL-likes): the first that holds libraries of the running version wins.
LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
)
IMEX_LIBRARY_DIR = "/usr/lib/fabricdra-driver"  # in the daemon container
# The first driver NVIDIA supports IMEX daemons with peers named by host name (re-resolved on
# SIGUSR1) on: its IMEXDaemonsWithDNSNamesMinDriverVersion, cmd/compute-domain-kubelet-plugin/
# main.go. This daemon names its peers and reloads in place (imex.py): older drivers refused.
MIN_RELOAD_DRIVER = "570.158.01"


@dataclass(frozen=True)
class ImexInjection:
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    missing: tuple[str, ...] = field(default=())  # what was looked for and not found
    driver_version: str | None = None  # the loaded kernel module's, None: not readable
    library_dir: str | None = None  # IMEX_LIBRARY_DIR when driver libraries are mounted


_VERSION = re.compile(r"\s(\d+\.\d+(?:\.\d+)?)\s")


def driver_version(proc_root: Path) -> str | None:
    """The loaded NVIDIA kernel module's version, from its own <proc>/driver/nvidia/version
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build...")."""
    try:
        text = (proc_root / DRIVER_VERSION_FILE).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            m = _VERSION.search(line + " ")
            return m.group(1) if m else None
    return None


def version_key(version: str) -> tuple[int, ...]:
    """ "570.158.01" -> (570, 158, 1), for comparing driver versions."""
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def older_than(version: str, minimum: str = MIN_RELOAD_DRIVER) -> bool:
    return version_key(version) < version_key(minimum)


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


def driver_libraries(view: Path, version: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(folder relative to the driver root, [(file name, container name)]) of the driver's
    libraries of `version`: every `lib*.so.<version>`, and each soname link in the same
    folder that resolves to one of them (`libnvidia-ml.so.1`, what programs load) mapped to
    its target. None: no folder holds libraries of that version."""
    suffix = f".so.{version}"
    for rel in LIB_DIRS:
        folder = view / rel
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        files = [n for n in names if n.startswith("lib") and n.endswith(suffix)]
        files = [n for n in files if (folder / n).is_file() and not (folder / n).is_symlink()]
        if not files:
            continue
        pairs = [(n, n) for n in files]
        for n in names:
            if n in files or ".so." not in n or not (folder / n).is_symlink():
                continue
            target = os.path.basename(os.path.realpath(folder / n))
            if target in files and os.path.dirname(os.path.realpath(folder / n)) == str(
                folder.resolve()
            ):
                pairs.append((target, n))
        return rel, pairs
    return None


def imex_injection(
    driver_root: Path, view: Path, proc_root: Path, dev_root: Path = Path("/dev")
) -> ImexInjection:
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
    control = dev_root / CONTROL_DEVICE[len("/dev/") :]
    try:
        st = os.stat(control)
    except OSError:
        st = None
    if st is None or not stat.S_ISCHR(st.st_mode):
        missing.append(f"{control} (the driver's control device)")
    else:
        nodes.append(
            DeviceNode(
                path=CONTROL_DEVICE,
                host_path=str(control) if str(control) != CONTROL_DEVICE else None,
                type="c",
                major=os.major(st.st_rdev),
                minor=os.minor(st.st_rdev),
                permissions="rw",
            )
        )
    version = driver_version(proc_root)
    library_dir = None
    if version is None:
        missing.append(f"{proc_root / DRIVER_VERSION_FILE} (the driver version)")
    else:
        found_libs = driver_libraries(view, version)
        if found_libs is None:
            missing.append(
                f"driver libraries lib*.so.{version} (under {driver_root} in {', '.join(LIB_DIRS)})"
            )
        else:
            rel, pairs = found_libs
            library_dir = IMEX_LIBRARY_DIR
            mounts.extend(
                Mount(
                    str(driver_root / rel / name),
                    f"{IMEX_LIBRARY_DIR}/{as_name}",
                    ("ro", "nosuid", "nodev", "bind"),
                )
                for name, as_name in pairs
            )
    return ImexInjection(tuple(mounts), tuple(nodes), tuple(missing), version, library_dir)
