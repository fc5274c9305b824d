"""`fabricdra kubelet-plugin` flags that issue 10 added: EFA endpoints and the claim sweep."""

from __future__ import annotations

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


def test_claim_sweep_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICDRA_CLAIM_SWEEP_INTERVAL", raising=False)
    assert _config().sweep_interval == 600  # type: ignore[attr-defined]
    assert _config("--claim-sweep-interval", "60").sweep_interval == 60  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="--claim-sweep-interval must be positive"):
        _config("--claim-sweep-interval", "0")


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
