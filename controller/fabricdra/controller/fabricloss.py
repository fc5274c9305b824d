"""The measured loss (issue 28 point 7; seed 004: "Before you set a locality policy, measure
that loss: run the same step on an in-domain placement and on a split one").

Under `--fabric-check-loss`, once a fabric domain's multi-node NVLink check passed
(fabriccheck.py), the check runs NVIDIA's nccl-tests `all_reduce_perf` twice with the same
arguments (fabriccheckrun.KubeRunner.all_reduce): on two trays of the domain inside one IMEX
domain (NVLink between the trays), and on one of those trays and an idle, checked tray of
another NVLink domain (the check's ComputeDomain then spans two cliques, each its own IMEX
domain: the traffic between the trays crosses the NICs), preferring one under the same tier-1
switch, as docs/scale-out.md's recipe does. Each run's out-of-place `time` and `busbw` at one
message size are kept, with their ratio, on the check's Node records; the controller shows the
newest one taken in a spanning gang's fabric domains in its status (`measuredLoss`).

Pure: the command, nccl-tests' output parsed (github.com/NVIDIA/nccl-tests, src/common.cu: the
`size count type redop root time algbw busbw #wrong` table; doc/PERFORMANCE.md for busbw), the
readings, the split partner and which record a ComputeDomain shows. A run that failed is a
reading with `error` and no figure, never a zero; the ratio needs both figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from fabricdra.api.fabriccheck import LossReading, MeasuredLoss, record_of
from fabricdra.api.jsontypes import JSON

# nccl-tests built with MPI=1 (one rank per process, across nodes), installed beside the
# single-process build the per-node probe runs (deployments/verification/Containerfile.nvidia).
PROGRAM = "all_reduce_perf_mpi"
# 1 GiB: past the sizes where latency dominates, so busbw is the links' (nccl-tests'
# doc/PERFORMANCE.md); one size keeps the run short (two runs after every passed check).
MESSAGE_BYTES = 1 << 30
SOURCE = "fabric check"


def command(message_bytes: int = MESSAGE_BYTES) -> list[str]:
    """One rank per GPU (`-g 1`; mpirun starts the ranks), one size, results checked (`-c 1`:
    wrong results fail the reading)."""
    size = str(message_bytes)
    return [PROGRAM, "-b", size, "-e", size, "-f", "2", "-g", "1", "-w", "10", "-n", "50",
            "-c", "1"]  # fmt: skip


@dataclass(frozen=True)
class Row:
    size: int  # bytes
    time_us: float  # out-of-place
    busbw: float  # out-of-place, GB/s
    wrong: int | None  # out-of-place #wrong; None: not checked (`N/A`)


def rows(output: str) -> list[Row]:
    """The out-of-place columns of every size row of all_reduce_perf's table."""
    out = []
    for line in output.splitlines():
        cells = line.split()
        if len(cells) < 9 or line.lstrip().startswith("#") or not cells[0].isdigit():
            continue
        try:
            wrong = None if cells[8] == "N/A" else int(cells[8])
            out.append(Row(int(cells[0]), float(cells[5]), float(cells[7]), wrong))
        except ValueError:
            continue  # not a table row (an MPI or NCCL message that starts with a number)
    return out


def reading(
    output: str, nodes: Sequence[str], fabrics: Sequence[str], message_bytes: int = MESSAGE_BYTES
) -> LossReading:
    """The run's figures at `message_bytes`, or why there are none."""
    found = [r for r in rows(output) if r.size == message_bytes]
    if not found:
        tail = " | ".join(output.strip().splitlines()[-3:])[-300:]
        return failed(nodes, fabrics, f"{PROGRAM} printed no row for {message_bytes} B: {tail}")
    row = found[-1]
    if row.wrong:
        return failed(nodes, fabrics, f"{PROGRAM} reported {row.wrong} wrong results")
    if row.time_us <= 0 or row.busbw <= 0:
        return failed(
            nodes, fabrics, f"{PROGRAM} printed time {row.time_us:g} us, busbw {row.busbw:g}"
        )
    return LossReading(
        nodes=list(nodes),
        fabricDomains=list(fabrics),
        messageBytes=message_bytes,
        busBwGBps=row.busbw,
        stepTimeMs=row.time_us / 1000.0,
    )


def failed(nodes: Sequence[str], fabrics: Sequence[str], why: str) -> LossReading:
    return LossReading(nodes=list(nodes), fabricDomains=list(fabrics), error=why)


def measured(in_domain: LossReading, split: LossReading, at: datetime, fabric: str) -> MeasuredLoss:
    ratio = None
    if in_domain.stepTimeMs and split.stepTimeMs:
        ratio = round(split.stepTimeMs / in_domain.stepTimeMs, 4)
    return MeasuredLoss(
        inDomain=in_domain,
        split=split,
        ratio=ratio,
        measuredAt=at,
        source=f"{SOURCE} of fabric domain {fabric}: nccl-tests {PROGRAM}",
    )


def split_partner(
    first: str, tier1: Mapping[str, str], candidates: Iterable[tuple[str, str]]
) -> str | None:
    """The tray of another NVLink domain to split across: from `candidates` ((node, its fabric
    domain): idle, and covered by a passed check of its own domain), one under `first`'s
    tier-1 switch if any (the shortest scale-out hop, as a spanning gang gets), else the first
    by name. `tier1`: node -> its tier-1 label value ("" unlabelled)."""
    ordered = sorted(candidates)
    if not ordered:
        return None
    mine = tier1.get(first, "")
    near = [n for n, _ in ordered if mine and tier1.get(n, "") == mine]
    return near[0] if near else ordered[0][0]


def for_fabrics(fabrics: Iterable[str], nodes: Iterable[JSON]) -> MeasuredLoss | None:
    """The newest measured loss a check of one of `fabrics` recorded on its nodes (what a
    spanning gang placed in those fabric domains shows), None when there is none."""
    wanted = set(fabrics)
    best: MeasuredLoss | None = None
    for node in nodes:
        record = record_of(node)
        if record is None or record.measuredLoss is None or record.fabric not in wanted:
            continue
        if best is None or record.measuredLoss.measuredAt > best.measuredAt:
            best = record.measuredLoss
    return best
