"""How the multi-node NVLink check runs (fabriccheck.py decides when, and what it means)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .fabriccheck import CheckResult


@dataclass(frozen=True)
class RunSettings:
    """The controller's settings for the check's pods (the chart's `verification.*`)."""

    image: str = ""  # the verification image (nvbandwidth -DMULTINODE=1, mpirun, sshd)


class KubeRunner:
    """Runs the check in the cluster (see the module docstring)."""

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings

    def run(self, fabric: str, nodes: Sequence[str], threshold_gbs: float) -> CheckResult:
        if not self.settings.image:
            return CheckResult(
                "NotRun",
                "no verification image to run the check from (the controller's "
                "--fabric-check-image, the chart's verification.image)",
            )
        return CheckResult("NotRun", "not implemented yet")

    def cleanup(self) -> None:
        return None
