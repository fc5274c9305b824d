"""Generate the sample node bundled with the package (`fabricdra inventory --sample`).

python -m tests.sysfs.sample_node            rewrite the bundled archive
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path

from fabricdra.kubeletplugin import samples

from .builder import SysfsBuilder
from .nodes import h100_snapshot, hgx_h100

ARCHIVE = Path(samples.__file__).parent / samples.ARCHIVE


def build(into: Path) -> None:
    b = SysfsBuilder(into / samples.SYSFS_DIR)
    hgx = hgx_h100(b, vf_nics=(6, 7), vfs_per_nic=4, broken_nics=(3,))
    snapshot = h100_snapshot(hgx.gpus, mig_gpu=7)
    (into / samples.NVML_SNAPSHOT).write_text(json.dumps(snapshot, indent=2, sort_keys=True) + "\n")
    # Rail-optimised cabling: NIC i to port 1 of rail leaf i. The NIC with the broken link
    # (3) is heard by nobody, so lldpd lists no neighbour for it.
    heard = [i for i in range(len(hgx.netdevs)) if i != 3]
    (into / samples.SAMPLE_LLDPD).write_text(
        json.dumps(lldpcli_json0({hgx.netdevs[i]: rail_leaf(i) for i in heard}), indent=2) + "\n"
    )
    (into / samples.SAMPLE_TOPOLOGY).write_text(sample_topology(hgx.rdma))


def rail_leaf(i: int) -> tuple[str, str, str]:
    """(chassis MAC, system name, port) of rail i's leaf in scalable unit 1."""
    return (f"0c:42:a1:5e:10:{i:02x}", f"leaf-rail{i}-su1", "Ethernet1/1")


def lldpcli_json0(neighbours: dict[str, tuple[str, str, str]]) -> dict[str, object]:
    """What `lldpcli -f json0 show neighbors` prints for these (interface -> leaf) pairs."""
    return {
        "lldp": [
            {
                "interface": [
                    {
                        "name": netdev,
                        "via": "LLDP",
                        "rid": str(k + 1),
                        "age": "0 day, 01:12:09",
                        "chassis": [
                            {
                                "id": [{"type": "mac", "value": mac}],
                                "name": [{"value": name}],
                                "descr": [{"value": "Cumulus Linux version 5.9.1"}],
                            }
                        ],
                        "port": [
                            {
                                "id": [{"type": "ifname", "value": port}],
                                "descr": [{"value": port}],
                                "ttl": [{"value": "120"}],
                            }
                        ],
                    }
                    for k, (netdev, (mac, name, port)) in enumerate(neighbours.items())
                ]
            }
        ]
    }


def sample_topology(rdma: list[str]) -> str:
    lines = [
        "# The sample node's declared scale-out topology (docs/scale-out.md, YAML form).",
        "switches:",
        *[f"  leaf-rail{i}-su1: spine-{i % 2}" for i in range(len(rdma))],
        "nodes:",
        "  node-a:",
        "    nics:",
        *[
            f'      {dev}: {{rail: {i}, switch: leaf-rail{i}-su1, port: "Ethernet1/1", '
            "role: compute}"
            for i, dev in enumerate(rdma)
        ],
    ]
    return "\n".join(lines) + "\n"


def archive_bytes(tree: Path) -> bytes:
    """A deterministic tar.gz of `tree` (sorted, zero mtimes and owners)."""
    buf = io.BytesIO()
    import gzip

    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for path in sorted(tree.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(tree)))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        ARCHIVE.write_bytes(archive_bytes(Path(tmp)))
    print(f"wrote {ARCHIVE}")


if __name__ == "__main__":
    main()
