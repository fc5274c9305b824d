"""Discovery speed on a large node: 8 GPUs, 8 NIC PFs each with 64 RDMA-carrying VFs (520 RDMA
endpoints). Prints the median wall time of a full pass, of a second pass over the unchanged
tree (with the first pass as `previous`), and of deciding "unchanged".

    python -m bench.discovery [--rounds N]

Goals on a 2-core machine: full pass < 200 ms, decision < 5 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from fabricdra.kubeletplugin.discovery.node import Previous, discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sys"
        hgx = hgx_h100(SysfsBuilder(root), vf_nics=tuple(range(8)), vfs_per_nic=64)
        snap = Path(tmp) / "nvml.json"
        snap.write_text(json.dumps(h100_snapshot(hgx.gpus)))
        readings = load_snapshot(snap)

        def source() -> object:
            return readings

        full, second, decide = [], [], []
        endpoints = 0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            first = discover(SysfsTree(root), nvml_source=lambda: readings)
            t1 = time.perf_counter()
            again = discover(
                SysfsTree(root),
                nvml_source=lambda: readings,
                previous=Previous(first.interfaces, first.accelerators),
            )
            t2 = time.perf_counter()
            unchanged = again.record_equals(first)
            t3 = time.perf_counter()
            if not unchanged:
                raise SystemExit("an unchanged tree must compare equal; it did not")
            full.append(t1 - t0)
            second.append(t2 - t1)
            decide.append(t3 - t2)
            endpoints = sum(1 for i in first.interfaces or [] for e in i.endpoints() if e.rdma)

    ms = lambda xs: f"{statistics.median(xs) * 1000:.1f} ms"  # noqa: E731
    print(f"node: {len(hgx.gpus)} GPUs, {endpoints} RDMA endpoints, {args.rounds} rounds")
    print(f"full pass (median):            {ms(full)}")
    print(f"second pass, unchanged (median): {ms(second)}")
    print(f"decide unchanged (median):     {statistics.median(decide) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
