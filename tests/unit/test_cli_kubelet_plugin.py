"""`fabricdra kubelet-plugin` flags that issue 10 added: EFA endpoints and the claim sweep."""

from __future__ import annotations

import pytest

from fabricdra.cli import UsageError, build_parser
from fabricdra.cli.kubelet_plugin import build_config


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
