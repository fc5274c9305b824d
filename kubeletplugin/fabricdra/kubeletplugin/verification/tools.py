"""The bandwidth probes: NVIDIA's `nvbandwidth` and perftest's `ib_write_bw` loopback.

They run only when the tool is on the node (looked up on `Tools.path`); an absent tool gives
`NotRun`, never `Passed`. A tool that runs is held to the class's expected minimum; one that
exits non-zero, times out or prints nothing we can read is `Failed` with its output's tail —
a measurement that was attempted and broke is a finding, not a missing reading.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from typing import TYPE_CHECKING

from fabricdra.api.verification import ClassExpectation, Outcome, ProbeName, ProbeResult

if TYPE_CHECKING:
    from .probes import Tools

NVBANDWIDTH = "nvbandwidth"
IB_WRITE_BW = "ib_write_bw"
GPU_TEST = "device_to_device_memcpy_read_ce"
IB_PORT_BASE = 18515  # perftest's default port; each NIC gets its own so runs never collide


def _result(
    probe: ProbeName,
    device: str,
    row: ClassExpectation,
    outcome: Outcome,
    expected: str | None,
    measured: str | None = None,
    reason: str | None = None,
) -> ProbeResult:
    return ProbeResult(
        probe=probe,
        device=device,
        deviceClass=row.name,
        outcome=outcome,
        measured=measured,
        expected=expected,
        reason=reason,
    )


def _tail(text: str) -> str:
    return " ".join(text.strip().splitlines()[-3:])[-300:]


def gpu_bandwidth(
    gpu_count: int, row: ClassExpectation, want: float | None, tools: Tools
) -> ProbeResult:
    expected = f"every GPU pair at least {want:g} GB/s" if want is not None else "a reading"
    if not tools.run_bandwidth:
        return _result("gpu-bandwidth", "node", row, "NotRun", expected, reason="disabled")
    exe = shutil.which(NVBANDWIDTH, path=tools.path)
    if exe is None:
        return _result(
            "gpu-bandwidth",
            "node",
            row,
            "NotRun",
            expected,
            reason=f"{NVBANDWIDTH} is not installed",
        )
    if gpu_count < 2:
        return _result(
            "gpu-bandwidth",
            "node",
            row,
            "NotRun",
            expected,
            reason="one GPU: no GPU pair to measure",
        )
    try:
        done = subprocess.run(
            [exe, "-t", GPU_TEST],
            capture_output=True,
            text=True,
            timeout=tools.timeout_seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _result(
            "gpu-bandwidth",
            "node",
            row,
            "Failed",
            expected,
            reason=f"{NVBANDWIDTH} ran past {tools.timeout_seconds:g} s",
        )
    pairs = parse_nvbandwidth_matrix(done.stdout)
    if done.returncode != 0 or not pairs:
        why = f"exit {done.returncode}" if done.returncode else "no bandwidth matrix in its output"
        return _result(
            "gpu-bandwidth",
            "node",
            row,
            "Failed",
            expected,
            reason=f"{NVBANDWIDTH}: {why}: {_tail(done.stdout + done.stderr)}",
        )
    (src, dst), weakest = min(pairs.items(), key=lambda kv: kv[1])
    measured = f"weakest pair GPU{src}<-GPU{dst} {weakest:g} GB/s over {len(pairs)} pairs"
    if want is not None and weakest < want:
        slow = sorted(f"GPU{a}<-GPU{b} {v:g}" for (a, b), v in pairs.items() if v < want)
        return _result(
            "gpu-bandwidth",
            "node",
            row,
            "Failed",
            expected,
            measured,
            f"below {want:g} GB/s: {', '.join(slow)}",
        )
    return _result("gpu-bandwidth", "node", row, "Passed", expected, measured)


def parse_nvbandwidth_matrix(output: str) -> dict[tuple[int, int], float]:
    """nvbandwidth's matrix (a header row of column indexes, then `<row> <value|N/A> ...`)
    -> {(row, column): GB/s}; the diagonal's N/A is left out."""
    pairs: dict[tuple[int, int], float] = {}
    columns: list[int] | None = None
    for line in output.splitlines():
        cells = line.split()
        if not cells:
            columns = None if pairs else columns
            continue
        if all(c.isdigit() for c in cells):
            columns = [int(c) for c in cells]
            continue
        if columns is None or not cells[0].isdigit() or len(cells) != len(columns) + 1:
            continue
        row = int(cells[0])
        for col, cell in zip(columns, cells[1:], strict=True):
            with contextlib.suppress(ValueError):
                pairs[(row, col)] = float(cell)
    return pairs


_IB_RESULT = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


def parse_ib_write_bw(output: str) -> float | None:
    """The average bandwidth (Gb/s, with --report_gbits) from perftest's result line
    `#bytes #iterations BW peak BW average MsgRate`."""
    for line in output.splitlines():
        m = _IB_RESULT.match(line)
        if m:
            return float(m.group(4))
    return None


def nic_bandwidth(device: str, row: ClassExpectation, tools: Tools, index: int = 0) -> ProbeResult:
    want = row.nicBandwidthGbps
    expected = f"loopback at least {want:g} Gb/s" if want is not None else "a reading"
    if not tools.run_bandwidth:
        return _result("nic-bandwidth", device, row, "NotRun", expected, reason="disabled")
    exe = shutil.which(IB_WRITE_BW, path=tools.path)
    if exe is None:
        return _result(
            "nic-bandwidth",
            device,
            row,
            "NotRun",
            expected,
            reason=f"{IB_WRITE_BW} is not installed",
        )
    args = [exe, "-d", device, "--report_gbits", "-F", "-p", str(IB_PORT_BASE + index)]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        done = subprocess.run(
            [*args, "localhost"],
            capture_output=True,
            text=True,
            timeout=tools.timeout_seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _result(
            "nic-bandwidth",
            device,
            row,
            "Failed",
            expected,
            reason=f"{IB_WRITE_BW} ran past {tools.timeout_seconds:g} s",
        )
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=5)
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()
    gbps = parse_ib_write_bw(done.stdout)
    if done.returncode != 0 or gbps is None:
        why = f"exit {done.returncode}" if done.returncode else "no result line in its output"
        return _result(
            "nic-bandwidth",
            device,
            row,
            "Failed",
            expected,
            reason=f"{IB_WRITE_BW}: {why}: {_tail(done.stdout + done.stderr)}",
        )
    measured = f"{gbps:g} Gb/s"
    if want is not None and gbps < want:
        return _result(
            "nic-bandwidth", device, row, "Failed", expected, measured, f"below {want:g} Gb/s"
        )
    return _result("nic-bandwidth", device, row, "Passed", expected, measured)
