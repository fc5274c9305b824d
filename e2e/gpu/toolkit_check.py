"""The NVIDIA container toolkit's CDI path, end to end without a cluster (issue 32, point 8):
prepare one GPU against the toolkit's spec, resolve the CDI ids prepare answered into a runc
bundle the way a CDI-enabled runtime does, and run a container with them.

    python -m e2e.gpu.toolkit_check --work DIR --toolkit-cdi-dir DIR [--runc PATH]
    python -m e2e.gpu.toolkit_check --work DIR --recorded [--runc PATH]

GPU mode (`--toolkit-cdi-dir`, what e2e/gpu/toolkit_cdi_check.sh runs on a GPU host): this
host's sysfs and live NVML, the spec `nvidia-ctk cdi generate` just wrote, the host's /dev and
/proc; the container runs `nvidia-smi -L` and must list exactly the one GPU prepared, by UUID.

Here-mode (`--recorded`): the tests' HGX sample node (kernel-shaped sysfs, recorded NVML,
mknod'ed device nodes) and the recorded spec `e2e/gpu/recorded/nvidia-cdi.yaml`, whose mounts
are pointed at stand-in files and whose hooks are left out (they run the driver's libraries'
ldconfig); the container lists its GPU device nodes and environment, and must see exactly its
own GPU's node, the toolkit's control nodes and NVIDIA_VISIBLE_DEVICES=void.

Without `--runc` the bundle is written but not run (the verdict says so). Nothing on the host is
changed: specs, bundle and runc state live under `--work`; GPU settings are never touched.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fabricdra.kubeletplugin import kinds
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceInventory, gpu_info
from fabricdra.kubeletplugin.discovery.node import Discovery, discover
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.hostdevices import HostLayout
from fabricdra.kubeletplugin.kinds import accelerator
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import TOOLKIT_KIND, ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import ClaimRef
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.prepare import CDI_KIND, DRIVER_NAME, DevicesDriver

RECORDED = Path(__file__).resolve().parent / "recorded" / "nvidia-cdi.yaml"
NODE = "toolkit-check"
CLAIM_UID = "7c0ffee0-0000-4000-8000-000000000001"
# The NVIDIA driver's majors (Documentation/admin-guide/devices.txt: 195; nvidia-uvm's is
# dynamic, 510 on the sample node) for stand-ins of nodes the sample host lacks.
_STAND_IN_NODES = {"nvidia-modeset": (195, 254), "nvidia-uvm-tools": (510, 1)}


@dataclass
class Host:
    discovery: Discovery
    layout: HostLayout
    dev_root: Path  # where /dev/... of a spec is looked up on this host


@dataclass
class Edits:
    env: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # container path -> node
    mounts: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)


class OneClaim:
    """The API's side: one claim, allocated one GPU of this node."""

    def __init__(self, device: str) -> None:
        self.doc = {
            "metadata": {"namespace": "default", "name": "gpu", "uid": CLAIM_UID},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "driver": DRIVER_NAME,
                                "pool": NODE,
                                "device": device,
                                "request": "gpu",
                            }
                        ]
                    }
                }
            },
        }

    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        return self.doc


def _say(message: str) -> None:
    print(f"[toolkit_check] {message}", file=sys.stderr)


def recorded_host(work: Path) -> tuple[Host, Path]:
    """The sample node and the recorded spec, its mounts pointed at stand-ins, no hooks."""
    build_host = importlib.import_module("tests.integration.kubelethost").build_host
    h = build_host(work / "node")
    mknod = importlib.import_module("tests.integration.kubelethost").mknod
    for name, (major, minor) in _STAND_IN_NODES.items():
        if not (h.layout.dev_root / name).exists():
            mknod(h.layout.dev_root / name, major, minor)
    spec = yaml.safe_load(RECORDED.read_text())
    stand_ins = work / "driver-root"
    edits = spec["containerEdits"]
    for m in edits.get("mounts", []):
        source = stand_ins / m["hostPath"].lstrip("/")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"stand-in for {m['hostPath']}\n")
        m["hostPath"] = str(source)
    _say(f"here-mode: {len(edits.pop('hooks', []))} toolkit hooks left out (they need the driver)")
    folder = work / "toolkit-cdi"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nvidia.yaml").write_text(yaml.safe_dump(spec))
    return Host(h.discovery, h.layout, h.layout.dev_root), folder


def live_host() -> Host:
    from fabricdra.kubeletplugin.discovery.nvml import read_live

    d = discover(SysfsTree("/sys"), read_live)
    return Host(d, HostLayout(), Path("/dev"))


def inventory(host: Host) -> DeviceInventory:
    d = host.discovery
    return build_devices(d.interfaces or [], d.accelerators or [], gpu_info=gpu_info(d.nvml))


def prepare(host: Host, toolkit_dir: Path, work: Path) -> tuple[Any, list[str]]:
    """Prepare the node's first whole NVIDIA GPU; its device and the CDI ids answered."""
    inv = inventory(host)
    gpu = next(
        (d for d in inv if d.type == "gpu" and kinds.kind_of(d).name == "nvidia-gpu"),
        None,
    )
    if gpu is None:
        raise SystemExit("toolkit_check: this node offers no whole NVIDIA GPU")
    driver = DevicesDriver(
        node_name=NODE,
        inventory=lambda: inv,
        claims=OneClaim(gpu.name),
        cdi=CdiWriter(work / "claim-cdi", CDI_KIND),
        checkpoint=Checkpoint(work / "checkpoint.json", boot_id="toolkit-check"),
        host=host.layout,
        families=(NvidiaClaims(ToolkitSpecs((toolkit_dir,))),),
    )
    [prepared] = driver.prepare(ClaimRef(namespace="default", name="gpu", uid=CLAIM_UID))
    return gpu, list(prepared.cdi_device_ids)


def _specs(folders: Sequence[Path]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for path in sorted(folder.iterdir()):
            if path.suffix in (".json", ".yaml", ".yml"):
                spec = yaml.safe_load(path.read_text())  # JSON is YAML
                out[spec["kind"]] = spec
    return out


def resolve(ids: Sequence[str], folders: Sequence[Path], dev_root: Path) -> Edits:
    """The container edits of `ids`, as the CDI library applies them: each spec's own edits
    once, then each device's; device numbers of nodes from the host where a spec gives none."""
    specs = _specs(folders)
    edits = Edits()
    used: list[str] = []
    for cdi_id in ids:
        kind, _, name = cdi_id.partition("=")
        spec = specs.get(kind)
        device = next((d for d in (spec or {}).get("devices", []) if d["name"] == name), None)
        if spec is None or device is None:
            raise SystemExit(f"toolkit_check: CDI device {cdi_id} is in no spec under {folders}")
        if kind not in used:
            used.append(kind)
            _apply(edits, spec.get("containerEdits") or {}, dev_root)
        _apply(edits, device.get("containerEdits") or {}, dev_root)
    return edits


def _apply(edits: Edits, ce: dict[str, Any], dev_root: Path) -> None:
    for e in ce.get("env", []):
        key, _, value = e.partition("=")
        edits.env[key] = value
    for n in ce.get("deviceNodes", []):
        host = Path(n.get("hostPath") or n["path"])
        node = dict(n)
        if "major" not in node:
            st = os.stat(dev_root / host.relative_to("/dev"))
            if not stat.S_ISCHR(st.st_mode):
                raise SystemExit(f"toolkit_check: {host} is not a character device here")
            node.update(type="c", major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
        edits.nodes[n["path"]] = node
    edits.mounts.extend(ce.get("mounts", []))
    edits.hooks.extend(ce.get("hooks", []))


def bundle(work: Path, edits: Edits, args: list[str], libs_from: str | None) -> Path:
    """A runc bundle: a busybox root (plus the C library `libs_from` needs), the edits."""
    root = work / "bundle" / "rootfs"
    if root.exists():
        shutil.rmtree(root)
    for d in ("bin", "dev", "proc", "sys", "tmp", "etc", "usr/bin", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    busybox = shutil.which("busybox")
    if busybox is None:
        raise SystemExit("toolkit_check: no busybox on PATH (apt-get install busybox-static)")
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in ("sh", "ls", "env", "cat", "grep"):
        (root / "bin" / applet).symlink_to("busybox")
    if libs_from:
        _copy_libraries(libs_from, root)
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro", "nosuid"]},
    ]
    for m in edits.mounts:
        options = list(m.get("options", []))
        mounts.append(
            {
                "destination": m["containerPath"],
                "source": m["hostPath"],
                "type": "bind" if {"bind", "rbind"} & set(options) else m.get("type", "bind"),
                "options": options,
            }
        )
    devices = [
        {
            "path": path,
            "type": n.get("type", "c"),
            "major": n["major"],
            "minor": n["minor"],
            "fileMode": 0o666,
            "uid": 0,
            "gid": 0,
        }
        for path, n in sorted(edits.nodes.items())
    ]
    allowed = [{"allow": False, "access": "rwm"}] + [
        {"allow": True, "type": "c", "major": d["major"], "minor": d["minor"], "access": "rwm"}
        for d in devices
    ]
    env = {"PATH": "/usr/bin:/bin", **edits.env}
    hooks: dict[str, list[dict[str, Any]]] = {}
    for h in edits.hooks:
        hooks.setdefault(h["hookName"], []).append(
            {k: h[k] for k in ("path", "args", "env", "timeout") if k in h}
        )
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": "toolkit-check",
        "mounts": mounts,
        "hooks": hooks,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
            "devices": devices,
            "resources": {"devices": allowed},
        },
    }
    path = work / "bundle" / "config.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path.parent


def _copy_libraries(binary: str, root: Path) -> None:
    """The C library and loader a host binary links (nvidia-smi: the toolkit mounts the
    binary and the driver's libraries, never the C library)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        path = next((p for p in parts if p.startswith("/")), None)
        if path is None or "nvidia" in path or "cuda" in path:
            continue
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(path), target)


def run(runc: str, bundle_dir: Path, work: Path) -> tuple[int, str]:
    state = work / "runc-state"
    state.mkdir(exist_ok=True)
    name = f"fabricdra-toolkit-check-{os.getpid()}"
    proc = subprocess.run(
        [runc, "--root", str(state), "run", "--bundle", str(bundle_dir), name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.gpu.toolkit_check")
    p.add_argument("--work", type=Path, required=True)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--toolkit-cdi-dir", type=Path)
    mode.add_argument("--recorded", action="store_true")
    p.add_argument("--runc", help="runc to start the container with; none: bundle only")
    a = p.parse_args(argv)
    work: Path = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if a.recorded:
        host, toolkit_dir = recorded_host(work)
    else:
        host, toolkit_dir = live_host(), a.toolkit_cdi_dir.resolve()
    gpu, ids = prepare(host, toolkit_dir, work)
    uuid = accelerator.payload_of(gpu).accelerator.uuid
    _say(f"prepared {gpu.name} ({uuid}): {' '.join(ids)}")
    result: dict[str, Any] = {"mode": "recorded" if a.recorded else "gpu", "device": gpu.name}
    result["uuid"], result["cdiDeviceIds"] = uuid, ids
    problems = []
    if not ids or not ids[0].startswith(f"{TOOLKIT_KIND}="):
        problems.append(f"prepare did not answer the toolkit's id first: {ids}")
    edits = resolve(ids, [toolkit_dir, work / "claim-cdi"], host.dev_root)
    if a.recorded:
        args = ["sh", "-c", "ls /dev/nvidia* && env | grep ^NVIDIA_ && ls /usr/bin/nvidia-smi"]
        bundle_dir = bundle(work, edits, args, None)
    else:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise SystemExit("toolkit_check: no nvidia-smi on this GPU host's PATH")
        bundle_dir = bundle(work, edits, ["nvidia-smi", "-L"], smi)
    result["bundle"] = str(bundle_dir)
    if a.runc:
        rc, output = run(a.runc, bundle_dir, work)
        result["exit"], result["output"] = rc, output
        print(output, end="")
        problems += _judge(a.recorded, gpu, rc, output)
    else:
        result["exit"] = None
        problems.append("no --runc: the bundle was written, no container ran")
    result["problems"] = problems
    (work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    for problem in problems:
        _say(f"PROBLEM: {problem}")
    _say("ok" if not problems else f"{len(problems)} problem(s); answers in {work}")
    return 0 if not problems else 1


def _judge(recorded: bool, gpu: Any, rc: int, output: str) -> list[str]:
    if rc != 0:
        return [f"the container exited {rc}"]
    lines = output.splitlines()
    if not recorded:
        listed = [line for line in lines if line.startswith("GPU ")]
        uuid = accelerator.payload_of(gpu).accelerator.uuid
        if len(listed) != 1 or uuid is None or uuid not in listed[0]:
            return [f"nvidia-smi -L listed {listed}, want exactly {uuid}"]
        return []
    nodes = sorted(line for line in lines if line.startswith("/dev/nvidia"))
    want = ["/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]
    want = sorted([*want, "/dev/nvidiactl"])
    problems = []
    if nodes != want:
        problems.append(f"the container's GPU nodes are {nodes}, want {want}")
    if "NVIDIA_VISIBLE_DEVICES=void" not in lines:
        problems.append("NVIDIA_VISIBLE_DEVICES=void is not in the container's environment")
    if "/usr/bin/nvidia-smi" not in lines:
        problems.append("the toolkit's mount of /usr/bin/nvidia-smi is not in the container")
    return problems


if __name__ == "__main__":
    sys.exit(main())
