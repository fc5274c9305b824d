"""The one poll helper (e2e/harness/poll.py) that the harness and every test use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from e2e.harness.errors import HarnessError
from e2e.harness.poll import wait_for
from e2e.harness.process import Daemon

ROOT = Path(__file__).resolve().parents[2]


def test_there_is_one_poll_helper() -> None:
    """No test or harness module defines its own poll loop helper beside wait_for."""
    helper = re.compile(r"^\s*def _?(wait_for|wait_until|eventually|poll_until)\(", re.M)
    defined = sorted(
        str(path.relative_to(ROOT))
        for folder in ("tests", "e2e", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if helper.search(path.read_text())
    )
    assert defined == ["e2e/harness/poll.py"]


def test_returns_the_first_truthy_value_polling_through_errors() -> None:
    answers = iter([ValueError("not yet"), None, 0, "here"])

    def check() -> object:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(check, what="an answer", interval=0.01) == "here"


def test_timeout_names_what_and_the_last_error() -> None:
    def check() -> None:
        raise ConnectionRefusedError("no API server")

    with pytest.raises(AssertionError, match=r"waiting for the API; last error: no API server"):
        wait_for(check, timeout=0.2, what="the API", interval=0.05)


def test_a_daemon_that_exits_fails_the_wait_at_once(tmp_path: Path) -> None:
    daemon = Daemon("quitter", ["sh", "-c", "echo bye; exit 3"], tmp_path / "quitter.log")
    daemon.proc.wait()
    # A timeout far beyond the test's: only the daemon's exit can end this wait.
    with pytest.raises(HarnessError, match=r"quitter exited before ready \(exited with 3\)"):
        wait_for(lambda: False, timeout=3600, what="ready", daemon=daemon)
