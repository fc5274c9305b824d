"""Compare our MIG profile table (kubeletplugin/.../migprofiles.py) with what NVML reports on
a real GPU. Read-only: it never changes MIG mode or creates an instance, so it is safe on a
lent machine; a GPU with MIG mode off is reported and skipped (NVML lists placements only in
MIG mode).

    python -m e2e.gpu.dynamic_mig_check    # exit 0: every MIG-mode GPU the table knows agrees
                                           # 1: a difference (printed); 2: nothing to compare
"""

from __future__ import annotations

import re
import sys
from typing import Any

from fabricdra.kubeletplugin import migprofiles

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


def _name(info: Any) -> str | None:
    raw = getattr(info, "name", None)
    if isinstance(raw, bytes):
        raw = raw.decode()
    m = re.search(r"(\d+g\.\d+gb(\+\w+)?)", raw or "")
    return m.group(1) if m else None


def read_nvml() -> list[tuple[str, str, int, Reported | None]]:
    """(bus id, product name, memory MiB, reported placements or None when MIG mode is off)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        gpus: list[tuple[str, str, int, Reported | None]] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            try:
                current, _ = pynvml.nvmlDeviceGetMigMode(h)
            except pynvml.NVMLError:
                current = 0
            if current != 1:
                gpus.append((bus, name, mem, None))
                continue
            reported: Reported = {}
            for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfoV(
                        h, profile, pynvml.nvmlGpuInstanceProfileInfo_v2
                    )
                    places = pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id)
                except pynvml.NVMLError:
                    continue  # a profile this GPU does not support
                pname = _name(info)
                if pname is not None:
                    reported[pname] = {(int(p.start), int(p.size)) for p in places}
            gpus.append((bus, name, mem, reported))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    compared = 0
    differences = 0
    for bus, name, mem, reported in read_nvml():
        model = migprofiles.model_for(name, mem)
        if model is None:
            print(f"{bus} {name} ({mem} MiB): not in our table (stays static MIG)")
            continue
        if reported is None:
            print(f"{bus} {name}: MIG mode off, placements not listed (mode left unchanged)")
            continue
        compared += 1
        diff = compare(model, reported)
        differences += len(diff)
        print(f"{bus} {name}: {model.key}: " + ("agrees" if not diff else "DIFFERS"))
        for line in diff:
            print(f"  {line}")
        for extra in sorted(set(reported) - set(expected(model))):
            print(f"  (not published: {extra} {sorted(reported[extra])})")
    if differences:
        return 1
    return 0 if compared else 2


if __name__ == "__main__":
    sys.exit(main())
