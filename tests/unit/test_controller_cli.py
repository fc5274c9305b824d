"""`fabricdra controller`'s flag checks that need no API server."""

from __future__ import annotations

import pytest

from fabricdra.cli import build_parser, main


def test_the_default_gang_timeout_is_below_the_schedulers_binding_wait() -> None:
    from fabricdra.cli.controller import SCHEDULER_BINDING_TIMEOUT

    args = build_parser().parse_args(["controller"])
    assert args.gang_timeout_seconds == 300
    assert args.gang_timeout_seconds < SCHEDULER_BINDING_TIMEOUT == 600


@pytest.mark.parametrize("value", ["600", "601", "0", "-1"])
def test_a_gang_timeout_at_or_past_the_binding_wait_is_refused(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before anything is read: no kubeconfig is needed to be refused."""
    code = main(["controller", "--kubeconfig", "/nonexistent", "--gang-timeout-seconds", value])
    assert code == 2
    err = capsys.readouterr().err
    assert "--gang-timeout-seconds must be more than 0 and less than 600" in err


def test_the_fabric_check_is_off_unless_asked_and_takes_its_settings_from_flags_or_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = build_parser().parse_args(["controller"])
    assert args.fabric_check == "false"
    assert (args.fabric_check_image, args.fabric_check_timeout_seconds) == ("", 600)
    assert (args.fabric_check_imex_mode, args.fabric_check_runtime_class) == ("managed", "")
    monkeypatch.setenv("FABRICDRA_FABRIC_CHECK", "true")
    monkeypatch.setenv("FABRICDRA_FABRIC_CHECK_IMAGE", "reg/verify:1")
    args = build_parser().parse_args(
        ["controller", "--fabric-check-imex-mode", "host", "--fabric-check-runtime-class", "nvidia"]
    )
    assert (args.fabric_check, args.fabric_check_image) == ("true", "reg/verify:1")
    assert (args.fabric_check_imex_mode, args.fabric_check_runtime_class) == ("host", "nvidia")


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_fabric_check_timeout_that_is_not_positive_is_refused(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["controller", "--kubeconfig", "/nonexistent", "--fabric-check-timeout-seconds", value]
    )
    assert code == 2
    assert "--fabric-check-timeout-seconds must be positive" in capsys.readouterr().err


def test_racks_are_checked_sixteen_at_a_time_unless_told(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 point 10c: checks of different fabric domains run side by side, bounded."""
    assert build_parser().parse_args(["controller"]).fabric_check_concurrency == 16
    monkeypatch.setenv("FABRICDRA_FABRIC_CHECK_CONCURRENCY", "4")
    assert build_parser().parse_args(["controller"]).fabric_check_concurrency == 4
    code = main(["controller", "--kubeconfig", "/nonexistent", "--fabric-check-concurrency", "0"])
    assert code == 2
    assert "--fabric-check-concurrency must be at least 1, got 0" in capsys.readouterr().err


def test_the_measured_loss_flag_reaches_the_controller_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 28 point 7: --fabric-check-loss (off by default), and its environment variable."""
    assert build_parser().parse_args(["controller"]).fabric_check_loss == "false"
    monkeypatch.setenv("FABRICDRA_FABRIC_CHECK_LOSS", "true")
    assert build_parser().parse_args(["controller"]).fabric_check_loss == "true"
