"""PCI vendor ids, defined here and nowhere else (tests/unit/test_import_graph.py checks).

In sysfs's form (`/sys/bus/pci/devices/*/vendor`: `0x` and four lowercase hex digits). Each
is the kernel's `PCI_VENDOR_ID_*` (include/linux/pci_ids.h,
https://github.com/torvalds/linux/blob/master/include/linux/pci_ids.h) and the PCI ID
Repository's entry (https://pci-ids.ucw.cz/read/PC/<id>).
"""

from __future__ import annotations

NVIDIA = "0x10de"  # PCI_VENDOR_ID_NVIDIA
AMD = "0x1002"  # PCI_VENDOR_ID_ATI: AMD's GPUs (amdgpu)
INTEL = "0x8086"  # PCI_VENDOR_ID_INTEL
HABANA = "0x1da3"  # PCI_VENDOR_ID_HABANALABS: Intel Gaudi (drivers/accel/habanalabs)
HUAWEI = "0x19e5"  # PCI_VENDOR_ID_HUAWEI: Ascend NPUs
TENSTORRENT = "0x1e52"  # Tenstorrent (pci.ids)
MELLANOX = "0x15b3"  # PCI_VENDOR_ID_MELLANOX: ConnectX, BlueField
AMAZON = "0x1d0f"  # PCI_VENDOR_ID_AMAZON: EFA and ENA functions

# The vendor name an accelerator record carries (`Accelerator.vendor`).
ACCELERATOR_VENDORS = {
    NVIDIA: "nvidia",
    AMD: "amd",
    INTEL: "intel",
    HABANA: "habana",
    HUAWEI: "huawei",
    TENSTORRENT: "tenstorrent",
}
