"""The `NodeDevices` custom resource: one node's inventory record, as discovery returned it.

Cluster-scoped, group `fabricdra.io`, one object per node named after the node. `spec.interfaces`
are the node's network interfaces (VFs nested under their PF) and `spec.groups[].accelerators`
its accelerators grouped by vendor — the same records `fabricdra inventory` prints, so
`kubectl get nodedevices <node> -o json | jq ...` reads exactly what the plugin saw. The node
agent writes it only when it changed (the lists are sorted, and a failed link's first-seen time
is stable, so an unchanged node compares equal). The CRD in api/crds/ is generated from this
model (`python -m fabricdra.api.crdgen`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .crdgen import CrdSource
from .inventory import AcceleratorGroup, Endpoint, Interface
from .verification import Verification

GROUP = "fabricdra.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeDevices"
PLURAL = "nodedevices"
SINGULAR = "nodedevices"


class Record(BaseModel):
    """Frozen and strict about unknown keys, like the inventory records it holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeDevicesSpec(Record):
    interfaces: list[Interface] = Field(
        default_factory=list,
        description="Every kernel network interface, sorted by name; SR-IOV VFs nested under "
        "their physical function.",
    )
    groups: list[AcceleratorGroup] = Field(
        default_factory=list,
        description="The node's accelerators, one group per vendor.",
    )
    adapters: list[Endpoint] = Field(
        default_factory=list,
        description="Offered devices that are neither a network interface nor an accelerator: "
        "RDMA functions with no netdev (AWS EFA, where the node offers it), each one's PCI "
        "function, RDMA and verbs device and link verdict; sorted by PCI address.",
    )


class NodeDevicesStatus(Record):
    verification: Verification | None = Field(
        default=None,
        description="The node's verification gate: state, the last run's time and per-probe "
        "results (measured vs expected), and any manual override (docs/verification.md).",
    )


class NodeDevices(BaseModel):
    """One node's inventory record."""

    model_config = ConfigDict(extra="ignore")

    apiVersion: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: NodeDevicesSpec
    status: NodeDevicesStatus = Field(default_factory=NodeDevicesStatus)


CRD = CrdSource(
    model=NodeDevices,
    group=GROUP,
    kind=KIND,
    plural=PLURAL,
    singular=SINGULAR,
    scope="Cluster",
    version=VERSION,
    short_names=("nd",),
    printer_columns=(
        {"name": "Verification", "type": "string", "jsonPath": ".status.verification.state"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
)
