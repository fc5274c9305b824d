"""The one error the harness raises: something needed to run real Kubernetes is missing or broke."""


class HarnessError(RuntimeError):
    """The harness could not build, start or reach a component; the message says which and why."""
