"""Build tests/nvmlfake/libnvml_mig.c into a libnvidia-ml.so.1 for one GPU model, its
placement rules generated from the recorded `nvidia-smi mig -lgip`/`-lgipp` answers in
tests/nvmlfake/mig.py. A process started with LD_LIBRARY_PATH naming its folder loads it
where pynvml loads NVML (`CDLL("libnvidia-ml.so.1")`), so the real pynvml calls it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.nvmlfake import mig

SOURCE = Path(__file__).with_name("libnvml_mig.c")

# name, memory (MiB, what NVML reports), profile id -> (name, compute slices), -lgipp output
MODELS = {
    "h100": ("NVIDIA H100 80GB HBM3", 81559, mig.H100_80GB_PROFILES, mig.H100_80GB_LGIPP),
    "h200": ("NVIDIA H200", 143771, mig.H200_141GB_PROFILES, mig.H200_141GB_LGIPP),
}


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
