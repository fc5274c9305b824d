"""Start-up cost of `fabricdra inventory` (issue 21 point 7): the inventory path reads, judges
and prints the node without importing pydantic (its import and model building were ~60 % of
the process), and its JSON document is byte for byte what it was when the records were
pydantic models (tests/golden/inventory-sample.json: a run of the bundled sample node made
with the pydantic records, commit c82aeed)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

from fabricdra.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "inventory-sample.json"
# The sample's one broken NIC: a Failed link carries the time its failure was first seen.
SINCE = re.compile(r'"since": "(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"')


def _fabricdra(*args: str) -> str:
    """The command's stdout, from its entry point called here (`python -m fabricdra.cli` runs
    the same `main`; the import tests below run real processes)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return out.getvalue()


def test_sample_with_slices_and_previous_equals_the_golden_run() -> None:
    """The golden file is its own `--previous`: the failed link keeps its recorded first-seen
    time, so the whole document (records, labels, ResourceSlices) is deterministic and the
    time is parsed back and printed again."""
    out = _fabricdra("inventory", "--sample", "--node-name", "node-a", "--previous", str(GOLDEN))
    assert out == GOLDEN.read_text()


def test_sample_without_previous_differs_from_the_golden_run_only_in_the_failure_time() -> None:
    out = _fabricdra("inventory", "--sample")
    golden = json.loads(GOLDEN.read_text())
    del golden["resourceSlices"]
    times = SINCE.findall(out)
    assert len(times) == 1  # one Failed link, its time printed as pydantic printed it
    expected = json.dumps(golden, indent=2) + "\n"
    assert SINCE.sub(f'"since": "{times[0]}"', expected) == out


def test_the_inventory_process_imports_neither_pydantic_nor_platform() -> None:
    probe = (
        "import contextlib, io, json, sys\n"
        "from fabricdra.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['inventory', '--sample'])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    modules = set(json.loads(out.splitlines()[-1]))
    assert "fabricdra.kubeletplugin.discovery.node" in modules  # it did run
    # pydantic (and pydantic_core) and platform (~10 regexes compiled at import) are the start-up
    # costs this path has shed; they must not come back through some import.
    shed = ("pydantic", "pydantic_core", "platform")
    assert sorted(m for m in modules if m.split(".")[0] in shed) == []


# What `fabricdra inventory` on a node's tree (bench/startup.py's second figure) must not import:
# the heavy libraries of the other subcommands, and what only `--sample`'s unpacking needs.
NOT_ON_THE_INVENTORY_PATH = (
    "pydantic",
    "pydantic_core",
    "platform",
    "kubernetes",
    "grpc",
    "google",  # protobuf
    "structlog",  # and through it asyncio: imported only once a line is logged
    "asyncio",
    "yaml",
    "cryptography",
    "prometheus_client",
    "tarfile",  # --sample's archive
    "zipfile",
    "tempfile",
    "importlib.resources",
    # Standard library this path no longer needs (issue 31 point 8), each a few % of its CPU:
    "hashlib",  # (OpenSSL) only to hash an over-long switch id into a label value
    "socket",  # os.uname().nodename is the host name
    "subprocess",  # only the agent runs lldpcli
    "signal",  # only the long-running subcommands stop on signals
    "threading",
    "pathlib",  # and with it urllib.parse and ipaddress
    "urllib",
    "ipaddress",
)


def test_inventory_of_a_node_imports_none_of_the_heavy_or_sample_only_modules(
    tmp_path: Path,
) -> None:
    from fabricdra.kubeletplugin.samples import sample_node

    probe = (
        "import contextlib, io, json, sys\n"
        "from fabricdra.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['inventory', '--sysfs-root', sys.argv[1], '--nvml-snapshot', sys.argv[2]])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    with sample_node() as (root, snapshot):
        out = subprocess.run(
            [sys.executable, "-c", probe, str(root), str(snapshot)],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout
    modules = set(json.loads(out.splitlines()[-1]))
    assert "fabricdra.kubeletplugin.discovery.node" in modules  # it did run
    found = sorted(
        m
        for m in modules
        for shed in NOT_ON_THE_INVENTORY_PATH
        if m == shed or m.startswith(shed + ".")
    )
    assert found == []
