"""Start-up cost of `fabricdra inventory` as a whole process, beside a stdlib reference.

    python -m bench.startup [--rounds N]

Each round runs, one after the other (so load changes hit all of them alike), whole processes
with this interpreter (sys.executable, site-packages and all, as the installed command runs):

- `fabricdra inventory --sample`: unpack the bundled sample node (a DGX/HGX H100: 8 GPUs,
  RDMA NICs, VFs) into a temporary directory, discover it, print the JSON document;
- the reference for it: `python -c` a minimal stdlib program that unpacks the same archive
  the same way (tarfile, data filter, a TemporaryDirectory) and walks the same tree — every
  PCI function (vendor, device, class, numa_node, driver link, resolved path), every network
  interface (address, operstate, speed, mtu, device link) and every RDMA device's ports
  (state, rate, link_layer, first GID) — and prints them as JSON. It has none of the driver's
  rules (classes, health, topology, labels): it is the floor any Python tool pays to read
  that tree, interpreter start-up included;
- the same pair on the tree unpacked once beforehand (`--sysfs-root` and `--nvml-snapshot`
  against the walk alone), which leaves out the unpacking both pay;
- `python -c pass` and `python -c "import fabricdra.cli"`: interpreter start-up, and what
  importing the command costs before any subcommand runs.

The children run with PYTHONDONTWRITEBYTECODE unset, so the warm-up round leaves .pyc files
as an installed package has them: with it set (as in some shells and CI jobs), every changed
module of a source checkout was compiled again in every round (~90 ms of a ~600 ms run).

Both `--sample` runs unpack into $TMPDIR, which the bench points at a tmpfs (/dev/shm, or
`--tmpdir`): on a shared VM's busy disk, writing and deleting ~1,100 files took 1.4-1.9 s and
varied by more than everything else measured together.

Prints the medians, wall-clock and CPU time (user + system, from wait4: what the process used,
without its waits for a core on a busy machine), the ratios command / reference for both, and
the load average. Goal: `inventory --sample` at most 1.5x its reference (wall clock).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import resources
from pathlib import Path

# The stdlib walk, shared by both references: argv[1] is the sysfs root.
WALK = r"""
import json, os, sys

def rd(p):
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError:
        return None

def link(p):
    try:
        return os.path.basename(os.readlink(p))
    except OSError:
        return None

def walk(root):
    out = {"pci": [], "net": [], "infiniband": []}
    pci = os.path.join(root, "bus/pci/devices")
    for name in sorted(os.listdir(pci)):
        d = os.path.join(pci, name)
        out["pci"].append({
            "address": name, "vendor": rd(d + "/vendor"), "device": rd(d + "/device"),
            "class": rd(d + "/class"), "numa": rd(d + "/numa_node"),
            "driver": link(d + "/driver"), "path": os.path.realpath(d),
        })
    net = os.path.join(root, "class/net")
    for name in sorted(os.listdir(net)):
        d = os.path.join(net, name)
        out["net"].append({
            "name": name, "address": rd(d + "/address"), "operstate": rd(d + "/operstate"),
            "speed": rd(d + "/speed"), "mtu": rd(d + "/mtu"),
            "device": os.path.realpath(d + "/device"),
        })
    ib = os.path.join(root, "class/infiniband")
    for name in sorted(os.listdir(ib) if os.path.isdir(ib) else []):
        ports = os.path.join(ib, name, "ports")
        for port in sorted(os.listdir(ports)):
            p = os.path.join(ports, port)
            out["infiniband"].append({
                "device": name, "port": port, "state": rd(p + "/state"),
                "rate": rd(p + "/rate"), "link_layer": rd(p + "/link_layer"),
                "gid0": rd(p + "/gids/0"),
            })
    return out
"""

WALK_TREE = (
    WALK
    + r"""
json.dump(walk(sys.argv[1]), sys.stdout, indent=2)
"""
)

# What `inventory --sample` does before discovery, done the same way (samples/__init__.py).
WALK_SAMPLE = (
    WALK
    + r"""
import tarfile, tempfile
with tempfile.TemporaryDirectory(prefix="reference-sample-") as tmp:
    with tarfile.open(sys.argv[1], mode="r:gz") as tar:
        tar.extractall(tmp, filter="data")
    json.dump(walk(os.path.join(tmp, "sys")), sys.stdout, indent=2)
"""
)


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one whole process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--tmpdir",
        default="/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir(),
        help="where both --sample runs unpack (default: /dev/shm, a tmpfs, when writable)",
    )
    args = parser.parse_args()
    env = {**os.environ, "TMPDIR": args.tmpdir}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure with .pyc files, as installed
    py = sys.executable
    archive = resources.files("fabricdra.kubeletplugin.samples").joinpath("sample-node.tar.gz")
    with tempfile.TemporaryDirectory(prefix="bench-startup-", dir=args.tmpdir) as tmp:
        with archive.open("rb") as f, tarfile.open(fileobj=f, mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")
        root, snapshot = Path(tmp) / "sys", Path(tmp) / "nvml-snapshot.json"
        cli = [py, "-m", "fabricdra.cli", "inventory"]
        runs = {
            "python -c pass": [py, "-c", "pass"],
            "import fabricdra.cli": [py, "-c", "import fabricdra.cli"],
            "fabricdra inventory --sample": [*cli, "--sample"],
            "reference: unpack + walk": [py, "-c", WALK_SAMPLE, str(archive)],
            "fabricdra inventory (unpacked tree)": [
                *cli,
                f"--sysfs-root={root}",
                f"--nvml-snapshot={snapshot}",
            ],
            "reference: walk (unpacked tree)": [py, "-c", WALK_TREE, str(root)],
        }
        for argv in runs.values():  # warm the page cache and .pyc files
            _run(argv, env)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, argv in runs.items():
                times[name].append(_run(argv, env))
    wall = {name: statistics.median(w for w, _ in ts) for name, ts in times.items()}
    cpu = {name: statistics.median(c for _, c in ts) for name, ts in times.items()}
    print(f"{args.rounds} rounds, medians of whole processes ({py}; TMPDIR={args.tmpdir})")
    print(f"  {'':40s} {'wall':>7s}    {'CPU':>7s}")
    for name in runs:
        print(f"  {name:40s} {wall[name] * 1000:7.0f} ms {cpu[name] * 1000:7.0f} ms")
    # Wall time is the goal's measure; CPU time (user + system) leaves out the waits for a
    # core, which on a shared machine move the wall ratios by tens of percent.
    for what, med in (("wall", wall), ("CPU", cpu)):
        sample = med["fabricdra inventory --sample"] / med["reference: unpack + walk"]
        tree = med["fabricdra inventory (unpacked tree)"] / med["reference: walk (unpacked tree)"]
        print(f"{what:4s} inventory --sample / reference:        {sample:.2f}x  (goal <= 1.5x)")
        print(f"{what:4s} inventory on the unpacked tree / walk: {tree:.2f}x")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
