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
