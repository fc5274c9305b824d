"""What the NVIDIA driver gives a node for ComputeDomains, laid out on the harness's made-up node
(tests/integration/kubelethost.py) the way the driver lays it out, so the chart's compute-domain
plugin and the IMEX daemons it prepares find them through chart values only (`driverRoot`,
`procRoot`, `devRoot`):

- `<proc>/devices` listing the driver's character devices, `nvidia-caps-imex-channels` among
  them (the channel major the plugin creates channel nodes with);
- `<proc>/driver/nvidia/capabilities/fabric-imex-mgmt` and its capability device node;
- a driver root whose `usr/bin` holds `nvidia-imex` and `nvidia-imex-ctl`: the stand-ins in
  tests/imex/ (the real tools' interface; docs/compute-domains.md), which the plugin bind-mounts
  into each IMEX daemon container as it would the installed driver's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.integration.kubelethost import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR, Host, mknod

IMEX_STANDINS = Path(__file__).resolve().parents[1] / "imex"
IMEX_CHANNELS_MAJOR = 234
FABRIC_CAP_MINOR = 1


def add_imex_driver(host: Host) -> Path:
    """Make `host` an IMEX-capable node; returns the driver root (the chart's `driverRoot`)."""
    proc, dev = host.layout.proc_root, host.layout.dev_root
    (proc / "devices").write_text(
        "Character devices:\n"
        "  1 mem\n"
        " 10 misc\n"
        f"{NVIDIA_MAJOR} nvidia-frontend\n"
        "231 infiniband_verbs\n"
        f"{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n"
        f"{UVM_MAJOR} nvidia-uvm\n"
        f"{CAPS_MAJOR} nvidia-caps\n"
        "\nBlock devices:\n"
        "  8 sd\n"
    )
    cap = proc / "driver" / "nvidia" / "capabilities" / "fabric-imex-mgmt"
    cap.parent.mkdir(parents=True, exist_ok=True)
    cap.write_text(f"DeviceFileMinor: {FABRIC_CAP_MINOR}\nDeviceFileMode: 256\n")
    mknod(dev / "nvidia-caps" / f"nvidia-cap{FABRIC_CAP_MINOR}", CAPS_MAJOR, FABRIC_CAP_MINOR)
    root = host.root / "driver-root"
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("nvidia-imex", "nvidia-imex-ctl"):
        shutil.copy2(IMEX_STANDINS / tool, bin_dir / tool)
        (bin_dir / tool).chmod(0o755)
    return root
