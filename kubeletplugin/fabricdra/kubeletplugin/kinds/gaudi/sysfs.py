"""What a Gaudi's kernel objects say in sysfs: its accel device index and the scale-out ports
on its chip. Pure reads of a `SysfsTree`; nothing here knows about DRA.

* The compute accelerators subsystem (drivers/accel/drm_accel.c,
  https://github.com/torvalds/linux/blob/master/drivers/accel/drm_accel.c) puts each device
  in class `accel` as `accel<N>` (`/sys/class/accel/accel<N>/device` is its PCI function),
  its node `/dev/accel/accel<N>` (`accel_devnode`: "accel/%s"). habanalabs adds a control
  device in the same class with the same index, `accel_controlD<N>` (drivers/accel/habanalabs/
  common/device.c `cdev_sysfs_debugfs_add`, https://github.com/torvalds/linux/blob/master/
  drivers/accel/habanalabs/common/device.c), node `/dev/accel/accel_controlD<N>`; the user
  library opens both (hl-thunk `HLTHUNK_DEV_NAME_PRIMARY`/`_CONTROL`,
  https://github.com/HabanaAI/hl-thunk-open).
* Scale-out ports: Gaudi2 carries its RoCE ports on the chip; the HabanaLabs network drivers
  register them as RDMA devices (`hbl_*`, rdma-core's `hbl` provider) on auxiliary devices
  below the Gaudi's PCI function (the hbl_cn/hbl_en/hbl patch series on linux-rdma, 2024:
  https://lore.kernel.org/linux-rdma/?q=hbl_cn). Not in mainline yet, so only what is certain
  is read: the RDMA devices whose device lies below the Gaudi's own PCI function, at any depth,
  whatever bus or name they carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from ...discovery.rdma import read_rdma_index
from ...discovery.sysfs import Absent, SysfsTree, Unreadable

ACCEL_CLASS = "class/accel"
_ACCEL = re.compile(r"^accel(0|[1-9][0-9]*)$")


@dataclass(frozen=True)
class GaudiRecord:
    """A Gaudi's own facts beyond its accelerator record (the kind's payload on `Device`)."""

    accel_index: int  # /dev/accel/accel<N> and /dev/accel/accel_controlD<N>
    ports: tuple[str, ...]  # its scale-out ports' RDMA device names, sorted


def accel_indexes(tree: SysfsTree) -> dict[str, int]:
    """PCI function path (resolved) → its accel device index, from class/accel (none where
    the class is absent or unreadable: no accel driver loaded)."""
    names = tree.listdir(ACCEL_CLASS)
    if isinstance(names, Absent | Unreadable):
        return {}
    out = {}
    for name in names:
        m = _ACCEL.match(name)
        if m is None:
            continue  # accel_controlD<N>: the same device's control node
        fn = tree.resolve(f"{ACCEL_CLASS}/{name}/device")
        if isinstance(fn, str):
            out[fn] = int(m.group(1))
    return out


def read_records(tree: SysfsTree, bus_ids: list[str]) -> dict[str, GaudiRecord]:
    """PCI bus id → its record, for the functions of `bus_ids` that have an accel device."""
    indexes = accel_indexes(tree)
    if not indexes:
        return {}
    rdma = read_rdma_index(tree, datetime.now(UTC)).devices
    out = {}
    for bus in bus_ids:
        fn = tree.resolve(f"bus/pci/devices/{bus}")
        if not isinstance(fn, str) or fn not in indexes:
            continue
        ports = sorted(
            d.name
            for d in rdma
            if d.device_path is not None
            and (d.device_path == fn or d.device_path.startswith(fn + "/"))
        )
        out[bus] = GaudiRecord(indexes[fn], tuple(ports))
    return out
