"""Suite-wide fixtures: the real control plane and cluster harness live in e2e/harness."""

pytest_plugins = ["e2e.harness.pytest_plugin"]
