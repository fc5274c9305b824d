"""NVML calls that fill a caller's structure must pass it by reference.

pynvml hands such an argument to the C function as it is (`fn(device, info)`, no argtypes), so a
ctypes Structure passed by value reaches NVML as bytes where it reads a pointer. On a real H200
(driver 580.159.04) `fabricdra nvml-snapshot` died of it with a segmentation fault in
`nvmlDeviceGetGpuFabricInfo` (docs/gpu-checks.md): the recorded snapshots the rest of the suite
uses never call NVML, so only a real C function can show it. This test builds one with NVML's
signature (`nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t, nvmlGpuFabricInfo_t *)`),
calls it exactly as pynvml does, and runs the read in a child process, since the fault kills the
process that has it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# What the stand-in writes through the pointer NVML is given: a registered GPU of clique 7.
STAND_IN = r"""
#include <string.h>
typedef struct {
    unsigned char clusterUuid[16];
    unsigned int status;
    unsigned int cliqueId;
    unsigned char state; /* nvmlGpuFabricState_t */
} nvmlGpuFabricInfo_t;

int nvmlDeviceGetGpuFabricInfo(void *device, nvmlGpuFabricInfo_t *info) {
    memset(info->clusterUuid, 0xab, 16);
    info->status = 0;    /* NVML_SUCCESS */
    info->cliqueId = 7;
    info->state = 3;     /* NVML_GPU_FABRIC_STATE_COMPLETED */
    return 0;
}
"""

CHILD = """
import ctypes, sys, types
import pynvml
from fabricdra.kubeletplugin.discovery.nvml import _read_fabric

lib = ctypes.CDLL(sys.argv[1])

def get_fabric_info(device, info):  # pynvml's own body: the argument goes to C as it is
    ret = lib.nvmlDeviceGetGpuFabricInfo(device, info)
    pynvml._nvmlCheckReturn(ret)
    return pynvml.NVML_SUCCESS

nvml = types.SimpleNamespace(
    c_nvmlGpuFabricInfo_t=pynvml.c_nvmlGpuFabricInfo_t,
    nvmlDeviceGetGpuFabricInfo=get_fabric_info,
    NVMLError_NotSupported=pynvml.NVMLError_NotSupported,
    NVMLError_FunctionNotFound=pynvml.NVMLError_FunctionNotFound,
)
print(_read_fabric(nvml, ctypes.c_void_p(0x1000)))
"""


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (cc) is needed to build the NVML stand-in"
    folder = tmp_path_factory.mktemp("nvml")
    (folder / "nvml.c").write_text(STAND_IN)
    lib = folder / "libnvml-stand-in.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(folder / "nvml.c")], check=True)
    return lib


def test_the_fabric_info_structure_reaches_nvml_by_reference(stand_in: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(stand_in)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert "'cliqueId': 7" in done.stdout, done.stdout
    assert "'state': 'completed'" in done.stdout, done.stdout
    assert "abababab" in done.stdout, done.stdout
