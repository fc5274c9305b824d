"""Fixtures of the in-cluster scenarios (tests/e2e/installkit.py): fabricdra installed by its
chart, with the image built from this checkout, on the harness's node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.harness.existing import ExistingCluster
from e2e.harness.helm import Chart, harness_values
from e2e.harness.images import fabricdra_image
from e2e.harness.nodecluster import NodeCluster
from tests.e2e.imexnode import add_imex_driver
from tests.e2e.installkit import Installed
from tests.integration.kubelethost import build_host


@pytest.fixture(scope="session")
def installation(
    node_cluster: NodeCluster | ExistingCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """The node's files, the image (imported into the node's containerd) and the chart's values,
    made once; the release itself is installed by `installed`."""
    if not isinstance(node_cluster, NodeCluster):
        pytest.fail("the install tests build the node's files locally: run them on the harness")
    host = build_host(tmp_path_factory.mktemp("hgx"))
    archive, image = fabricdra_image(tmp_path_factory.mktemp("image"))
    node_cluster.import_image(archive)
    values = harness_values(
        node_cluster,
        image,
        sysfs=host.root / "sys",
        dev=host.layout.dev_root,
        proc=host.layout.proc_root,
        nvml=host.nvml_snapshot,
    )
    values["driverRoot"] = str(add_imex_driver(host))  # what IMEX daemons get (scenario 4)
    installation = Installed(node_cluster, host, Chart(), values)
    yield installation
    if installation.present:
        installation.uninstall()


@pytest.fixture
def installed(installation: Installed) -> Installed:
    """fabricdra installed on the node (installed again if a scenario removed it)."""
    installation.ensure()
    return installation
