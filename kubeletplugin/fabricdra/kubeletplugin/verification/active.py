"""The active probes: NVIDIA's `nvbandwidth`, perftest's `ib_write_bw` loopback and nccl-tests'
`all_reduce_perf`, run together as one POSIX shell script (docs/verification.md, "Active probes").

One script, two places it runs: on the node itself (`LocalExecutor`: `fabricdra verify`, the
harness's stand-ins) or in the verification pod the agent starts from the chart's
`verification.image` (`podrun.PodExecutor`). The script needs only `sh` and coreutils'
`timeout`, so any Debian/Ubuntu-based image (NVIDIA's CUDA images included) can carry the tools.

Lanes run in parallel; the steps of one lane run one after another. Each NIC's loopback is a
lane of its own; the GPU tools share one lane, because `nvbandwidth` and `all_reduce_perf` both
drive the same NVLinks and would measure each other. Every step runs under its own `timeout`
(its process group killed), so a hung tool costs one timeout, not the whole run: the run ends
after the slowest lane. A GPU step that timed out ends its lane (the GPUs did not answer; the
next GPU tool is Skipped). The outputs come back on stdout, each after a marker line
`=== fabricdra-probe <id> rc=<exit status>`, and are parsed here.

Outcomes: a tool that is not installed in the image/on the node is `NotRun` ("is not
installed"); one that exits non-zero, runs past its timeout or prints nothing readable is
`Failed` with its output's tail; a reading below the class's minimum is `Failed`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from fabricdra.api.verification import ClassExpectation, Outcome, ProbeName, ProbeResult

NVBANDWIDTH = "nvbandwidth"
IB_WRITE_BW = "ib_write_bw"
ALL_REDUCE_PERF = "all_reduce_perf"
H2D_TEST = "host_to_device_memcpy_ce"
D2D_TEST = "device_to_device_memcpy_read_ce"
IB_PORT_BASE = 18515  # perftest's default port; each NIC gets its own so runs never collide
# all_reduce_perf at one message size, the figure azurehpc-health-checks holds nodes to
# (check_nccl_allreduce ... 16G): "# Avg bus bandwidth" is then that size's busbw.
NCCL_MESSAGE = "16G"
CONNECT_TRIES = 5  # ib_write_bw client connects: perftest tries once, the server may be late
MARK = "=== fabricdra-probe "
DONE = "=== fabricdra-probes done"
KILL_AFTER = 5  # seconds between timeout's TERM and its KILL
NOT_INSTALLED = 127
SKIP = "skip"


class Executor(Protocol):
    """Runs a probe script where the tools are; returns its stdout (what came back)."""

    def run(self, script: str, timeout: float) -> str: ...


@dataclass(frozen=True)
class Step:
    id: str
    tool: str
    args: tuple[str, ...]
    timeout: float
    loopback: bool = False  # ib_write_bw: a server, then the client against localhost


@dataclass(frozen=True)
class Judge:
    """How one step's output becomes results: the step, and what it is held to."""

    step: Step
    probe: ProbeName
    device: str
    row: ClassExpectation
    want: float | None  # the minimum (GB/s for GPU tools, Gb/s for the NIC loopback)
    gpu_pairs: bool = False  # nvbandwidth also ran the GPU<->GPU test (>= 2 GPUs)
    host_want: float | None = None  # nvbandwidth's host->GPU minimum (GB/s)


@dataclass
class Plan:
    lanes: list[list[Judge]] = field(default_factory=list)

    @property
    def judges(self) -> list[Judge]:
        return [j for lane in self.lanes for j in lane]

    def timeout(self) -> float:
        """The longest a lane may take (its steps' timeouts and kill grace), plus start-up."""
        lanes = [sum(j.step.timeout + KILL_AFTER for j in lane) for lane in self.lanes]
        return max(lanes, default=0.0) + 30.0


def script(plan: Plan, path: str | None = None) -> str:
    """The POSIX shell script that runs `plan`: lanes in parallel, each step under `timeout`,
    outputs printed after the marker lines once every lane is done."""
    out = ["set -u"]
    # The tools are looked up in `path` only (None: the PATH of wherever the script runs).
    if path is not None:
        out.append(f"FABRICDRA_TOOLS={shlex.quote(path)}; export FABRICDRA_TOOLS")
    out.append('d=$(mktemp -d "${TMPDIR:-/tmp}/fabricdra-probes.XXXXXX") || exit 1')
    for lane in plan.lanes:
        body: list[str] = []
        for n, judge in enumerate(lane):
            s = judge.step
            run = (
                f"timeout -k {KILL_AFTER} {s.timeout:g} sh -c {shlex.quote(_step_body(s))} "
                f'"$d/{s.id}" >"$d/{s.id}.out" 2>&1; echo $? >"$d/{s.id}.rc"'
            )
            if n == 0:
                body.append(run)
                continue
            prev = lane[n - 1].step.id
            # A GPU tool that hung ends the lane: the next would meet the same GPUs.
            body.append(
                f'case "$(cat "$d/{prev}.rc")" in 124|137|{SKIP}) echo {SKIP} >"$d/{s.id}.rc" ;; '
                f"*) {run} ;; esac"
            )
        out.append("( " + "\n  ".join(body) + " ) &")
    out.append("wait")
    ids = " ".join(j.step.id for j in plan.judges)
    out.append(
        f"for p in {ids}; do\n"
        f'  echo "{MARK}$p rc=$(cat "$d/$p.rc" 2>/dev/null || echo none)"\n'
        '  cat "$d/$p.out" 2>/dev/null\n'
        "done"
    )
    out.append(f'echo "{DONE}"')
    out.append('rm -rf "$d"')
    return "\n".join(out) + "\n"


def _step_body(s: Step) -> str:
    """What runs under `timeout` (as `sh -c BODY FILE`: $0 is the step's scratch-file stem)."""
    name = shlex.quote(s.tool)
    check = (
        'if [ -n "${FABRICDRA_TOOLS+set}" ]; then\n'
        "  tool=; IFS=:; for dir in $FABRICDRA_TOOLS; do\n"
        f'    [ -n "$dir" ] && [ -x "$dir"/{name} ] && {{ tool="$dir"/{name}; break; }}\n'
        "  done; unset IFS\n"
        f"else tool=$(command -v {name}); fi\n"
        f'[ -n "$tool" ] || '
        f"{{ echo 'fabricdra: {s.tool} is not installed'; exit {NOT_INSTALLED}; }}\n"
    )
    tool = '"$tool"'
    args = " ".join(shlex.quote(a) for a in s.args)
    if not s.loopback:
        return check + f"exec {tool} {args}\n"
    # perftest's client connects once; the server may not be listening yet: retry on a refused
    # connection only (any other failure is the finding).
    return check + (
        f'{tool} {args} >"$0.server" 2>&1 &\n'
        "server=$!\n"
        "n=1\n"
        "while :; do\n"
        f'  {tool} {args} localhost >"$0.client" 2>&1; rc=$?\n'
        '  cat "$0.client"\n'
        '  [ "$rc" -eq 0 ] && break\n'
        f'  [ "$n" -ge {CONNECT_TRIES} ] && break\n'
        "  grep -q -e \"Couldn't connect\" -e 'Unable to init the socket connection' "
        '"$0.client" || break\n'
        "  n=$((n + 1))\n"
        "  sleep 1\n"
        "done\n"
        # A client that failed for good: the server's own words (a missing device...) too.
        '[ "$rc" -eq 0 ] || { kill "$server" 2>/dev/null; echo "server:"; cat "$0.server"; }\n'
        'wait "$server" 2>/dev/null\n'
        'exit "$rc"\n'
    )


@dataclass(frozen=True)
class StepOutput:
    rc: int | None  # None: the step never ran (skipped, or no word of it came back)
    skipped: bool
    output: str


def parse_run(text: str) -> dict[str, StepOutput]:
    """The script's stdout -> each step's exit status and output."""
    found: dict[str, StepOutput] = {}
    current: str | None = None
    rc: str = "none"
    lines: list[str] = []

    def flush() -> None:
        if current is not None:
            code = int(rc) if rc.lstrip("-").isdigit() else None
            found[current] = StepOutput(code, rc == SKIP, "\n".join(lines) + "\n")

    for line in text.splitlines():
        if line.startswith(MARK):
            flush()
            head = line[len(MARK) :].split()
            current = head[0] if head else None
            rc = head[1].removeprefix("rc=") if len(head) > 1 else "none"
            lines = []
        elif line.startswith(DONE):
            flush()
            current = None
        elif current is not None:
            lines.append(line)
    flush()
    return found


class LocalExecutor:
    """Runs the script on this machine (`sh`), in its own session so a run past its time is
    ended with every tool it started."""

    def run(self, script: str, timeout: float) -> str:
        proc = subprocess.Popen(
            ["sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return out or ""


def execute(plan: Plan, executor: Executor, path: str | None) -> list[ProbeResult]:
    """Run `plan` and judge every step (a step with no word back: NotRun, said why)."""
    if not plan.lanes:
        return []
    try:
        text = executor.run(script(plan, path), plan.timeout())
        why_missing = "no output came back from the verification run"
    except Exception as e:  # the pod could not be started, the API is down, ...
        text, why_missing = "", f"the verification run failed: {e}"
    outputs = parse_run(text)
    results: list[ProbeResult] = []
    lanes = {j.step.id: lane for lane in plan.lanes for j in lane}
    for judge in plan.judges:
        got = outputs.get(judge.step.id)
        if got is None or (got.rc is None and not got.skipped):
            results.extend(_all(judge, "NotRun", why_missing))
        elif got.skipped:
            before = [j.step.tool for j in lanes[judge.step.id]]
            results.extend(
                _all(judge, "Skipped", f"not started: {before[0]} ran past its timeout first")
            )
        else:
            results.extend(judge_output(judge, got))
    return results


def _result(
    judge: Judge,
    outcome: Outcome,
    expected: str,
    measured: str | None = None,
    reason: str | None = None,
    probe: ProbeName | None = None,
) -> ProbeResult:
    return ProbeResult(
        probe=probe or judge.probe,
        device=judge.device,
        deviceClass=judge.row.name,
        outcome=outcome,
        measured=measured,
        expected=expected,
        reason=reason,
    )


def expectations(judge: Judge) -> list[tuple[ProbeName, str]]:
    """The probes one step answers, with what each is held to (in words)."""
    if judge.step.tool == NVBANDWIDTH:
        h = judge.host_want
        out: list[tuple[ProbeName, str]] = [
            ("host-bandwidth", f"every host->GPU copy at least {h:g} GB/s" if h else "a reading")
        ]
        if judge.gpu_pairs:
            w = judge.want
            out.append(
                ("gpu-bandwidth", f"every GPU pair at least {w:g} GB/s" if w else "a reading")
            )
        return out
    if judge.step.tool == ALL_REDUCE_PERF:
        w = judge.want
        return [(judge.probe, f"bus bandwidth at least {w:g} GB/s" if w else "a reading")]
    w = judge.want
    return [(judge.probe, f"loopback at least {w:g} Gb/s" if w else "a reading")]


def _all(judge: Judge, outcome: Outcome, reason: str) -> list[ProbeResult]:
    return [_result(judge, outcome, exp, reason=reason, probe=p) for p, exp in expectations(judge)]


def _tail(text: str) -> str:
    return " ".join(text.strip().splitlines()[-3:])[-300:]


def judge_output(judge: Judge, got: StepOutput) -> list[ProbeResult]:
    tool, rc, text = judge.step.tool, got.rc, got.output
    if rc == NOT_INSTALLED and f"fabricdra: {tool} is not installed" in text:
        return _all(judge, "NotRun", f"{tool} is not installed")
    if rc in (124, 137):
        return _all(judge, "Failed", f"{tool} ran past {judge.step.timeout:g} s")
    if tool == NVBANDWIDTH:
        return _nvbandwidth(judge, rc, text)
    if tool == ALL_REDUCE_PERF:
        return _all_reduce(judge, rc, text)
    return _loopback(judge, rc, text)


def _broke(judge: Judge, rc: int | None, text: str, what: str) -> list[ProbeResult]:
    why = f"exit {rc}" if rc else what
    return _all(judge, "Failed", f"{judge.step.tool}: {why}: {_tail(text)}")


def _nvbandwidth(judge: Judge, rc: int | None, text: str) -> list[ProbeResult]:
    matrices = parse_nvbandwidth(text)
    wanted = [H2D_TEST] + ([D2D_TEST] if judge.gpu_pairs else [])
    if rc != 0 or any(not matrices.get(t) for t in wanted):
        return _broke(judge, rc, text, "no bandwidth matrix in its output")
    out: list[ProbeResult] = []
    (probe, expected), *rest = expectations(judge)
    host = matrices[H2D_TEST]
    (_, gpu), weakest = min(host.items(), key=lambda kv: kv[1])
    measured = f"weakest host->GPU{gpu} {weakest:g} GB/s over {len(host)} GPUs"
    h = judge.host_want
    if h is not None and weakest < h:
        slow = sorted(f"GPU{c} {v:g}" for (_, c), v in host.items() if v < h)
        out.append(
            _result(
                judge, "Failed", expected, measured, f"below {h:g} GB/s: {', '.join(slow)}", probe
            )
        )
    else:
        out.append(_result(judge, "Passed", expected, measured, probe=probe))
    if rest:
        ((probe, expected),) = rest
        pairs = matrices[D2D_TEST]
        (src, dst), weakest = min(pairs.items(), key=lambda kv: kv[1])
        measured = f"weakest pair GPU{src}<-GPU{dst} {weakest:g} GB/s over {len(pairs)} pairs"
        w = judge.want
        if w is not None and weakest < w:
            slow = sorted(f"GPU{a}<-GPU{b} {v:g}" for (a, b), v in pairs.items() if v < w)
            reason = f"below {w:g} GB/s: {', '.join(slow)}"
            out.append(_result(judge, "Failed", expected, measured, reason, probe))
        else:
            out.append(_result(judge, "Passed", expected, measured, probe=probe))
    return out


def _all_reduce(judge: Judge, rc: int | None, text: str) -> list[ProbeResult]:
    [(probe, expected)] = expectations(judge)
    busbw = parse_all_reduce(text)
    if rc != 0 or busbw is None:
        return _broke(judge, rc, text, "no '# Avg bus bandwidth' line in its output")
    if re.search(r"Out of bounds values\s*:\s*\d+\s+FAILED", text):
        return [_result(judge, "Failed", expected, f"{busbw:g} GB/s", "wrong results (FAILED)")]
    measured = f"{busbw:g} GB/s bus bandwidth at {NCCL_MESSAGE}B"
    w = judge.want
    if w is not None and busbw < w:
        return [_result(judge, "Failed", expected, measured, f"below {w:g} GB/s", probe)]
    return [_result(judge, "Passed", expected, measured, probe=probe)]


def _loopback(judge: Judge, rc: int | None, text: str) -> list[ProbeResult]:
    [(probe, expected)] = expectations(judge)
    gbps = parse_ib_write_bw(text)
    if rc != 0 or gbps is None:
        return _broke(judge, rc, text, "no result line in its output")
    measured = f"{gbps:g} Gb/s"
    w = judge.want
    if w is not None and gbps < w:
        return [_result(judge, "Failed", expected, measured, f"below {w:g} Gb/s", probe)]
    return [_result(judge, "Passed", expected, measured, probe=probe)]


# --- the tools' output formats ------------------------------------------------------------


def parse_nvbandwidth(output: str) -> dict[str, dict[tuple[int, int], float]]:
    """nvbandwidth's output -> {testcase: {(row, column): GB/s}}. Each testcase starts with
    `Running <name>.`, then a title line, a header row of column indexes and `<row> <value|N/A>
    ...` rows (NVIDIA/nvbandwidth README); N/A cells (the diagonal) are left out."""
    found: dict[str, dict[tuple[int, int], float]] = {}
    test = ""
    lines: list[str] = []
    for line in output.splitlines():
        m = re.match(r"\s*Running (\S+?)\.?\s*$", line)
        if m:
            if lines:
                found[test] = parse_nvbandwidth_matrix("\n".join(lines))
            test, lines = m.group(1), []
        else:
            lines.append(line)
    if lines:
        found[test] = parse_nvbandwidth_matrix("\n".join(lines))
    return {k: v for k, v in found.items() if v}


def parse_nvbandwidth_matrix(output: str) -> dict[tuple[int, int], float]:
    """One matrix (a header row of column indexes, then `<row> <value|N/A> ...`) ->
    {(row, column): GB/s}."""
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
    `#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]`; the last one."""
    found = None
    for line in output.splitlines():
        m = _IB_RESULT.match(line)
        if m:
            found = float(m.group(4))
    return found


def parse_all_reduce(output: str) -> float | None:
    """nccl-tests' `# Avg bus bandwidth    : 402.1` (GB/s) line."""
    m = re.search(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", output, re.MULTILINE)
    return float(m.group(1)) if m else None


def step_ids(n: int) -> Iterable[str]:
    return (f"p{i}" for i in range(n))
