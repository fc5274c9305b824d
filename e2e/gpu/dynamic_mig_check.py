"""Compare our MIG profile table (kubeletplugin/.../migprofiles.py) with what NVML reports on
a real GPU. Read-only by default: it never changes MIG mode or creates an instance, so it is
safe on a lent machine; NVML lists the profiles and their possible placements with MIG mode
off too. The same NVML calls on an H200 (143771 MiB, driver 580.159.04, MIG mode off) answered
exactly the table's H200 profiles and placements (recorded in tests/nvmlfake/mig.py).

    python -m e2e.gpu.dynamic_mig_check    # exit 0: every GPU the table knows agrees
                                           # 1: a difference (printed); 2: nothing to compare

Each GPU's line then says whether dynamic MIG's create/destroy (the live NVML creator the
agent uses, kubeletplugin/.../mignvml.py) ran. It runs only with `--create-destroy`, only on
a GPU whose MIG mode is already Enabled (MIG mode is never changed here: that needs a GPU reset
and belongs to the machine's owner) and that has no MIG instance at all (nobody's instance is
touched): one instance per profile, at its last placement, each checked (NVML lists it at that
placement with its UUID; the driver shows its capability files and /dev/nvidia-caps nodes,
which prepare hands to the container) and destroyed before the next. With MIG mode Disabled it
prints `create/destroy: not run (MIG mode Disabled ...)`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.kinds.nvidia import migprofiles

Reported = dict[str, set[tuple[int, int]]]  # profile name -> {(start, size)}


def expected(model: migprofiles.Model) -> Reported:
    return {p.name: {(s, p.size) for s in p.starts} for p in model.profiles}


def compare(model: migprofiles.Model, reported: Reported) -> list[str]:
    """The differences between the table and NVML's answer, one line each (none: agree).
    Profiles NVML lists that we do not publish (`+me`, `+gfx`, ...) are ignored."""
    out = []
    want = expected(model)
    for name, placements in sorted(want.items()):
        got = reported.get(name)
        if got is None:
            out.append(f"{name}: in our table, not reported by NVML")
        elif got != placements:
            out.append(f"{name}: table {sorted(placements)}, NVML {sorted(got)}")
    return out


# NVML's GPU instance profile constants -> the index of our table's profile (migprofiles:
# 1g, 1g with two memory slices, 2g, 3g, 4g, 7g). The media-extension (REV1) and other
# variants are not published, so not compared.
_PROFILES = {
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE": 0,
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2": 1,
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE": 2,
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE": 3,
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE": 4,
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE": 5,
}


Found = dict[int, tuple[int, set[tuple[int, int]]]]


def read_nvml() -> list[tuple[str, str, int, Found, bool | None]]:
    """Per GPU: bus id, product name, memory MiB, per table index the profile's compute
    slices and possible placements as NVML reports them (nvmlDeviceGetGpuInstanceProfileInfo,
    nvmlDeviceGetGpuInstancePossiblePlacements: answered with MIG mode on or off; only read),
    and whether MIG mode is Enabled now (None: NVML cannot say)."""
    from ctypes import byref, c_uint

    import pynvml

    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(h))
            bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            found: dict[int, tuple[int, set[tuple[int, int]]]] = {}
            for const, index in _PROFILES.items():
                try:
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, getattr(pynvml, const))
                    places = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
                    count = c_uint(8)
                    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                        h, info.id, places, byref(count)
                    )
                except (pynvml.NVMLError, AttributeError):
                    continue  # not supported on this GPU
                found[index] = (
                    int(info.sliceCount),
                    {(int(places[k].start), int(places[k].size)) for k in range(count.value)},
                )
            try:
                mig: bool | None = bool(pynvml.nvmlDeviceGetMigMode(h)[0])
            except pynvml.NVMLError:
                mig = None
            gpus.append((bus, name, mem, found, mig))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def create_destroy(
    live: Any, bus: str, model: migprofiles.Model, proc_root: Path, dev_root: Path
) -> tuple[list[str], list[str]]:
    """One instance per profile at its last placement, created, checked and destroyed, on a
    GPU with no instance; (what was done, what went wrong)."""
    present = live.instances(bus)
    if present:
        names = ", ".join(f"{i.profile}@{i.start}" for i in present)
        return [f"create/destroy: not run (the GPU has MIG instances, left alone: {names})"], []
    done, wrong = [], []
    for p in model.profiles:
        start = max(p.starts)
        try:
            made = live.create(bus, p.name, start)
        except Exception as e:
            wrong.append(f"{p.name} at {start}: not created: {e}")
            continue
        try:
            listed = [(i.profile, i.start, i.uuid) for i in live.instances(bus)]
            if listed != [(p.name, start, made.uuid)]:
                wrong.append(f"{p.name} at {start}: NVML lists {listed}, made {made}")
            wrong.extend(
                f"{p.name} at {start}: {why}"
                for why in _capabilities(
                    proc_root, dev_root, made.gpu_instance, made.compute_instance
                )
            )
        finally:
            live.destroy(bus, made.gpu_instance)
        if live.instances(bus):
            wrong.append(f"{p.name} at {start}: still listed after destroy")
        done.append(
            f"{p.name} at {start}: created gi{made.gpu_instance}/ci{made.compute_instance} "
            f"{made.uuid}, destroyed"
        )
    return done, wrong


def _capabilities(proc_root: Path, dev_root: Path, gi: int, ci: int) -> list[str]:
    """What prepare needs of a new instance (hostdevices.mig_cap_nodes): the driver's
    capability files and the /dev/nvidia-caps nodes they name."""
    base = proc_root / "driver" / "nvidia" / "capabilities"
    wrong = []
    for rel in (f"mig/gi{gi}/access", f"mig/gi{gi}/ci{ci}/access"):
        files = sorted(base.glob(f"gpu*/{rel}"))
        if not files:
            wrong.append(f"no {base}/gpu*/{rel}")
            continue
        m = re.search(r"^DeviceFileMinor:\s*(\d+)\s*$", files[0].read_text(), re.M)
        node = dev_root / "nvidia-caps" / f"nvidia-cap{m.group(1) if m else '?'}"
        if m is None or not node.exists():
            wrong.append(f"{files[0]} names {node}, which does not exist")
    return wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.gpu.dynamic_mig_check")
    parser.add_argument(
        "--create-destroy",
        action="store_true",
        help="also create and destroy one instance per profile on a GPU whose MIG mode is "
        "already Enabled and that has no MIG instance (never changes MIG mode)",
    )
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"))
    parser.add_argument("--dev-root", type=Path, default=Path("/dev"))
    args = parser.parse_args(argv)
    compared = 0
    differences = 0
    for bus, name, mem, found, mig in read_nvml():
        model = migprofiles.model_for(name, mem)
        if model is None:
            print(f"{bus} {name} ({mem} MiB): not in our table (stays static MIG)")
            continue
        compared += 1
        reported: Reported = {}
        for index, (compute, placements) in found.items():
            profile = model.profiles[index]
            if compute != profile.compute:
                print(f"  {profile.name}: table {profile.compute} compute slices, NVML {compute}")
                differences += 1
            reported[profile.name] = placements
        diff = compare(model, reported)
        differences += len(diff)
        print(f"{bus} {name}: {model.key}: " + ("agrees" if not diff else "DIFFERS"))
        for line in diff:
            print(f"  {line}")
        if not mig:
            state = "Disabled" if mig is False else "unknown"
            print(f"  create/destroy: not run (MIG mode {state}; this check never changes it)")
        elif not args.create_destroy:
            print("  create/destroy: not run (MIG mode Enabled; pass --create-destroy)")
        else:
            from fabricdra.kubeletplugin.kinds.nvidia.mignvml import LiveMigNvml

            done, wrong = create_destroy(LiveMigNvml(), bus, model, args.proc_root, args.dev_root)
            for line in done:
                print(f"  {line}")
            for line in wrong:
                print(f"  FAILED {line}")
            differences += len(wrong)
    if differences:
        return 1
    return 0 if compared else 2


if __name__ == "__main__":
    sys.exit(main())
