"""What one IMEX daemon pod costs: CPU and memory of `fabricdra imex-daemon` (the real CLI, as
the DaemonSet runs it) against a real kube-apiserver (started here, stopped at exit), with
the stand-in IMEX executables of tests/imex. Prints, as JSON:

- startup: spawn -> the readiness file exists (IMEX answered READY): seconds, the wrapper's
  CPU seconds and its peak RSS (VmHWM) by then;
- steady: over `--steady` seconds with nothing changing (a health pass every `--interval`
  seconds and the report heartbeat): the wrapper's CPU in millicores, its RSS, and the CPU of
  the `nvidia-imex-ctl` it runs each pass (the stand-in is a Python script: the real tool, a
  small C program, costs less);
- peers: `--peers - 1` peers join one by one (each a status change the daemon watches and
  turns into a hosts-file rewrite + SIGUSR1), then every one changes its IP at once: CPU
  seconds and average millicores of the phase, the wrapper's peak RSS at its end;
- probe: CPU of one readiness probe (`test -e /imexd/ready`, as the DaemonSet's probe);
- imex_standin_rss_mib: the stand-in IMEX process (not NVIDIA's: not measurable here).

    python -m bench.imexdaemon [--steady 60] [--peers 18] [--interval 2]

The stand-in binds IMEX's command port 50005 on 127.0.0.1 (the CLI has no flag for it, as
in the pod): the run refuses to start when that port is taken.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import ControlPlane
from fabricdra.kube.rest import COMPUTE_DOMAINS, Rest
from fabricdra.kubeletplugin.computedomain.imex import peer_name
from tests.integration.computedomain_helpers import domain_body, install_crd

STAND_INS = Path(__file__).resolve().parents[1] / "tests" / "imex"
TICK = os.sysconf("SC_CLK_TCK")
NODE, FABRIC = "gb300-00", "rack-1"


class Proc:
    """/proc figures of one process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def cpu(self) -> tuple[float, float]:
        """(own CPU seconds, reaped children's CPU seconds)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        return (utime + stime) / TICK, (cutime + cstime) / TICK

    def kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def children(self) -> list[int]:
        out = []
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            out += [int(p) for p in (task / "children").read_text().split()]
        return out


def _is_imex(pid: int) -> bool:
    """The long-running IMEX stand-in (not an `nvidia-imex-ctl` query in flight)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"/nvidia-imex") for a in argv)


def _until(check: Callable[[], Any], timeout: float = 60.0, step: float = 0.02) -> float:
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(step)
    return time.perf_counter() - start


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def _rows(peers: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {"name": n, "ipAddress": ip, "fabricDomain": FABRIC, "index": i, "ready": False}
        for i, (n, ip) in enumerate(peers.items())
    ]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the stand-in binds it
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run(steady: float, peers: int, interval: float) -> dict[str, Any]:
    if not _port_free(50005):
        raise SystemExit("port 50005 (IMEX's command port) is taken on 127.0.0.1; try later")
    with tempfile.TemporaryDirectory(prefix="fabricdra-bench-") as tmp:
        cp = ControlPlane(Path(tmp) / "cp")
        cp.start()
        try:
            return _measure(cp, Path(tmp), steady, peers, interval)
        finally:
            cp.stop()


def _measure(
    cp: ControlPlane, tmp: Path, steady: float, peers: int, interval: float
) -> dict[str, Any]:
    rest = Rest(cp.api_client())
    install_crd(rest)
    ns, system = "bench", "fabricdra-system"
    cp.create_namespace(ns)
    cp.create_namespace(system)
    created = rest.create(COMPUTE_DOMAINS, domain_body("job"), ns)
    uid = created["metadata"]["uid"]
    members = {NODE: "127.0.0.1"}

    def publish() -> None:
        rest.patch(COMPUTE_DOMAINS, "job", {"status": {"nodes": _rows(members)}}, ns, sub="status")

    publish()
    config, hosts = tmp / "imexd", tmp / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n")
    env = {
        **os.environ,
        "NODE_NAME": NODE,
        "POD_IP": "127.0.0.1",
        "FABRICDRA_DOMAIN_NAME": "job",
        "FABRICDRA_DOMAIN_NAMESPACE": ns,
        "FABRICDRA_DOMAIN_UID": uid,
        "FABRICDRA_REPORT_NAMESPACE": system,
        "FABRICDRA_KUBECONFIG": str(cp.kubeconfig),
        "FABRICDRA_IMEX_CONFIG_DIR": str(config),
        "FABRICDRA_IMEX_BIN": str(STAND_INS / "nvidia-imex"),
        "FABRICDRA_IMEX_CTL": str(STAND_INS / "nvidia-imex-ctl"),
        "FABRICDRA_IMEX_HOSTS_FILE": str(hosts),
        "FABRICDRA_IMEX_INTERVAL": str(interval),
        "FAKE_IMEX_HOSTS_FILE": str(hosts),
    }
    fabricdra = Path(sys.executable).with_name("fabricdra")
    log = (tmp / "daemon.log").open("wb")
    t0 = time.perf_counter()
    daemon = subprocess.Popen(
        [str(fabricdra), "imex-daemon"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    proc = Proc(daemon.pid)
    out: dict[str, Any] = {"interval_s": interval, "peers": peers}
    try:
        ready = config / "ready"
        _until(ready.exists, timeout=60, step=0.005)
        own, kids = proc.cpu()
        out["startup"] = {
            "to_ready_s": round(time.perf_counter() - t0, 2),
            "wrapper_cpu_s": round(own, 2),
            "ctl_cpu_s": round(kids, 2),
            "wrapper_peak_rss_mib": _mib(proc.kib("VmHWM")),
        }

        # Steady state: nothing changes; health passes and heartbeats only.
        time.sleep(2 * interval)  # past the start-up's last writes
        own0, kids0 = proc.cpu()
        start = time.perf_counter()
        time.sleep(steady)
        own1, kids1 = proc.cpu()
        wall = time.perf_counter() - start
        imex = [p for p in proc.children() if _is_imex(p)]
        out["steady"] = {
            "seconds": round(wall, 1),
            "wrapper_millicores": round(1000 * (own1 - own0) / wall, 1),
            "ctl_millicores": round(1000 * (kids1 - kids0) / wall, 1),
            "wrapper_rss_mib": _mib(proc.kib("VmRSS")),
        }
        out["imex_standin_rss_mib"] = [_mib(Proc(p).kib("VmRSS")) for p in imex]

        # Peer changes: joins one at a time, then every IP at once.
        own0, kids0 = proc.cpu()
        start = time.perf_counter()
        for i in range(1, peers):
            members[f"gb300-{i:02d}"] = f"10.1.0.{i}"
            publish()
            _until(lambda i=i: f"\t{peer_name(i)}\n" in hosts.read_text(), timeout=30)
        members.update({n: f"10.2.0.{i}" for i, n in enumerate(members) if n != NODE})
        publish()
        _until(lambda: "10.2.0." in hosts.read_text(), timeout=30)
        own1, kids1 = proc.cpu()
        wall = time.perf_counter() - start
        out["peer_changes"] = {
            "changes": peers,
            "seconds": round(wall, 2),
            "wrapper_cpu_s": round(own1 - own0, 2),
            "wrapper_millicores": round(1000 * (own1 - own0) / wall, 1),
            "ctl_millicores": round(1000 * (kids1 - kids0) / wall, 1),
            "wrapper_peak_rss_mib": _mib(proc.kib("VmHWM")),
        }
        out["probe_cpu_ms"] = _probe_cost(ready)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
    return out


def _probe_cost(ready: Path, runs: int = 200) -> float:
    """CPU milliseconds of one `test -e <ready file>` (what kubelet's exec probe runs; the
    runtime's exec overhead comes on top and is the same for any probe command)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        subprocess.run(["test", "-e", str(ready)], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(1000 * used / runs, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady state")
    parser.add_argument("--peers", type=int, default=18, help="domain size (peers incl. self)")
    parser.add_argument("--interval", type=float, default=2.0, help="the daemon's --interval")
    args = parser.parse_args()
    print(json.dumps(run(args.steady, args.peers, args.interval), indent=2))


if __name__ == "__main__":
    main()
