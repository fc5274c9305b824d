"""The one poll helper of the harness and the tests: `wait_for`.

Timeouts are sized for a loaded 2-core machine (a test run beside builds and other runs):
waiting longer costs nothing when the condition comes true early, and a tight timeout fails
a run that was only slow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from e2e.harness.process import Daemon

DEFAULT_TIMEOUT = 60.0


def wait_for(
    check: Callable[[], Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "condition",
    daemon: Daemon | None = None,
    interval: float = 0.25,
) -> Any:
    """Poll `check` until it returns something truthy, and return that.

    An exception from `check` counts as "not yet" (an API server still starting, an object
    not there yet); the last one is in the failure. Without `daemon`, a timeout is an
    AssertionError (a test's failure). With `daemon`, the daemon exiting fails at once, and
    either failure is the daemon's HarnessError with its log tail.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
        except Exception as e:
            last_error = e
        else:
            if value:
                return value
        if daemon is not None and not daemon.alive():
            raise daemon.failure(f"exited before {what}")
        if time.monotonic() > deadline:
            if daemon is not None:
                raise daemon.failure(f"not {what} after {timeout:.0f}s")
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last error: {last_error}"
            )
        time.sleep(interval)
