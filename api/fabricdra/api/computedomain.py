"""The ComputeDomain resource (`fabricdra.io/v1beta1`, namespaced): one multi-node NVLink job.

This pydantic model is the single source of truth: the CRD under `api/crds/` is generated from
it (`fabricdra.api.crdgen`), the controller parses live objects with it and writes its status
through it. Names shared by the controller, the node plugin and the IMEX daemon live here too,
so the three can never disagree on a label key or a driver name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .crdgen import CrdSource

GROUP = "fabricdra.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ComputeDomain"
PLURAL = "computedomains"
SINGULAR = "computedomain"
SHORT_NAMES = ["cd"]

# The DRA driver of the node side; also the ResourceSlice driver and the opaque-config driver.
DRIVER = "compute-domain.fabricdra.io"
# DeviceClasses the controller's ResourceClaimTemplates request.
CHANNEL_CLASS = "compute-domain-channel.fabricdra.io"
DAEMON_CLASS = "compute-domain-daemon.fabricdra.io"

# Everything the controller creates for a domain carries the domain's UID under this label, so
# cleanup after a crash finds its leftovers by label, never by guessing names.
DOMAIN_LABEL = "compute-domain.fabricdra.io/domain"
# What a created object is for: "workload" or "daemon" (claim templates), "daemon" (DaemonSet).
TARGET_LABEL = "compute-domain.fabricdra.io/target"
# Set by the node plugin when it runs on a node: the controller publishes the node's channel
# and daemon devices only for nodes carrying it (value "true").
PLUGIN_NODE_LABEL = "compute-domain.fabricdra.io/plugin"
FINALIZER = "fabricdra.io/compute-domain"

# ResourceSlice device names and attributes of the compute-domain driver.
CHANNEL_DEVICE = "channel"
DAEMON_DEVICE = "daemon"
ATTR_OWNER = "owner"  # the UID of the domain holding the node, or FREE_OWNER
ATTR_FABRIC = "fabricDomain"  # the node's fabricdra.io/fabric.domain, "" without a fabric
FREE_OWNER = "free"
# Binding conditions (KEP-5007): the scheduler holds a pod in PreBind until the controller has
# admitted its claim's node for the claim's domain, which closes the race between two domains'
# pods scheduled onto one free node in the same instant.
ADMITTED_CONDITION = "compute-domain.fabricdra.io/admitted"
CONFLICT_CONDITION = "compute-domain.fabricdra.io/conflict"

# Opaque claim-parameter kinds (driver compute-domain.fabricdra.io) the controller puts into
# the claim templates it creates, and the node side reads back at prepare.
OPAQUE_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_OPAQUE_KIND: Final = "ComputeDomainDaemonConfig"
# Annotations an IMEX daemon (or a host-mode node plugin) writes on its report Lease; the
# controller reads them and is the only writer of the domain's status.
REPORT_READY = "compute-domain.fabricdra.io/ready"
REPORT_MESSAGE = "compute-domain.fabricdra.io/message"
REPORT_IP = "compute-domain.fabricdra.io/ip"
REPORT_NODE = "compute-domain.fabricdra.io/node"
# The domain-label value of a node plugin's report on its host's IMEX service (host mode).
HOST_REPORT = "host"

# The IMEX channel range of one host IMEX domain (`nvidia-caps-imex-channels` minors).
CHANNEL_COUNT = 2048
# GB200/GB300 NVL72: 18 compute trays per NVLink domain, hence at most 18 IMEX peers.
# A guard against typos only: the real limit is the fabric's (the controller compares numNodes
# with the node count of the NVLink fabric domain; an NVL72 rack has 18 compute trays).
MAX_NODES_PER_DOMAIN = 1024

AllocationMode = Literal["Single", "All"]
ImexMode = Literal["managed", "host"]
ConditionStatus = Literal["True", "False", "Unknown"]

# Condition types the controller maintains.
READY = "Ready"
DAEMONS_READY = "DaemonsReady"
DEGRADED = "Degraded"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResourceClaimTemplateRef(_Model):
    name: str = Field(
        description="Name of the ResourceClaimTemplate the controller creates in the domain's "
        "namespace; workload pods reference it in spec.resourceClaims.",
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
    )


class ChannelSpec(_Model):
    resourceClaimTemplate: ResourceClaimTemplateRef
    allocationMode: AllocationMode = Field(
        default="Single",
        description="Single: each workload container gets the domain's one IMEX channel. All: "
        "every channel of the host's range (for software that picks channels itself); only "
        "with imexMode managed, where the domain's IMEX domain is its own.",
    )


class ComputeDomainSpec(_Model):
    channel: ChannelSpec
    numNodes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES_PER_DOMAIN,
        description="Expected node count. Optional: when set, Ready waits for that many ready "
        "nodes and the domain's claims are admitted together once that many are allocated in "
        "one NVLink fabric domain; when unset, Ready means every node that joined is ready.",
    )
    imexMode: ImexMode = Field(
        default="managed",
        description="managed: fabricdra runs one IMEX daemon per node of this domain. host: "
        "the administrator runs IMEX on every host; fabricdra only allocates channels.",
    )
    allowMultipleCliques: bool = Field(
        default=False,
        description="Opt-in: the domain's nodes may come from several NVLink fabric domains "
        "(cliques, the nodes' fabricdra.io/fabric.domain label). Each clique then runs its own "
        "IMEX ensemble (memory is shared over NVLink only inside a clique), numNodes counts "
        "nodes across cliques, and the domain is never pinned to one fabric domain. Default "
        "false: every node of the domain is in one fabric domain.",
    )

    @model_validator(mode="after")
    def _host_mode_holds_one_channel(self) -> ComputeDomainSpec:
        if self.imexMode == "host" and self.channel.allocationMode == "All":
            raise ValueError(HOST_SINGLE_CHANNEL_RULE["message"])
        return self


class Condition(_Model):
    type: str
    status: ConditionStatus
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    lastTransitionTime: str
    observedGeneration: int | None = None


class NodeStatus(_Model):
    name: str
    ipAddress: str = ""
    fabricDomain: str = Field(
        default="",
        description="The node's NVLink fabric domain (clique); empty on nodes without a "
        "multi-node fabric.",
    )
    index: int = Field(
        description="The node's slot in its clique's IMEX peer list, unique among the "
        "domain's nodes of that clique."
    )
    ready: bool = False
    message: str = Field(default="", description="The node's IMEX daemon's last report.")


class PodGroupStatus(_Model):
    """The PodGroup (Kubernetes Workload API, `scheduling.k8s.io/v1alpha2`, KEP-4671) the
    domain's pods belong to, recorded by the controller when `numNodes` is unset: its gang
    `minCount` is then the domain's gang size, and its topology constraint (KEP-5732) the node
    label the gang stays within one value of (docs/compute-domains.md, "Workload API")."""

    name: str = Field(min_length=1, max_length=253)
    minCount: int = Field(
        ge=1,
        description="The PodGroup's spec.schedulingPolicy.gang.minCount: the gang size (one "
        "pod per node).",
    )
    topologyKey: str = Field(
        default="",
        max_length=317,
        description="The node label key of the PodGroup's spec.schedulingConstraints.topology; "
        "empty without one.",
    )


class ComputeDomainStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list)
    nodes: list[NodeStatus] = Field(default_factory=list)
    channels: list[int] = Field(
        default_factory=list,
        description="IMEX channel ids held by this domain (one; the whole range for "
        "allocationMode All is recorded as its first id). Unique among live domains.",
    )
    fabricDomain: str = Field(
        default="",
        description="The NVLink fabric domain all nodes of this domain share, fixed by the "
        "first node that joins; empty until then, on nodes without a fabric, and always with "
        "allowMultipleCliques (each node's row names its clique).",
    )
    podGroup: PodGroupStatus | None = Field(
        default=None,
        description="The PodGroup whose gang size and topology constraint the domain follows "
        "(numNodes unset, Workload API served); absent otherwise.",
    )
    observedGeneration: int = 0


def gang_size(obj: Mapping[str, Any]) -> int | None:
    """A stored ComputeDomain's gang size: `spec.numNodes`, else the `minCount` of the PodGroup
    its status records (the Workload API); None: elastic (no gang)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("numNodes") is not None:
        return int(spec["numNodes"])
    group = status.get("podGroup") or {}
    return int(group["minCount"]) if group.get("minCount") else None


class ComputeDomain(BaseModel):
    """A group of pods of one multi-node job whose GPUs share memory over one NVLink domain
    through IMEX: fabricdra allocates its IMEX channel, holds its nodes for it and runs its
    IMEX daemons (docs/compute-domains.md)."""

    model_config = ConfigDict(extra="ignore")

    apiVersion: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ComputeDomainSpec
    status: ComputeDomainStatus = Field(default_factory=ComputeDomainStatus)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", ""))

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid", ""))

    @property
    def generation(self) -> int:
        return int(self.metadata.get("generation", 0))

    @property
    def deleting(self) -> bool:
        return bool(self.metadata.get("deletionTimestamp"))

    @property
    def num_nodes(self) -> int | None:
        """The gang size: spec.numNodes, else the recorded PodGroup's minCount (gang_size)."""
        if self.spec.numNodes is not None:
            return self.spec.numNodes
        return self.status.podGroup.minCount if self.status.podGroup is not None else None


# What the CRD adds on top of the schema pydantic derives (crdgen takes these as arguments).
SPEC_IMMUTABLE_RULE = {"rule": "self == oldSelf", "message": "spec is immutable"}
# Host mode shares one IMEX domain among every domain on those hosts, so a domain may hold only
# its own channel there: "All" would hand it channels that other domains hold.
HOST_SINGLE_CHANNEL_RULE = {
    "rule": "!(has(self.imexMode) && self.imexMode == 'host' && "
    "has(self.channel.allocationMode) && self.channel.allocationMode == 'All')",
    "message": "channel.allocationMode All needs imexMode managed: in host mode the host's "
    "channels are shared by every domain on it",
}
PRINTER_COLUMNS = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": ".status.conditions[?(@.type=='Ready')].status",
    },
    {"name": "Mode", "type": "string", "jsonPath": ".spec.imexMode"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.numNodes"},
    {"name": "Channel", "type": "integer", "jsonPath": ".status.channels[0]"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

CRD = CrdSource(
    model=ComputeDomain,
    group=GROUP,
    kind=KIND,
    plural=PLURAL,
    singular=SINGULAR,
    scope="Namespaced",
    version=VERSION,
    short_names=SHORT_NAMES,
    printer_columns=PRINTER_COLUMNS,
    validations={"spec": [SPEC_IMMUTABLE_RULE, HOST_SINGLE_CHANNEL_RULE]},
)
