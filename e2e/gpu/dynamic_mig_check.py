"""Compare our MIG profile table (kubeletplugin/.../migprofiles.py) with what NVML reports on
a real GPU. Read-only: it never changes MIG mode or creates an instance, so it is safe on a
lent machine; NVML lists the profiles and their possible placements with MIG mode off too.
The same NVML calls on an H200 (143771 MiB, driver 580.159.04, MIG mode off) answered exactly
the table's H200 profiles and placements (recorded in tests/nvmlfake/mig.py).

    python -m e2e.gpu.dynamic_mig_check    # exit 0: every MIG-mode GPU the table knows agrees
                                           # 1: a difference (printed); 2: nothing to compare
"""

from __future__ import annotations

import sys

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


def read_nvml() -> list[tuple[str, str, int, dict[int, tuple[int, set[tuple[int, int]]]]]]:
    """Per GPU: bus id, product name, memory MiB, and per table index the profile's compute
    slices and possible placements as NVML reports them (nvmlDeviceGetGpuInstanceProfileInfo,
    nvmlDeviceGetGpuInstancePossiblePlacements: answered with MIG mode on or off; only read)."""
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
            gpus.append((bus, name, mem, found))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def main() -> int:
    compared = 0
    differences = 0
    for bus, name, mem, found in read_nvml():
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
    if differences:
        return 1
    return 0 if compared else 2


if __name__ == "__main__":
    sys.exit(main())
