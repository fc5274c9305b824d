"""GPU health from NVML readings and from a real DCGM exporter endpoint (an HTTP server in the
test serving dcgm-exporter's text format)."""

from __future__ import annotations

import http.server
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricdra.kubeletplugin.devices import GpuHealth
from fabricdra.kubeletplugin.discovery.nvml import NvmlReadings, SnapshotGpu
from fabricdra.kubeletplugin.health import DcgmState, gpu_health, keep_unhealthy, parse_dcgm
from fabricdra.kubeletplugin.hostdevices import DeviceNodeError, HostLayout

LABELS = 'gpu="{i}",UUID="GPU-{i}",pci_bus_id="00000000:{bus}:00.0",device="nvidia{i}"'


def dcgm_text(
    ecc: dict[str, int], thermal: dict[str, int], xid: dict[str, int] | None = None
) -> str:
    lines = [
        "# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.",
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
    ]
    lines += [
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{LABELS.format(i=i, bus=bus)}}} {v}"
        for i, (bus, v) in enumerate(ecc.items())
    ]
    lines += [
        "# HELP DCGM_FI_DEV_THERMAL_VIOLATION Throttling duration (in us).",
        "# TYPE DCGM_FI_DEV_THERMAL_VIOLATION counter",
    ]
    lines += [
        f"DCGM_FI_DEV_THERMAL_VIOLATION{{{LABELS.format(i=i, bus=bus)}}} {v}"
        for i, (bus, v) in enumerate(thermal.items())
    ]
    lines += ["# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
    lines += [
        f"DCGM_FI_DEV_XID_ERRORS{{{LABELS.format(i=i, bus=bus)}}} {v}"
        for i, (bus, v) in enumerate((xid or {}).items())
    ]
    # a MIG-level series is not the GPU's own
    lines.append(
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",GPU_I_ID="1",pci_bus_id="00000000:1B:00.0"} 9'
    )
    return "\n".join(lines) + "\n"


class Exporter:
    def __init__(self) -> None:
        self.body = ""
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = outer.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        # shutdown() returns at the loop's next poll: its default 0.5 s was each test's teardown.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.close()


def gpu(ecc: int | None, thermal: bool | None, **more: object) -> SnapshotGpu:
    return SnapshotGpu.model_validate(
        {
            "uuid": "GPU-x",
            "name": "H100",
            "memoryTotalMiB": 1,
            "migMode": False,
            "eccUncorrectable": ecc,
            "thermalViolation": thermal,
            **more,
        }
    )


def test_nvml_readings() -> None:
    readings = NvmlReadings(
        source="snapshot",
        available=True,
        gpus={
            "0000:1b:00.0": gpu(0, False),
            "0000:2b:00.0": gpu(3, False),
            "0000:3b:00.0": gpu(0, True),
            "0000:4b:00.0": gpu(None, None),
            "0000:6b:00.0": gpu(0, False, xidErrors=[13, 43]),  # the application's own
            "0000:7b:00.0": gpu(0, False, xidErrors=[13, 79]),  # fell off the bus
            "0000:8b:00.0": gpu(None, None, rowRemapFailure=True),
            "0000:9b:00.0": gpu(0, False, rowRemapFailure=False, rowRemapPending=True),
        },
        errors={"0000:5b:00.0": "NVML: GPU is lost"},
    )
    out = gpu_health(readings, None)
    assert out["0000:1b:00.0"] == GpuHealth(True)
    assert out["0000:2b:00.0"] == GpuHealth(False, "uncorrectable ECC errors: 3", ("ecc",))
    # thermal slowdown is the GPU protecting itself, not a fault
    assert out["0000:3b:00.0"] == GpuHealth(True)
    assert out["0000:4b:00.0"].healthy is None
    # a GPU NVML enumerates but cannot read is a fault: it stays published, tainted
    assert out["0000:5b:00.0"] == GpuHealth(
        False, "NVML cannot read this GPU: NVML: GPU is lost", ("unreadable",)
    )
    assert out["0000:6b:00.0"] == GpuHealth(True)
    assert out["0000:7b:00.0"] == GpuHealth(False, "critical Xid errors: 79", ("xid-79",))
    assert out["0000:8b:00.0"] == GpuHealth(False, "row remapping failed", ("row-remap-failed",))
    assert out["0000:9b:00.0"] == GpuHealth(
        False, "row remapping pending (the GPU needs a reset)", ("row-remap-pending",)
    )
    assert gpu_health(None, None) == {}


def test_link_error_counters_judge_their_growth_between_passes() -> None:
    state = DcgmState()

    def health(pcie: int, nvlink: int) -> GpuHealth:
        g = gpu(0, False, pcieReplayCounter=pcie, nvlinkErrors=nvlink)
        nvml = NvmlReadings(source="snapshot", available=True, gpus={"0000:1b:00.0": g})
        return gpu_health(nvml, None, state=state)["0000:1b:00.0"]

    assert health(5000, 70000) == GpuHealth(True)  # history since boot: not judged
    assert health(5050, 70000) == GpuHealth(True)  # a few corrected replays are normal
    assert health(6000, 70500) == GpuHealth(
        False,
        "PCIe replays: 950 since the previous pass; NVLink errors: 500 since the previous pass",
        ("pcie-errors", "nvlink-errors"),
    )
    assert health(6000, 70500) == GpuHealth(True)


def test_dcgm_exporter_ecc_and_xid(exporter: Exporter) -> None:
    state = DcgmState()
    exporter.body = dcgm_text({"1B": 0, "2B": 2, "3B": 0}, {"1B": 1000}, {"1B": 0, "3B": 48})
    first = gpu_health(None, exporter.url, state=state)
    assert first["0000:1b:00.0"] == GpuHealth(True)
    assert first["0000:2b:00.0"] == GpuHealth(False, "uncorrectable ECC errors: 2", ("ecc",))
    assert first["0000:3b:00.0"] == GpuHealth(False, "critical Xid errors: 48", ("xid-48",))
    # throttling time growing (hot GPU under load) changes nothing
    exporter.body = dcgm_text({"1B": 0, "2B": 2}, {"1B": 5000}, {"1B": 31})
    assert gpu_health(None, exporter.url, state=state)["0000:1b:00.0"] == GpuHealth(True)


def test_a_problem_either_source_sees_counts_and_nvml_covers_the_rest(
    exporter: Exporter,
) -> None:
    gpus = {
        "0000:1b:00.0": gpu(5, False),
        "0000:2b:00.0": gpu(None, None),
        "0000:9b:00.0": gpu(0, False),
    }
    nvml = NvmlReadings(source="snapshot", available=True, gpus=gpus)
    exporter.body = dcgm_text({"1B": 0, "2B": 0}, {})
    out = gpu_health(nvml, exporter.url, state=DcgmState())
    assert out["0000:1b:00.0"] == GpuHealth(False, "uncorrectable ECC errors: 5", ("ecc",))
    assert out["0000:2b:00.0"] == GpuHealth(True)  # DCGM answers where NVML could not
    assert out["0000:9b:00.0"] == GpuHealth(True)  # NVML for the one DCGM does not report
    down = gpu_health(nvml, "http://127.0.0.1:9/metrics", state=DcgmState())
    assert down["0000:1b:00.0"] == GpuHealth(False, "uncorrectable ECC errors: 5", ("ecc",))


def test_parse_dcgm_skips_mig_series() -> None:
    readings = parse_dcgm(dcgm_text({"1B": 1}, {}))
    assert list(readings) == ["0000:1b:00.0"]
    assert readings["0000:1b:00.0"].ecc_uncorrectable == 1


def test_verbs_device_errors_name_the_locations(tmp_path: Path) -> None:
    layout = HostLayout(tmp_path / "dev", tmp_path / "proc", tmp_path / "sys")
    with pytest.raises(DeviceNodeError) as e:
        layout.verbs_device("mlx5_3", None)
    assert f"{tmp_path}/sys/class/infiniband_verbs/*/ibdev" in str(e.value)
    assert f"{tmp_path}/dev/infiniband" in str(e.value)
    (tmp_path / "dev" / "infiniband").mkdir(parents=True)
    (tmp_path / "dev" / "infiniband" / "uverbs3").write_text("a regular file")
    with pytest.raises(DeviceNodeError, match="is not a character device"):
        layout.verbs_device("mlx5_3", "uverbs3")


def test_gpu_minor_from_the_driver_proc_file(tmp_path: Path) -> None:
    layout = HostLayout(tmp_path / "dev", tmp_path / "proc", tmp_path / "sys")
    with pytest.raises(DeviceNodeError, match="file missing"):
        layout.nvidia_minor("0000:1b:00.0")
    info = tmp_path / "proc/driver/nvidia/gpus/0000:1b:00.0/information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: \t H100\nDevice Minor: \t 6\nGPU UUID: \t GPU-x\n")
    assert layout.nvidia_minor("0000:1B:00.0") == 6


def test_amd_gpu_nodes_from_its_drm_folder(tmp_path: Path) -> None:
    layout = HostLayout(tmp_path / "dev", tmp_path / "proc", tmp_path / "sys")
    drm = tmp_path / "sys/bus/pci/devices/0000:c1:00.0/drm"
    with pytest.raises(DeviceNodeError, match=r"no renderD\* entry in .*0000:c1:00.0/drm"):
        layout.amd_gpu_nodes("0000:c1:00.0")
    (drm / "card1").mkdir(parents=True)
    (drm / "renderD129").mkdir()
    (tmp_path / "dev/dri").mkdir(parents=True)
    os.mknod(tmp_path / "dev/kfd", 0o666 | stat.S_IFCHR, os.makedev(235, 0))
    os.mknod(tmp_path / "dev/dri/renderD129", 0o666 | stat.S_IFCHR, os.makedev(226, 129))
    kfd, render = layout.amd_gpu_nodes("0000:C1:00.0")
    assert (kfd.path, kfd.major, kfd.minor) == ("/dev/kfd", 235, 0)
    assert (render.path, render.major, render.minor) == ("/dev/dri/renderD129", 226, 129)
    assert render.host_path == str(tmp_path / "dev/dri/renderD129")


def test_an_unhealthy_gpu_stays_unhealthy_while_it_cannot_be_read() -> None:
    bad = {"0000:1b:00.0": GpuHealth(False, "uncorrectable ECC errors: 2", ("ecc",))}
    unreadable = {"0000:1b:00.0": GpuHealth(None, "NVML: GPU is lost")}
    kept = keep_unhealthy(unreadable, bad)
    assert kept["0000:1b:00.0"].healthy is False
    assert kept["0000:1b:00.0"].reason is not None
    assert kept["0000:1b:00.0"].reason.startswith("uncorrectable ECC errors: 2")
    assert kept["0000:1b:00.0"].causes == ("ecc",)  # the taint keeps saying why
    assert keep_unhealthy({}, bad)["0000:1b:00.0"].healthy is False  # NVML did not load at all
    assert keep_unhealthy(kept, kept) == kept  # the note is not stacked pass after pass
    healed = {"0000:1b:00.0": GpuHealth(True)}
    assert keep_unhealthy(healed, kept) == healed  # only a healthy reading clears it


def test_a_gpu_nvml_does_not_report_is_unhealthy_while_nvml_answers() -> None:
    from fabricdra.api.inventory import Accelerator
    from fabricdra.kubeletplugin.health import nvidia_bound

    accelerators = [
        Accelerator(vendor="nvidia", vendorId="0x10de", pciBusId="0000:1b:00.0", driver="nvidia"),
        Accelerator(vendor="nvidia", vendorId="0x10de", pciBusId="0000:2b:00.0", driver="nvidia"),
        # passed through to a VM: not NVML's to see
        Accelerator(vendor="nvidia", vendorId="0x10de", pciBusId="0000:3b:00.0", driver="vfio-pci"),
    ]
    expected = nvidia_bound(accelerators)
    assert expected == ["0000:1b:00.0", "0000:2b:00.0"]
    one = NvmlReadings(source="library", available=True, gpus={"0000:1b:00.0": gpu(0, False)})
    out = gpu_health(one, None, expected=expected)
    assert out["0000:1b:00.0"] == GpuHealth(True)
    assert out["0000:2b:00.0"].healthy is False  # lost: it stays published, tainted
    assert "NVML does not report this GPU" in (out["0000:2b:00.0"].reason or "")
    assert "0000:3b:00.0" not in out
    # NVML not answering at all is no reading, not a fault of every GPU
    down = NvmlReadings(source="library", available=False, reason="nvmlInit: driver not loaded")
    assert gpu_health(down, None, expected=expected) == {}
