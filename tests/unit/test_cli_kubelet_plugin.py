"""`fabricdra kubelet-plugin` flags that issue 10 added: EFA endpoints and the claim sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricdra.cli import UsageError, build_parser
from fabricdra.cli.kubelet_plugin import build_config
from fabricdra.kubeletplugin.devices import RdmaOverride


def _config(*argv: str) -> object:
    return build_config(build_parser().parse_args(["kubelet-plugin", "--node-name", "n", *argv]))


def test_efa_endpoints_are_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_EFA", raising=False)
    assert _config().devices.efa is False  # type: ignore[attr-defined]
    assert _config("--efa").devices.efa is True  # type: ignore[attr-defined]
    monkeypatch.setenv("FABRICDRA_EFA", "true")
    assert _config().devices.efa is True  # type: ignore[attr-defined]


def test_efa_device_rdma_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_EFA_DEVICE_RDMA", raising=False)
    assert _config("--efa").devices.efa_device_rdma is False  # type: ignore[attr-defined]
    on = _config("--efa", "--efa-device-rdma")
    assert on.devices.efa_device_rdma is True  # type: ignore[attr-defined]
    monkeypatch.setenv("FABRICDRA_EFA_DEVICE_RDMA", "true")
    assert _config("--efa").devices.efa_device_rdma is True  # type: ignore[attr-defined]


def test_claim_sweep_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_CLAIM_SWEEP_INTERVAL", raising=False)
    assert _config().sweep_interval == 600  # type: ignore[attr-defined]
    assert _config("--claim-sweep-interval", "60").sweep_interval == 60  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="--claim-sweep-interval must be positive"):
        _config("--claim-sweep-interval", "0")


def test_the_system_profile_comes_from_a_file_or_inline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FABRICDRA_VERIFY_EXPECT", raising=False)
    monkeypatch.delenv("FABRICDRA_VERIFY_EXPECT_JSON", raising=False)
    assert _config().verify_expect is None  # the built-in profile the DMI model names
    inline = _config("--verify-expect-json", '{"name": "box", "gpus": {"count": 4}}')
    assert inline.verify_expect.name == "box"
    assert inline.verify_expect.gpus.count == 4
    profile = tmp_path / "p.yaml"
    profile.write_text("hcas: {count: 8, rateGbps: 400}\n")
    assert _config("--verify-expect", str(profile)).verify_expect.hcas.rateGbps == 400
    with pytest.raises(UsageError, match="system profile"):
        _config("--verify-expect-json", '{"gpus": {"count": "many"}}')
    with pytest.raises(UsageError, match="exclude each other"):
        _config("--verify-expect", str(profile), "--verify-expect-json", "{}")


def test_rdma_mode_off_overrides_and_vfs(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FABRICDRA_RDMA_MODE", "FABRICDRA_RDMA_OVERRIDES", "FABRICDRA_RDMA_VFS"):
        monkeypatch.delenv(var, raising=False)
    default = _config().devices  # type: ignore[attr-defined]
    assert (default.rdma_mode, default.rdma_overrides, default.rdma_vfs) == ("exclusive", (), True)
    assert _config("--rdma-mode", "off").devices.rdma_mode == "off"  # type: ignore[attr-defined]
    devices = _config(  # type: ignore[attr-defined]
        "--rdma-override",
        "0000:1c:00.0=shared",
        "--rdma-override",
        "ens1f1=off",
        "--rdma-vfs=false",
    ).devices
    assert devices.rdma_overrides == (
        RdmaOverride("0000:1c:00.0", "shared"),
        RdmaOverride("ens1f1", "off"),
    )
    assert devices.rdma_vfs is False
    monkeypatch.setenv("FABRICDRA_RDMA_OVERRIDES", "ens1f0=exclusive,ens1f1=off")
    assert [o.match for o in _config().devices.rdma_overrides] == ["ens1f0", "ens1f1"]  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="rdma override 'ens1f0=sometimes'"):
        _config("--rdma-override", "ens1f0=sometimes")


def test_device_metadata_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_DEVICE_METADATA", raising=False)
    assert _config().device_metadata is False  # type: ignore[attr-defined]
    assert _config("--device-metadata").device_metadata is True  # type: ignore[attr-defined]
    monkeypatch.setenv("FABRICDRA_DEVICE_METADATA", "true")
    assert _config().device_metadata is True  # type: ignore[attr-defined]


def test_nccl_topo_file_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_NCCL_TOPO_FILE", raising=False)
    assert _config().nccl_topo_file is True  # type: ignore[attr-defined]
    assert _config("--nccl-topo-file=false").nccl_topo_file is False  # type: ignore[attr-defined]
    monkeypatch.setenv("FABRICDRA_NCCL_TOPO_FILE", "false")
    assert _config().nccl_topo_file is False  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):  # argparse: "invalid choice: 'maybe'"
        _config("--nccl-topo-file=maybe")


def test_list_type_attributes_are_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_LIST_TYPE_ATTRIBUTES", raising=False)
    assert _config().list_type_attributes is False  # type: ignore[attr-defined]
    assert _config("--list-type-attributes").list_type_attributes is True  # type: ignore[attr-defined]


def test_eviction_on_fatal_faults_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_EVICT_ON_FATAL", raising=False)
    assert _config().evict_on_fatal is False  # type: ignore[attr-defined]
    assert _config("--evict-on-fatal").evict_on_fatal is True  # type: ignore[attr-defined]


def test_dynamic_mig_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 point 2: dynamic MIG stays behind a flag until proven on hardware."""
    monkeypatch.delenv("FABRICDRA_DYNAMIC_MIG", raising=False)
    assert _config().devices.dynamic_mig is False  # type: ignore[attr-defined]
    assert _config("--dynamic-mig").devices.dynamic_mig is True  # type: ignore[attr-defined]
    monkeypatch.setenv("FABRICDRA_DYNAMIC_MIG", "true")
    assert _config().devices.dynamic_mig is True  # type: ignore[attr-defined]


def test_scale_out_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fabricdra.kubeletplugin.discovery.scaleout.annotate import RoleOverride
    from fabricdra.kubeletplugin.scaleoutsources import ScaleOutConfig

    for var in ("FABRICDRA_LLDP", "FABRICDRA_IB_NEIGHBOURS", "FABRICDRA_TOPOLOGY_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("FABRICDRA_NET_ROLES", raising=False)
    assert _config().scale_out == ScaleOutConfig()  # type: ignore[attr-defined]
    got = _config(
        "--lldp",
        "lldpd",
        "--ib-neighbours",
        "off",
        "--topology-file",
        str(tmp_path / "t.conf"),
        "--net-role",
        "mlx5_8=storage",
    ).scale_out  # type: ignore[attr-defined]
    assert got == ScaleOutConfig(
        "lldpd", "off", tmp_path / "t.conf", (RoleOverride("mlx5_8", "storage"),)
    )
    monkeypatch.setenv("FABRICDRA_NET_ROLES", "ens1f0=frontend")
    assert _config().scale_out.roles == (RoleOverride("ens1f0", "frontend"),)  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="role must be one of"):
        _config("--net-role", "mlx5_0=leaf")
