"""What a deployment installs before the node plugin runs, shared by the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api.nodedevices import CRD

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def installed(control_plane: ControlPlane) -> None:
    """The NodeDevices CRD and the DeviceClasses, applied as a deployment would."""
    install(control_plane)


def install(control_plane: ControlPlane) -> None:
    """Apply the NodeDevices CRD and the DeviceClasses to `control_plane`."""
    with control_plane.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        try:
            ext.create_custom_resource_definition(CRD.crd())
        except ApiException as e:
            if e.status != 409:
                raise

        def established() -> bool:
            crd = ext.read_custom_resource_definition(CRD.crd()["metadata"]["name"])
            return any(
                c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
            )

        wait_for(established, timeout=30, what="NodeDevices CRD established")
        resource = client.ResourceV1Api(api)
        for path in sorted((REPO / "api" / "deviceclasses").glob("*.yaml")):
            try:
                resource.create_device_class(yaml.safe_load(path.read_text()))
            except ApiException as e:
                if e.status != 409:
                    raise
