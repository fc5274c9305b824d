"""Host device nodes for prepare: the character devices a granted GPU, MIG instance or RDMA
endpoint is used through, resolved on the real host (or on a test "dev root").

Pure reads of /dev and /proc/driver/nvidia; every failure is a `DeviceNodeError` whose
message names each location checked, so a failed prepare says what to look at.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .kubelet.cdi import DeviceNode


class DeviceNodeError(Exception):
    """A device node the grant needs is missing or is not a character device."""


@dataclass(frozen=True, slots=True)
class HostLayout:
    """Where the host's device nodes and driver files are. Only tests change these: the
    container paths written into CDI specs are always the standard /dev ones."""

    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    sysfs_root: Path = Path("/sys")

    def char_device(self, container_path: str) -> DeviceNode:
        """The char device at `container_path` (a /dev path), with major/minor from the host's
        own node; `hostPath` only when the host copy lives elsewhere (a test dev root)."""
        host = self.host_path(container_path)
        try:
            st = os.stat(host)
        except FileNotFoundError:
            raise DeviceNodeError(f"device node {host} does not exist") from None
        except OSError as e:
            raise DeviceNodeError(f"device node {host} cannot be read: {e}") from None
        if not stat.S_ISCHR(st.st_mode):
            raise DeviceNodeError(f"{host} is not a character device")
        return DeviceNode(
            path=container_path,
            host_path=str(host) if str(host) != container_path else None,
            type="c",
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
        )

    def host_path(self, container_path: str) -> Path:
        if not container_path.startswith("/dev/"):
            raise DeviceNodeError(f"{container_path} is not under /dev")
        return self.dev_root / container_path[5:]

    def has_char_device(self, container_path: str) -> bool:
        try:
            return stat.S_ISCHR(os.stat(self.host_path(container_path)).st_mode)
        except OSError:
            return False

    # -- RDMA ------------------------------------------------------------------------------

    def verbs_device(self, rdma_device: str, verbs: str | None) -> DeviceNode:
        """The endpoint's own verbs char device, /dev/infiniband/<uverbsN>. `verbs` is what
        discovery read from <sysfs>/class/infiniband_verbs/*/ibdev."""
        sysfs = self.sysfs_root / "class" / "infiniband_verbs"
        if not verbs:
            raise DeviceNodeError(
                f"RDMA device {rdma_device} has no verbs device: checked {sysfs}/*/ibdev "
                f"(no uverbs entry names {rdma_device}) and {self.dev_root / 'infiniband'}"
            )
        path = f"/dev/infiniband/{verbs}"
        try:
            return self.char_device(path)
        except DeviceNodeError as e:
            raise DeviceNodeError(
                f"RDMA device {rdma_device}: verbs device {verbs} (from {sysfs}/{verbs}/ibdev) "
                f"cannot be used: {e}"
            ) from None

    # -- NVIDIA ----------------------------------------------------------------------------

    def nvidia_minor(self, bus_id: str) -> int:
        """The GPU's /dev/nvidiaN number, from the driver's own
        /proc/driver/nvidia/gpus/<bus id>/information ("Device Minor: N")."""
        info = self.proc_root / "driver" / "nvidia" / "gpus" / bus_id.lower() / "information"
        text = _read(info)
        m = re.search(r"^Device Minor:\s*(\d+)\s*$", text or "", re.M)
        if m is None:
            raise DeviceNodeError(
                f"GPU {bus_id}: no 'Device Minor' in {info}"
                + ("" if text is not None else " (file missing)")
            )
        return int(m.group(1))

    def nvidia_gpu_nodes(self, minor: int) -> list[DeviceNode]:
        """/dev/nvidiaN plus the control and UVM nodes CUDA opens (those the host has; the
        control node is required)."""
        nodes = [self.char_device(f"/dev/nvidia{minor}"), self.char_device("/dev/nvidiactl")]
        nodes.extend(
            self.char_device(p)
            for p in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
            if self.has_char_device(p)
        )
        return nodes

    def mig_cap_nodes(self, minor: int, gi: int, ci: int) -> list[DeviceNode]:
        """The MIG access capabilities of GPU instance `gi` / compute instance `ci`:
        /dev/nvidia-caps/nvidia-capN, N from the driver's capability files."""
        base = self.proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{minor}" / "mig"
        nodes = []
        for access in (base / f"gi{gi}" / "access", base / f"gi{gi}" / f"ci{ci}" / "access"):
            text = _read(access)
            m = re.search(r"^DeviceFileMinor:\s*(\d+)\s*$", text or "", re.M)
            if m is None:
                raise DeviceNodeError(
                    f"MIG gi{gi}/ci{ci} of GPU {minor}: no DeviceFileMinor in {access}"
                )
            nodes.append(self.char_device(f"/dev/nvidia-caps/nvidia-cap{m.group(1)}"))
        return nodes

    # -- AMD -------------------------------------------------------------------------------

    def amd_gpu_nodes(self, bus_id: str) -> list[DeviceNode]:
        """/dev/kfd (ROCm's compute interface, one per node) and the GPU's own render node
        /dev/dri/renderDN, named by the GPU's <sysfs>/bus/pci/devices/<bus id>/drm/ folder."""
        drm = self.sysfs_root / "bus" / "pci" / "devices" / bus_id.lower() / "drm"
        try:
            render = sorted(n for n in os.listdir(drm) if n.startswith("renderD"))
        except OSError:
            render = []
        if not render:
            raise DeviceNodeError(f"AMD GPU {bus_id}: no renderD* entry in {drm}")
        return [self.char_device("/dev/kfd"), self.char_device(f"/dev/dri/{render[0]}")]


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return None
