"""Fixtures shared by the controller integration tests (test_computedomain_*, test_fleet)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.harness.controlplane import ControlPlane
from fabricdra.kube.rest import Rest

from .computedomain_helpers import install_crd, remove_new_objects, snapshot_objects


@pytest.fixture
def leaves_nothing_behind(control_plane: ControlPlane) -> Iterator[None]:
    """The control plane is shared by the whole session and every test runs its own
    controller, which acts on every ComputeDomain and Node in the cluster: an unfinished gang
    left behind by one test is placed again by the next test's controller, in that test's
    fabric domains, and takes the room that test counts on. So what a test created
    (ComputeDomains, Nodes) is removed when it ends, after its controllers stopped (this
    fixture is set up before theirs, so torn down after them). Objects made by module-scoped
    fixtures exist before the snapshot and are kept."""
    before = snapshot_objects(control_plane)
    yield
    remove_new_objects(control_plane, before)


@pytest.fixture(scope="module")
def rest(control_plane: ControlPlane) -> Rest:
    """The admin's REST client, with the ComputeDomain CRD installed."""
    r = Rest(control_plane.api_client())
    install_crd(r)
    return r
