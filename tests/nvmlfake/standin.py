"""Build tests/nvmlfake/libnvml_mig.c into a libnvidia-ml.so.1 for one GPU model, its
placement rules generated from the recorded `nvidia-smi mig -lgip`/`-lgipp` answers in
tests/nvmlfake/mig.py. A process started with LD_LIBRARY_PATH naming its folder loads it
where pynvml loads NVML (`CDLL("libnvidia-ml.so.1")`), so the real pynvml calls it."""

from __future__ import annotations

import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.nvmlfake import mig

SOURCE = Path(__file__).with_name("libnvml_mig.c")

# name, memory (MiB, what NVML reports), profile id -> (name, compute slices), -lgipp output
MODELS = {
    "h100": ("NVIDIA H100 80GB HBM3", 81559, mig.H100_80GB_PROFILES, mig.H100_80GB_LGIPP),
    "h200": ("NVIDIA H200", 143771, mig.H200_141GB_PROFILES, mig.H200_141GB_LGIPP),
}
# NVLink links of the SXM parts, all reported active: 18 fourth-generation links on the H100
# SXM5 ("NVIDIA H100 Tensor Core GPU Architecture" whitepaper, "NVLink": 18 links, 900 GB/s)
# and the H200 SXM (https://www.nvidia.com/en-us/data-center/h200/: NVLink 900 GB/s, the same
# 18 x 50 GB/s), what the verification's nvlink probe expects of both.
NVLINKS = {"h100": 18, "h200": 18}


def header(model: str, bus: str) -> str:
    name, memory, profiles, lgipp = MODELS[model]
    placements = mig.parse_lgipp(lgipp)
    rows = []
    for constant, pid in mig.NVML_GI_PROFILE_IDS.items():
        pname, compute = profiles[pid]
        starts, size = placements[pid]
        padded = ", ".join(str(s) for s in (*starts, *[0] * (8 - len(starts))))
        rows.append(
            f'    {{{constant}, {pid}, {compute}, {size}, {len(starts)}, {{{padded}}}, "{pname}"}},'
        )
    return "\n".join(
        [
            f'#define GPU_NAME "{name}"',
            f"#define GPU_MEMORY_MIB {memory}",
            f'#define GPU_BUS "{bus}"',
            f"#define NVLINKS {NVLINKS[model]}",
            "#define MEMORY_SLICES 8",
            "#define COMPUTE_SLICES 7",
            "struct profile { unsigned int constant, id, slices, size, nstarts, starts[8];",
            "                 const char *name; };",
            "static const struct profile PROFILES[] = {",
            *rows,
            "};",
            "",
        ]
    )


def build(folder: Path, model: str = "h100", bus: str = "00000000:1B:00.0") -> Path:
    """The folder holding the built libnvidia-ml.so.1 (for LD_LIBRARY_PATH)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (cc) is needed to build the NVML stand-in"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "profiles.h").write_text(header(model, bus))
    lib = folder / "libnvidia-ml.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wall", "-I", str(folder), "-o", str(lib), SOURCE],
        check=True,
    )
    return folder


# The stand-in's $FAKE_NVML_STATE file: its `struct gi GIS[MAX_GI]` as written by save() in
# libnvml_mig.c, ten 32-bit fields per GPU instance slot (magic, used, id, profile_id, start,
# size, slices, ci_used, ci_id, ci_profile_id), native byte order.
_GI = struct.Struct("=iiIIIIIiII")
_MAX_GI = 8
_GI_MAGIC = 0x47494E53
# Compute instance profile constant of the one compute instance filling N compute slices
# (NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE, nvml.h).
_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


@dataclass(frozen=True)
class GpuInstance:
    """A GPU instance as the stand-in holds it (what `nvidia-smi mig -lgi` would list)."""

    id: int
    profile: str
    start: int
    compute_instance: int | None  # its compute instance's id; None: none made


def seed(state: Path, model: str, instances: list[tuple[str, int]]) -> None:
    """Write `instances` ((profile name, placement start), each with its one compute instance
    filling it) to a stand-in state file, as an administrator's `nvidia-smi mig -cgi <profile>
    -C` before the agent starts would leave the GPU: GPU instance ids 1, 2, ... in order. The
    placements are not checked here: give ones the GPU accepts."""
    _, _, profiles, lgipp = MODELS[model]
    placements = mig.parse_lgipp(lgipp)
    ids = {name: pid for pid, (name, _) in profiles.items()}
    blob = b""
    for n, (name, start) in enumerate(instances, start=1):
        pid = ids[name]
        compute = profiles[pid][1]
        size = placements[pid][1]
        blob += _GI.pack(_GI_MAGIC, 1, n, pid, start, size, compute, 1, 0, _CI_PROFILE[compute])
    blob += bytes(_GI.size * (_MAX_GI - len(instances)))
    state.write_bytes(blob)


def instances(state: Path, model: str) -> list[GpuInstance]:
    """The GPU instances a stand-in state file holds, by id (empty: no file)."""
    if not state.exists():
        return []
    names = {pid: name for pid, (name, _) in MODELS[model][2].items()}
    data = state.read_bytes()
    out = []
    for k in range(_MAX_GI):
        f = _GI.unpack_from(data, k * _GI.size)
        if f[1]:
            out.append(GpuInstance(f[2], names[f[3]], f[4], f[8] if f[7] else None))
    return sorted(out, key=lambda g: g.id)
