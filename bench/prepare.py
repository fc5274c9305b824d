"""Prepare latency and plugin memory, against a real API server (etcd + kube-apiserver from
e2e/harness) on the 8-GPU HGX test node (tests/integration/kubelethost.py).

    python -m bench.prepare [--calls 200]

- latency: NodePrepareResources over gRPC on a unix socket, one claim of 8 GPUs + 8 RDMA NICs
  per call, `--calls` distinct claims (each call really writes its CDI spec and checkpoint;
  each claim is unprepared, untimed, before the next: they hold the same exclusive devices),
  measured from the gRPC call to its answer (the spec is on disk before the answer); the
  ResourceClaim GET is timed inside the plugin, so the figure "excl. API read" subtracts it.
  A repeated prepare (same claim, spec unchanged) is reported too.
- where: the CDI folder on tmpfs (/dev/shm here) as /var/run/cdi is on a real node; the
  checkpoint on disk, as /var/lib/kubelet/plugins is.
- a hung read: the same prepares while another claim's API read hangs (that claim's reads go
  to a local socket that never answers, one call after another, each until its read budget
  ends): reads happen outside the driver's lock, so the figure should not move.
- foreign specs: the same prepares with the NVIDIA container toolkit's spec in the CDI folder
  (so GPUs get its ids) next to 50 specs of another driver that a separate process keeps
  rewriting (atomically, one file every 2 ms): the toolkit's spec must not be parsed again.
- memory: resident set size of a real `fabricdra kubelet-plugin` process after start-up
  (first discovery pass done, sockets open).

Goals: p99 < 20 ms excluding the API read; RSS < 80 MiB; the hung read changes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from e2e.harness.controlplane import ControlPlane
from fabricdra.cli import logs
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import HealthBroadcaster, PluginPaths, PluginServer
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.prepare import CDI_KIND, ApiClaimReader, DevicesDriver
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from tests.integration.kubelethost import DRIVER, build_host, create_claim

NODE = "bench-node"


class TimedReader:
    """The real API reader, with the time of each read recorded (reset it before a call: a
    repeated prepare is answered from the checkpoint and reads nothing). Claims named `hung*`
    are read from `hung` instead: a server that never answers."""

    def __init__(self, inner: ApiClaimReader, hung: ApiClaimReader) -> None:
        self.inner = inner
        self.hung = hung
        self.last = 0.0

    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        if name.startswith("hung"):
            return self.hung.read_claim(namespace, name, timeout)
        t0 = time.perf_counter()
        try:
            return self.inner.read_claim(namespace, name, timeout)
        finally:
            self.last = time.perf_counter() - t0


def silent_server() -> tuple[socket.socket, str]:
    """A listening socket nobody accepts from: connections complete, requests go unanswered."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def latency(cp: ControlPlane, base: Path, cdi_dir: Path, calls: int) -> None:
    host = build_host(base / "host", vf_nics=())
    inventory = host.inventory()
    gpus = [d.name for d in inventory if d.type == "gpu"]
    nics = [d.name for d in inventory if d.type == "rdma"]
    assert len(gpus) == 8, gpus
    assert len(nics) == 8, nics
    results = [{"request": "gpus", "device": g, "pool": NODE} for g in gpus] + [
        {"request": "nics", "device": n, "pool": NODE} for n in nics
    ]
    cp.create_namespace("bench")
    from kubernetes import client

    silent, url = silent_server()
    hung_config = client.Configuration()
    hung_config.host = url
    with cp.api_client() as api, client.ApiClient(hung_config) as hung_api:
        uids = [create_claim(api, "bench", f"c{i}", results) for i in range(calls)]
        huids = [create_claim(api, "bench", f"h{i}", results) for i in range(calls)]
        reader = TimedReader(ApiClaimReader(api), ApiClaimReader(hung_api))
        driver = DevicesDriver(
            node_name=NODE,
            inventory=lambda: inventory,
            claims=reader,
            cdi=CdiWriter(cdi_dir, CDI_KIND),
            checkpoint=Checkpoint(base / "state" / "checkpoint.json"),
            host=host.layout,
            families=(NvidiaClaims(ToolkitSpecs(())),),
        )
        paths = PluginPaths.for_driver(DRIVER, registry_dir=base / "reg", plugin_dir=base / "pl")
        total, excl, repeat = [], [], []
        with (
            PluginServer(driver, paths, health=HealthBroadcaster()),
            grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch,
        ):
            stub = v1_grpc.DRAPluginStub(ch)

            def call(i: int, prefix: str = "c", ids: list[str] = uids) -> float:
                req = v1_pb2.NodePrepareResourcesRequest(
                    claims=[v1_pb2.Claim(namespace="bench", name=f"{prefix}{i}", uid=ids[i])]
                )
                reader.last = 0.0
                t0 = time.perf_counter()
                resp = stub.NodePrepareResources(req, timeout=45)
                elapsed = time.perf_counter() - t0
                if resp.claims[ids[i]].error or len(resp.claims[ids[i]].devices) != 16:
                    raise SystemExit(f"prepare failed: {resp}")
                return elapsed

            def release(i: int, prefix: str = "c", ids: list[str] = uids) -> None:
                req = v1_pb2.NodeUnprepareResourcesRequest(
                    claims=[v1_pb2.Claim(namespace="bench", name=f"{prefix}{i}", uid=ids[i])]
                )
                if stub.NodeUnprepareResources(req, timeout=45).claims[ids[i]].error:
                    raise SystemExit(f"unprepare of {prefix}{i} failed")

            call(0)  # warm-up: connection, first imports
            release(0)
            for i in range(calls):
                elapsed = call(i)
                total.append(elapsed)
                excl.append(elapsed - reader.last)
                if i < calls - 1:
                    release(i)
            last = calls - 1
            for _ in range(min(calls, 50)):
                repeat.append(call(last) - reader.last)
            release(last)

            # Another claim's read hangs the whole time: one call after another, each held
            # until its read budget ends.
            stop = threading.Event()
            hung_calls = [0]

            def hang() -> None:
                req = v1_pb2.NodePrepareResourcesRequest(
                    claims=[v1_pb2.Claim(namespace="bench", name="hung", uid="hung-uid")]
                )
                while not stop.is_set():
                    try:
                        stub.NodePrepareResources(req, timeout=45)
                    except grpc.RpcError:  # the server stopped under it: the bench is over
                        return
                    hung_calls[0] += 1

            hanger = threading.Thread(target=hang, daemon=True)
            hanger.start()
            time.sleep(0.5)  # the hung call is in its read
            hung_excl = []
            for i in range(calls):
                elapsed = call(i, "h", huids)
                hung_excl.append(elapsed - reader.last)
                release(i, "h", huids)
            stop.set()
        specs = len(os.listdir(cdi_dir))
        silent.close()
    print(f"prepare, 8 GPUs + 8 NICs, {len(total)} claims ({specs} CDI specs left at the end):")
    print(f"  incl. API read : p50 {pct(total, 0.5):6.2f} ms   p99 {pct(total, 0.99):6.2f} ms")
    print(
        f"  excl. API read : p50 {pct(excl, 0.5):6.2f} ms   p99 {pct(excl, 0.99):6.2f} ms"
        "   (goal p99 < 20 ms)"
    )
    print(
        f"  repeat prepare : p50 {pct(repeat, 0.5):6.2f} ms   p99 {pct(repeat, 0.99):6.2f} ms"
        " (answered from the checkpoint: no API read)"
    )
    print(
        f"  another claim's read hung: p50 {pct(hung_excl, 0.5):6.2f} ms   "
        f"p99 {pct(hung_excl, 0.99):6.2f} ms (excl. API read; goal: as above)"
    )
    reads = [t - e for t, e in zip(total, excl, strict=True)]
    print(f"  API read alone : mean {statistics.mean(reads) * 1000:.2f} ms")


FOREIGN_WRITER = """
import json, os, sys, time
folder, n = sys.argv[1], int(sys.argv[2])
i = 0
while True:
    path = os.path.join(folder, f"other.example.com-net_{i % n}.json")
    doc = {"cdiVersion": "0.6.0", "kind": "other.example.com/net", "devices": [
        {"name": f"net{i}", "containerEdits": {"env": [f"GEN={i}"]}}]}
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)
    i += 1
    time.sleep(0.002)
"""


def toolkit_spec(folder: Path) -> None:
    """An `nvidia-ctk cdi generate` spec for 8 GPUs (index names, `all`, the driver's files)."""
    import yaml

    libs = [
        f"/usr/lib/x86_64-linux-gnu/lib{n}.so.550.54.15"
        for n in (
            "cuda",
            "nvidia-ml",
            "nvidia-ptxjitcompiler",
            "nvidia-nvvm",
            "nvidia-opencl",
            "nvidia-cfg",
            "nvidia-allocator",
            "nvidia-gpucomp",
            "nvidia-egl-core",
            "nvidia-glcore",
            "nvidia-tls",
            "nvidia-glsi",
            "nvidia-fbc",
            "nvidia-rtcore",
            "nvoptix",
            "nvcuvid",
            "nvidia-encode",
            "nvidia-opticalflow",
            "nvidia-pkcs11",
            "nvidia-pkcs11-openssl3",
        )
    ]
    mounts = [
        {"hostPath": p, "containerPath": p, "options": ["ro", "nosuid", "nodev", "bind"]}
        for p in libs
    ]
    devices = [
        {"name": str(i), "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}}
        for i in range(8)
    ]
    devices.append(
        {
            "name": "all",
            "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"} for i in range(8)]},
        }
    )
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/nvidia-cdi-hook",
                    "args": [
                        "nvidia-cdi-hook",
                        "update-ldcache",
                        "--folder",
                        "/usr/lib/x86_64-linux-gnu",
                    ],
                }
            ],
            "mounts": mounts,
        },
    }
    (folder / "nvidia.yaml").write_text(yaml.safe_dump(spec))


def foreign(cp: ControlPlane, base: Path, cdi_dir: Path, calls: int) -> None:
    host = build_host(base / "host3", vf_nics=())
    inventory = host.inventory()
    results = [
        {"request": "gpus" if d.type == "gpu" else "nics", "device": d.name, "pool": NODE}
        for d in inventory
        if d.type in ("gpu", "rdma")
    ]
    assert len(results) == 16, results
    folder = cdi_dir / "shared"  # /var/run/cdi: ours, the toolkit's and another driver's
    folder.mkdir()
    toolkit_spec(folder)
    writer = subprocess.Popen([sys.executable, "-c", FOREIGN_WRITER, str(folder), "50"])
    try:
        with cp.api_client() as api:
            uids = [create_claim(api, "bench", f"f{i}", results) for i in range(calls)]
            reader = TimedReader(ApiClaimReader(api), ApiClaimReader(api))
            driver = DevicesDriver(
                node_name=NODE,
                inventory=lambda: inventory,
                claims=reader,
                cdi=CdiWriter(folder, CDI_KIND),
                checkpoint=Checkpoint(base / "state3" / "checkpoint.json"),
                host=host.layout,
                families=(NvidiaClaims(ToolkitSpecs((folder,))),),
            )
            paths = PluginPaths.for_driver(
                DRIVER, registry_dir=base / "reg3", plugin_dir=base / "pl3"
            )
            excl = []
            with (
                PluginServer(driver, paths, health=HealthBroadcaster()),
                grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch,
            ):
                stub = v1_grpc.DRAPluginStub(ch)
                for i in range(-1, calls):  # -1: warm-up (first parse of the toolkit spec)
                    k = max(i, 0)
                    claim = v1_pb2.Claim(namespace="bench", name=f"f{k}", uid=uids[k])
                    reader.last = 0.0
                    t0 = time.perf_counter()
                    resp = stub.NodePrepareResources(
                        v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=45
                    )
                    elapsed = time.perf_counter() - t0
                    devices = resp.claims[uids[k]].devices
                    if resp.claims[uids[k]].error or not devices[0].cdi_device_ids[0].startswith(
                        "nvidia.com/gpu="
                    ):
                        raise SystemExit(f"prepare failed or without toolkit ids: {resp}")
                    if i >= 0:
                        excl.append(elapsed - reader.last)
                    stub.NodeUnprepareResources(
                        v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45
                    )
    finally:
        writer.terminate()
        writer.wait(timeout=10)
    print(
        f"  toolkit spec + 50 foreign specs being rewritten: p50 {pct(excl, 0.5):6.2f} ms   "
        f"p99 {pct(excl, 0.99):6.2f} ms (excl. API read; goal p99 < 20 ms)"
    )


def rss(cp: ControlPlane, base: Path) -> None:
    host = build_host(base / "host2", vf_nics=())
    cp.create_node(NODE + "-rss")
    reg = base / "reg2"
    argv = [
        sys.executable,
        "-m",
        "fabricdra.cli",
        "kubelet-plugin",
        "--node-name",
        NODE + "-rss",
        "--kubeconfig",
        str(cp.kubeconfig),
        "--sysfs-root",
        str(host.root / "sys"),
        "--nvml-snapshot",
        str(host.nvml_snapshot),
        "--cdi-dir",
        str(base / "cdi2"),
        "--plugin-dir",
        str(base / "pl2"),
        "--registry-dir",
        str(reg),
        "--dev-root",
        str(host.layout.dev_root),
        "--proc-root",
        str(host.layout.proc_root),
        "--toolkit-cdi-dirs",
        "",
        "--metrics-port",
        "0",
    ]
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (reg / "devices.fabricdra.io-reg.sock").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the plugin did not start")
            time.sleep(0.1)
        time.sleep(2)  # let the first pass's publishing settle
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        print(f"plugin RSS after start-up: {kib / 1024:.1f} MiB   (goal < 80 MiB)")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument(
        "--cdi-tmpfs",
        default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="a tmpfs folder to put the CDI folder in (default /dev/shm)",
    )
    args = parser.parse_args()
    logs.configure("info")  # JSON on stderr, as the plugin logs in production
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-prepare-")))
        cdi = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.cdi_tmpfs)))
        cp = stack.enter_context(ControlPlane(tmp / "cp"))
        print(f"CDI folder {cdi}; checkpoint {tmp}/state")
        print(
            "load average before: {:.2f} {:.2f} {:.2f} on {} CPUs".format(
                *os.getloadavg(), os.cpu_count()
            )
        )
        latency(cp, tmp, cdi, args.calls)
        foreign(cp, tmp, cdi, args.calls)
        rss(cp, tmp)


if __name__ == "__main__":
    main()
