"""The Kueue parts of the harness that need no cluster: a cached Kueue build counts only when
its stamp names the pinned version and its manifests are there (another pin is rebuilt), and
Kueue's webhooks are pointed at the manager by URL with the harness CA."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from e2e.harness import binaries
from e2e.harness.controlplane import ControlPlane
from e2e.harness.errors import HarnessError
from e2e.harness.kueue import Kueue, _groups


def _cached_kueue(bin_dir: Path, version: str, manifests: bool = True) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "kueue"
    exe.write_text("#!/bin/sh\n")
    os.chmod(exe, 0o755)
    (bin_dir / "kueue.version").write_text(version + "\n")
    if manifests:
        (bin_dir / "kueue-manifests").mkdir(exist_ok=True)
        (bin_dir / "kueue-manifests" / "webhooks.yaml").write_text("")


def test_pinned_version_is_read_from_the_wrapper_module() -> None:
    assert binaries.kueue_version() == "v0.17.0"


def test_cached_build_counts_only_at_the_pinned_version(tmp_path: Path) -> None:
    _cached_kueue(tmp_path, binaries.kueue_version())
    assert binaries._present(tmp_path, binaries.KUEUE)
    _cached_kueue(tmp_path, "v0.16.0")
    assert not binaries._present(tmp_path, binaries.KUEUE)


def test_cached_build_without_its_manifests_is_rebuilt(tmp_path: Path) -> None:
    _cached_kueue(tmp_path, binaries.kueue_version(), manifests=False)
    assert not binaries._present(tmp_path, binaries.KUEUE)


def test_unknown_integration_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match=r"'kubeflow.org/mpijob'.*known: \['batch/job'\]"):
        Kueue(ControlPlane(tmp_path), frameworks=("kubeflow.org/mpijob",))


def test_webhook_is_pointed_at_the_manager_by_url(tmp_path: Path) -> None:
    kueue = Kueue(ControlPlane(tmp_path))
    kueue.webhook_port = 9443
    hook = {
        "name": "mjob.kb.io",
        "clientConfig": {"service": {"name": "webhook-service", "path": "/mutate-batch-v1-job"}},
        "rules": [{"apiGroups": ["batch"], "resources": ["jobs"]}],
        "failurePolicy": "Fail",
    }
    got = kueue._by_url(hook, b"CA PEM")
    assert got["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-batch-v1-job",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert got["failurePolicy"] == "Fail"
    assert got["rules"] == hook["rules"]
    assert _groups(hook) == {"batch"}
