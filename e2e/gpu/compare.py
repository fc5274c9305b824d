"""What fabricdra says about a GPU host against what `nvidia-smi` says (e2e/gpu/check.sh).

Inputs, all files check.sh wrote: fabricdra's `inventory --node-name` document (accelerators,
and the GPU devices of the ResourceSlices it would publish), the NVML snapshot it read, and
nvidia-smi's answers:

- `smi-query.csv`: `nvidia-smi --query-gpu=index,uuid,pci.bus_id,mig.mode.current,
  driver_version --format=csv,noheader`;
- `smi.txt`: plain `nvidia-smi` (its header carries "CUDA Version: X.Y");
- `smi-topo.txt`: `nvidia-smi topo -m` (the "NUMA Affinity" column);
- `smi-nvlink-<index>.txt`: `nvidia-smi nvlink --status -i <index>` ("Link N: <speed>" or
  "Link N: <inactive>").

Prints one row per fact and GPU (fabricdra, nvidia-smi, ok/DIFFERENT) and returns 1 on any
disagreement. Reads files only.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUERY = "index,uuid,pci.bus_id,mig.mode.current,driver_version"


@dataclass(frozen=True)
class Row:
    gpu: str
    fact: str
    fabricdra: str
    smi: str
    # Set where equal strings are not the test (a fact told in two honest forms); `note` says why.
    same: bool | None = None
    note: str = ""

    @property
    def agrees(self) -> bool:
        return self.fabricdra == self.smi if self.same is None else self.same


def bus_id(text: str) -> str:
    """nvidia-smi prints an 8-digit PCI domain ("00000000:18:00.0"); sysfs and fabricdra use 4."""
    domain, _, rest = text.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else text.strip().lower()


def _na(value: str) -> str:
    value = value.strip()
    return "-" if value in ("", "[N/A]", "N/A") else value


def smi_gpus(query_csv: str) -> dict[str, dict[str, str]]:
    """nvidia-smi's rows by PCI bus id."""
    out = {}
    for row in csv.reader(query_csv.splitlines()):
        if not row or not row[0].strip():
            continue
        index, uuid, bus, mig, driver = (c.strip() for c in row[:5])
        out[bus_id(bus)] = {
            "index": index,
            "uuid": uuid,
            "mig": _na(mig).lower(),
            "driver": _na(driver),
        }
    return out


def smi_cuda(text: str) -> str:
    found = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return found.group(1) if found else "-"


def smi_numa(topo: str) -> dict[str, str]:
    """`nvidia-smi topo -m`: GPU index -> its "NUMA Affinity" cell."""
    lines = [ln for ln in topo.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = [c.strip() for c in lines[0].split("\t")]
    if "NUMA Affinity" not in header:
        return {}
    column = header.index("NUMA Affinity")
    out = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")]
        m = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if m and len(cells) > column:
            out[m.group(1)] = _na(cells[column])
    return out


def smi_nvlinks(text: str) -> str:
    """Active links of `nvidia-smi nvlink --status -i N`, as "active/total"."""
    links = re.findall(r"^\s*Link\s+\d+:\s*(.*)$", text, re.M)
    active = [s for s in links if "inactive" not in s.lower()]
    return f"{len(active)}/{len(links)}"


def _gpu_devices(inventory: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The devices of the ResourceSlices fabricdra would publish, by their GPU's PCI bus id:
    the whole GPU, or (MIG mode on: no whole-GPU device) its first MIG device."""
    out: dict[str, dict[str, Any]] = {}
    for s in inventory.get("resourceSlices", []):
        for d in s["spec"].get("devices", []):
            attrs = d.get("attributes", {})
            kind = attrs.get("type", {}).get("string")
            bus = attrs.get("resource.kubernetes.io/pciBusID", {}).get("string", "").lower()
            if kind == "gpu" or (kind == "mig" and bus not in out):
                out[bus] = attrs
    return out


def _value(attrs: dict[str, Any], name: str) -> str:
    found = attrs.get(name)
    if not found:
        return "-"
    return str(next(iter(found.values())))


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def semver(version: str) -> str:
    """A driver version in the form fabricdra publishes (NVIDIA's DRA driver's semver form:
    no leading zeros), e.g. nvidia-smi's "580.159.04" is "580.159.4"."""
    parts = version.strip().split(".")
    if not all(p.isdigit() for p in parts):
        return version.strip()
    return ".".join(str(int(p)) for p in parts)


def kernel_numa(sysfs: Path, bus: str) -> str | None:
    """The kernel's numa_node of a PCI function ("-1": no NUMA node given), None: unreadable."""
    try:
        return (sysfs / "bus/pci/devices" / bus / "numa_node").read_text().strip()
    except OSError:
        return None


def _numa_row(bus: str, ours: str, smi: str, kernel: str | None) -> Row:
    # The kernel gives no NUMA node (numa_node -1, e.g. a VM without proximity tables):
    # fabricdra publishes none rather than guess; nvidia-smi prints its own default there.
    if ours == "-" and kernel == "-1":
        return Row(bus, "numaNode", ours, smi, True, "the kernel reports none (-1)")
    return Row(bus, "numaNode", ours, smi)


def _major_minor(version: str) -> str:
    parts = version.split(".")
    return ".".join(parts[:2]) if version != "-" else "-"


def compare(
    inventory: dict[str, Any], snapshot: dict[str, Any], smi_dir: Path, sysfs: Path = Path("/sys")
) -> tuple[list[Row], int, int]:
    """The rows, and the GPU counts (fabricdra, nvidia-smi)."""
    ours = {a["pciBusId"].lower(): a for a in inventory.get("accelerators", [])}
    ours = {k: v for k, v in ours.items() if v.get("vendor") == "nvidia"}
    devices = _gpu_devices(inventory)
    theirs = smi_gpus((smi_dir / "smi-query.csv").read_text())
    cuda = smi_cuda((smi_dir / "smi.txt").read_text())
    numa = smi_numa((smi_dir / "smi-topo.txt").read_text())
    rows = [Row("all", "count", str(len(ours)), str(len(theirs)))]
    for bus in sorted(set(ours) | set(theirs)):
        a, t, attrs = ours.get(bus), theirs.get(bus), devices.get(bus, {})
        if a is None or t is None:
            rows.append(Row(bus, "present", str(a is not None), str(t is not None)))
            continue
        index = t["index"]
        nv = snapshot.get(bus, {})
        links = nv.get("nvlinks") or []
        nvlink_file = smi_dir / f"smi-nvlink-{index}.txt"
        rows += [
            Row(bus, "uuid", _text(a.get("uuid")), t["uuid"]),
            Row(bus, "pciBusId", _value(attrs, "resource.kubernetes.io/pciBusID"), bus),
            _numa_row(bus, _text(a.get("numaNode")), numa.get(index, "-"), kernel_numa(sysfs, bus)),
            Row(bus, "migMode", "enabled" if a.get("migMode") else "disabled", t["mig"]),
            Row(
                bus,
                "nvlink",
                f"{sum(1 for link in links if link.get('active'))}/{len(links)}",
                smi_nvlinks(nvlink_file.read_text()) if nvlink_file.exists() else "-",
            ),
            Row(bus, "driverVersion", _value(attrs, "driverVersion"), semver(t["driver"])),
            Row(bus, "cudaVersion", _major_minor(_value(attrs, "cudaDriverVersion")), cuda),
        ]
    return rows, len(ours), len(theirs)


def _print(rows: list[Row]) -> None:
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("gpu", "fact", "fabricdra", "smi")]
    head = ("gpu", "fact", "fabricdra", "nvidia-smi")
    widths = [max(w, len(h)) for w, h in zip(widths, head, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    print(fmt.format(*head, "result"))
    for r in rows:
        result = ("ok" if r.agrees else "DIFFERENT") + (f" ({r.note})" if r.note else "")
        print(fmt.format(r.gpu, r.fact, r.fabricdra, r.smi, result))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--inventory", type=Path, required=True)
    p.add_argument("--snapshot", type=Path, required=True)
    p.add_argument("--smi-dir", type=Path, required=True)
    p.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    args = p.parse_args(argv)
    rows, _, _ = compare(
        json.loads(args.inventory.read_text()),
        json.loads(args.snapshot.read_text()),
        args.smi_dir,
        args.sysfs_root,
    )
    _print(rows)
    different = [r for r in rows if not r.agrees]
    if different:
        print(f"{len(different)} disagreement(s) between fabricdra and nvidia-smi", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
