"""A small builder of kernel-shaped sysfs trees.

Everything the kernel expresses as a symlink is a relative symlink here too: class/net/<if>,
class/infiniband/<dev>, class/infiniband_verbs/<uverbs>, bus/pci/devices/<bdf> all point into
devices/pci…, and `device`, `subsystem`, `driver`, `virtfnN` and `physfn` are links, so the code
under test resolves the same chains it meets on a real host.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

NVIDIA, AMD, MELLANOX, INTEL, VIRTIO = "0x10de", "0x1002", "0x15b3", "0x8086", "0x1af4"
AMAZON = "0x1d0f"  # AWS EFA and ENA functions (PCI_VENDOR_ID_AMAZON)
HABANA = "0x1da3"  # Intel Gaudi (PCI_VENDOR_ID_HABANALABS)
CLASS_BRIDGE, CLASS_ETHERNET, CLASS_3D, CLASS_INFINIBAND = 0x060400, 0x020000, 0x030200, 0x020700
CLASS_ACCEL = 0x120000


# The error counters a healthy port shows (all zero); a port's `counters` replaces them.
ZERO_COUNTERS = (
    ("symbol_error", 0),
    ("link_error_recovery", 0),
    ("link_downed", 0),
    ("port_rcv_errors", 0),
    ("local_link_integrity_errors", 0),
    ("excessive_buffer_overrun_errors", 0),
)


@dataclass(frozen=True)
class Port:
    state: str | None = "4: ACTIVE"
    phys_state: str | None = "5: LinkUp"
    link_layer: str = "Ethernet"
    netdev: str | None = None
    rate: str | None = "400 Gb/sec (4X NDR)"  # None: no `rate` file
    counters: tuple[tuple[str, int], ...] | None = ZERO_COUNTERS  # None: no counters/ folder
    # InfiniBand port identity, as drivers/infiniband/core/sysfs.c prints it: gids/0 in %pI6
    # form, lid and sm_lid as 0x%x. None: no such file.
    gid0: str | None = None
    lid: int | None = None
    sm_lid: int | None = None


@dataclass(frozen=True)
class PcieLink:
    """The four link files of a PCIe function (`current_link_*`, `max_link_*`)."""

    width: int = 16
    speed: str = "32.0 GT/s PCIe"
    max_width: int = 16
    max_speed: str = "32.0 GT/s PCIe"


GEN5_X16 = PcieLink()


UP = Port()
DOWN = Port(state="1: DOWN", phys_state="3: Disabled")
# A port that lost its link: the state is not ACTIVE, whatever its name starts with.
ACTIVE_DEFER = Port(state="5: ACTIVE_DEFER", phys_state="5: LinkUp")
# How a file can exist and still not be readable, for `SysfsBuilder.make_unreadable`. We run as
# root, so permissions block nothing; these are the ways the reader itself must refuse.
UNREADABLE_HOW = ("directory", "escaping-link", "oversize", "link-loop")


class SysfsBuilder:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._uverbs = 0
        for d in ("class/net", "bus/pci/devices", "devices/virtual/net"):
            (root / d).mkdir(parents=True, exist_ok=True)

    # -- primitives ----------------------------------------------------------------------------

    def write(self, rel: str, content: str | bytes) -> Path:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content if content.endswith("\n") else content + "\n")
        return p

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at `rel` pointing at `target_rel` (both relative to the root)."""
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        os.symlink(os.path.relpath(self.root / target_rel, p.parent), p)

    # -- PCI -----------------------------------------------------------------------------------

    def root_bus(self, name: str = "pci0000:00") -> str:
        (self.root / "devices" / name).mkdir(parents=True, exist_ok=True)
        return f"devices/{name}"

    def pci(
        self,
        parent: str,
        bdf: str,
        *,
        vendor: str = INTEL,
        device: str = "0x0001",
        pci_class: int = CLASS_BRIDGE,
        numa: int | None = -1,
        cpus: str | None = None,
        driver: str | None = None,
    ) -> str:
        path = f"{parent}/{bdf}"
        self.write(f"{path}/vendor", vendor)
        self.write(f"{path}/device", device)
        self.write(f"{path}/class", f"0x{pci_class:06x}")
        if numa is not None:
            self.write(f"{path}/numa_node", str(numa))
        if cpus is not None:
            self.write(f"{path}/local_cpulist", cpus)
        self.link(f"{path}/subsystem", "bus/pci")
        (self.root / "bus/pci").mkdir(parents=True, exist_ok=True)
        if driver:
            (self.root / f"bus/pci/drivers/{driver}").mkdir(parents=True, exist_ok=True)
            self.link(f"{path}/driver", f"bus/pci/drivers/{driver}")
        self.link(f"bus/pci/devices/{bdf}", path)
        return path

    def remove_pci(self, bdf: str) -> None:
        """Hot removal (e.g. a GPU that fell off the bus): the kernel deletes the function's
        directory and its bus/pci/devices entry."""
        entry = self.root / f"bus/pci/devices/{bdf}"
        shutil.rmtree(entry.resolve())
        entry.unlink()

    def bridge(
        self, parent: str, bdf: str, numa: int | None = -1, link: PcieLink | None = None
    ) -> str:
        """A PCI bridge; `link` also writes its link files (None: none, as before)."""
        path = self.pci(parent, bdf, pci_class=CLASS_BRIDGE, numa=numa, driver="pcieport")
        self.pcie_link(path, link)
        return path

    def switch(
        self,
        parent: str,
        upstream: str,
        downstream: list[str],
        numa: int | None = -1,
        link: PcieLink | None = None,
    ) -> list[str]:
        """A PCIe switch: one upstream port bridge and its downstream port bridges (`link`:
        the link files of every port, None: none)."""
        up = self.bridge(parent, upstream, numa, link)
        return [self.bridge(up, d, numa, link) for d in downstream]

    def gpu(
        self,
        parent: str,
        bdf: str,
        *,
        vendor: str = NVIDIA,
        device: str = "0x2330",
        numa: int | None = 0,
        cpus: str | None = "0-31",
        pci_class: int = CLASS_3D,
        link: PcieLink | None = GEN5_X16,
    ) -> str:
        driver = "nvidia" if vendor == NVIDIA else "amdgpu"
        path = self.pci(
            parent,
            bdf,
            vendor=vendor,
            device=device,
            pci_class=pci_class,
            numa=numa,
            cpus=cpus,
            driver=driver,
        )
        self.pcie_link(path, link)
        return path

    def rebind(self, bdf: str, driver: str | None) -> None:
        """Bind a function to another driver (`vfio-pci` for passthrough to a VM), or unbind it
        (None): the kernel swaps, or removes, its `driver` link."""
        path = os.path.relpath((self.root / f"bus/pci/devices/{bdf}").resolve(), self.root)
        (self.root / path / "driver").unlink(missing_ok=True)
        if driver:
            (self.root / f"bus/pci/drivers/{driver}").mkdir(parents=True, exist_ok=True)
            self.link(f"{path}/driver", f"bus/pci/drivers/{driver}")

    def pcie_link(self, path: str, link: PcieLink | None) -> None:
        """Write (or, with None, leave out) a device's PCIe link files."""
        if link is None:
            return
        self.write(f"{path}/current_link_width", str(link.width))
        self.write(f"{path}/current_link_speed", link.speed)
        self.write(f"{path}/max_link_width", str(link.max_width))
        self.write(f"{path}/max_link_speed", link.max_speed)

    def nic(
        self,
        parent: str,
        bdf: str,
        netdev: str | None,
        *,
        numa: int | None = 0,
        cpus: str | None = "0-31",
        vendor: str = MELLANOX,
        device: str = "0x1021",
        total_vfs: int | None = None,
        mtu: int = 9000,
        operstate: str = "up",
        driver: str = "mlx5_core",
        link: PcieLink | None = GEN5_X16,
    ) -> str:
        path = self.pci(
            parent,
            bdf,
            vendor=vendor,
            device=device,
            pci_class=CLASS_ETHERNET,
            numa=numa,
            cpus=cpus,
            driver=driver,
        )
        self.pcie_link(path, link)
        if total_vfs is not None:
            self.write(f"{path}/sriov_totalvfs", str(total_vfs))
            self.write(f"{path}/sriov_numvfs", "0")
        if netdev:
            self.netdev(netdev, path, mtu=mtu, operstate=operstate)
        return path

    def vfs(
        self,
        pf: str,
        bdfs: list[str],
        netdevs: list[str | None] | None = None,
        numa: int | None = 0,
    ) -> list[str]:
        """SR-IOV VFs: siblings of the PF under the same upstream bridge, virtfnN/physfn links."""
        parent = pf.rsplit("/", 1)[0]
        self.write(f"{pf}/sriov_numvfs", str(len(bdfs)))
        out = []
        for i, bdf in enumerate(bdfs):
            path = self.pci(
                parent,
                bdf,
                vendor=MELLANOX,
                device="0x101e",
                pci_class=CLASS_ETHERNET,
                numa=numa,
                driver="mlx5_core",
            )
            self.link(f"{pf}/virtfn{i}", path)
            self.link(f"{path}/physfn", pf)
            name = netdevs[i] if netdevs else None
            if name:
                self.netdev(name, path)
            out.append(path)
        return out

    # -- DMI -----------------------------------------------------------------------------------

    def dmi(self, product_name: str, board_name: str | None = None, vendor: str = "NVIDIA") -> None:
        """The system model, as the kernel shows it: class/dmi/id -> devices/virtual/dmi/id."""
        base = "devices/virtual/dmi/id"
        self.write(f"{base}/product_name", product_name)
        self.write(f"{base}/sys_vendor", vendor)
        if board_name is not None:
            self.write(f"{base}/board_name", board_name)
        self.link("class/dmi/id", base)

    # -- net -----------------------------------------------------------------------------------

    def netdev(
        self,
        name: str,
        device: str | None,
        *,
        mtu: int = 1500,
        operstate: str = "up",
        flags: int = 0x1003,
    ) -> str:
        """An interface under `device` (or devices/virtual/net when None)."""
        base = f"{device}/net/{name}" if device else f"devices/virtual/net/{name}"
        self.write(f"{base}/mtu", str(mtu))
        self.write(f"{base}/operstate", operstate)
        self.write(f"{base}/flags", f"0x{flags:x}")
        if device:
            self.link(f"{base}/device", device)
        self.link(f"class/net/{name}", base)
        return base

    def loopback(self) -> str:
        return self.netdev("lo", None, mtu=65536, operstate="unknown", flags=0x9)

    def bus_device(self, parent: str, name: str, bus: str) -> str:
        """A non-PCI device (virtio, auxiliary, …) on `bus`, below `parent`."""
        path = f"{parent}/{name}"
        (self.root / path).mkdir(parents=True, exist_ok=True)
        (self.root / f"bus/{bus}/devices").mkdir(parents=True, exist_ok=True)
        self.link(f"{path}/subsystem", f"bus/{bus}")
        self.link(f"bus/{bus}/devices/{name}", path)
        return path

    # -- RDMA ----------------------------------------------------------------------------------

    def rdma(
        self, device: str, name: str, ports: list[Port] | None = None, verbs: bool = True
    ) -> str:
        """An RDMA device on `device`. `ports=[]` gives a device that shows no ports; a port
        whose state or phys_state is None has no such file (a reading that is absent)."""
        base = f"{device}/infiniband/{name}"
        self.link(f"{base}/device", device)
        (self.root / base / "ports").mkdir(parents=True, exist_ok=True)
        for i, port in enumerate([UP] if ports is None else ports, start=1):
            pb = f"{base}/ports/{i}"
            (self.root / pb).mkdir(parents=True, exist_ok=True)
            if port.state is not None:
                self.write(f"{pb}/state", port.state)
            if port.phys_state is not None:
                self.write(f"{pb}/phys_state", port.phys_state)
            self.write(f"{pb}/link_layer", port.link_layer)
            if port.rate is not None:
                self.write(f"{pb}/rate", port.rate)
            if port.gid0 is not None:
                self.write(f"{pb}/gids/0", port.gid0)
            if port.lid is not None:
                self.write(f"{pb}/lid", f"0x{port.lid:x}")
            if port.sm_lid is not None:
                self.write(f"{pb}/sm_lid", f"0x{port.sm_lid:x}")
            for counter, value in port.counters or ():
                self.write(f"{pb}/counters/{counter}", str(value))
            if port.netdev:
                self.write(f"{pb}/gid_attrs/ndevs/0", port.netdev)
        self.link(f"class/infiniband/{name}", base)
        if verbs:
            uverbs = f"uverbs{self._uverbs}"
            self._uverbs += 1
            vb = f"{device}/infiniband_verbs/{uverbs}"
            self.write(f"{vb}/ibdev", name)
            self.write(f"{vb}/dev", f"231:{192 + self._uverbs - 1}")
            self.link(f"class/infiniband_verbs/{uverbs}", vb)
        return base

    def efa(
        self,
        parent: str,
        bdf: str,
        name: str = "efa_0",
        *,
        device: str = "0xefa1",
        numa: int | None = 0,
        port: Port | None = None,
    ) -> str:
        """An AWS EFA function as the kernel lays it out: PCI vendor 0x1d0f (device 0xefa0,
        0xefa1, 0xefa2 or 0xefa3: drivers/infiniband/hw/efa/efa_main.c `efa_pci_tbl`), bound to
        `efa`, no netdev (the ENA function beside it has that), one RDMA port (phys_port_cnt 1)
        whose link layer the kernel shows as Unknown (efa_port_link_layer: unspecified), its
        verbs device `uverbsN`. `name` is the kernel's `efa_%d` unless udev renamed it
        (`rdmap16s27`)."""
        path = self.pci(
            parent,
            bdf,
            vendor=AMAZON,
            device=device,
            pci_class=CLASS_ETHERNET,
            numa=numa,
            cpus="0-47",
            driver="efa",
        )
        self.rdma(path, name, [port or Port(link_layer="Unknown", rate="100 Gb/sec (4X EDR)")])
        return path

    def gaudi(
        self,
        parent: str,
        bdf: str,
        index: int,
        *,
        device: str = "0x1020",
        numa: int | None = 0,
        ports: int = 0,
        driver: str = "habanalabs",
    ) -> str:
        """An Intel Gaudi as the kernel lays it out: a processing accelerator of vendor 0x1da3
        (device 0x1020: Gaudi2) bound to `habanalabs`, its accel device `accel<index>` and the
        driver's control device `accel_controlD<index>` in class `accel` (drivers/accel/
        drm_accel.c; habanalabs common/device.c), and `ports` scale-out RDMA devices `hbl_<k>`
        on an auxiliary device below the function (the HabanaLabs network drivers)."""
        path = self.pci(
            parent,
            bdf,
            vendor=HABANA,
            device=device,
            pci_class=CLASS_ACCEL,
            numa=numa,
            cpus="0-31",
            driver=driver,
        )
        for name in (f"accel{index}", f"accel_controlD{index}"):
            node = f"{path}/accel/{name}"
            self.write(f"{node}/dev", f"261:{index}")
            self.link(f"{node}/device", path)
            self.link(f"{node}/subsystem", "class/accel")
            self.link(f"class/accel/{name}", node)
        if ports:
            aux = self.bus_device(path, f"habanalabs_cn.cn.{index}", "auxiliary")
            for k in range(ports):
                name = f"hbl_{index * ports + k}"
                self.netdev(name.replace("_", ""), aux, mtu=8192)
                self.rdma(aux, name, [Port(netdev=name.replace("_", ""))])
        return path

    # -- broken files --------------------------------------------------------------------------

    def make_unreadable(self, rel: str, how: str = "directory") -> None:
        """Replace the file at `rel` with something that exists but cannot be read as an
        attribute: a directory (EISDIR), a link leaving the root, a file over the 64 KiB cap,
        or a link that loops."""
        p = self.root / rel
        if p.is_symlink() or p.is_file():
            p.unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        if how == "directory":
            p.mkdir()
        elif how == "escaping-link":
            os.symlink("/proc/version", p)
        elif how == "oversize":
            p.write_bytes(b"4: ACTIVE\n" + b" " * (64 * 1024))
        elif how == "link-loop":
            os.symlink(p.name, p)
        else:
            raise ValueError(f"unknown way to be unreadable: {how}")

    def escape(self, rel: str, target: str = "/etc") -> None:
        """Replace `rel` (a file, link or directory) with a link that leaves the root."""
        p = self.root / rel
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            import shutil

            shutil.rmtree(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)

    # -- AMD KFD -------------------------------------------------------------------------------

    def kfd_cpu(self, node: int) -> None:
        base = f"devices/virtual/kfd/kfd/topology/nodes/{node}"
        self.write(
            f"{base}/properties", "cpu_cores_count 56\nsimd_count 0\nlocation_id 0\nhive_id 0\n"
        )
        (self.root / base / "io_links").mkdir(parents=True, exist_ok=True)
        self.link("class/kfd/kfd", "devices/virtual/kfd/kfd")

    def kfd_gpu(
        self,
        node: int,
        bdf: str,
        hive_id: int,
        xgmi_peers: list[int],
        *,
        unique_id: int | None = None,
    ) -> None:
        """A KFD GPU node. `unique_id`: the GPU's serial as kfd_topology.c prints it (decimal,
        `unique_id N`); None leaves the line out, as kernels before it did."""
        domain, bus, devfn = bdf.split(":")
        dev, fn = devfn.split(".")
        location = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)
        base = f"devices/virtual/kfd/kfd/topology/nodes/{node}"
        extra = "" if unique_id is None else f"unique_id {unique_id}\n"
        self.write(
            f"{base}/properties",
            f"cpu_cores_count 0\nsimd_count 304\ngpu_id {1000 + node}\n"
            f"location_id {location}\ndomain {int(domain, 16)}\nhive_id {hive_id}\n{extra}",
        )
        (self.root / base / "io_links").mkdir(parents=True, exist_ok=True)
        for i, peer in enumerate(xgmi_peers):
            self.write(
                f"{base}/io_links/{i}/properties", f"type 11\nnode_from {node}\nnode_to {peer}\n"
            )
        self.link("class/kfd/kfd", "devices/virtual/kfd/kfd")

    # -- amdgpu --------------------------------------------------------------------------------

    def amdgpu(
        self,
        path: str,
        *,
        unique_id: str | None = None,
        vram_bytes: int | None = None,
        product_name: str | None = None,
        product_number: str | None = None,
        ras: dict[str, str] | None = None,
    ) -> None:
        """The files the amdgpu driver writes into its PCI function's folder (`path`, as `gpu`
        returns it), each left out when None, as the driver leaves it out where the card lacks
        it (Documentation/gpu/amdgpu/driver-misc.rst): `unique_id` (16 hex digits, GFX9 and
        newer), `mem_info_vram_total` (bytes), `product_name` / `product_number` (from the
        board's FRU EEPROM, server cards only), and `ras/<block>_err_count` (ras.rst: lines
        `ue: N`, `ce: N`; UMC adds `de: N`), keyed by block, e.g. {"umc": "ue: 0\\nce: 0\\n"}."""
        for name, value in (
            ("unique_id", unique_id),
            ("mem_info_vram_total", None if vram_bytes is None else str(vram_bytes)),
            ("product_name", product_name),
            ("product_number", product_number),
        ):
            if value is not None:
                self.write(f"{path}/{name}", value + "\n")
        if ras is not None:
            self.write(f"{path}/ras/features", "feature mask: 0x00003fff\n")
            for block, text in ras.items():
                self.write(f"{path}/ras/{block}_err_count", text)
