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
from .fabriccheck import MeasuredLoss

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
# ComputeDomain annotation: the batch scheduler that chooses the domain's nodes. With
# `kueue` (Kueue's topology-aware scheduling assigns the pods' nodes), the controller never
# places the domain as a gang, even with numNodes: it follows the nodes its pods' claims are
# allocated on, as an elastic domain does (docs/compute-domains.md, "With Kueue"). Any other
# value: placed by the controller as usual.
PLACED_BY = "fabricdra.io/placed-by"
PLACED_BY_KUEUE = "kueue"
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
# The scale-out switch tiers a spanning gang may be kept under (scaleout.TIER_LABELS, nearest
# first: tier-1 is the leaf a node is cabled to).
Tier = Literal["tier-1", "tier-2", "tier-3"]
TIERS: tuple[Tier, ...] = ("tier-1", "tier-2", "tier-3")
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


class TopologySpec(_Model):
    required: Tier | None = Field(
        default=None,
        description="The switch tier all of the domain's nodes must share (one "
        "fabricdra.io/network.<tier> switch above every node): the gang waits rather than "
        "cross it.",
    )
    preferred: Tier | None = Field(
        default=None,
        description="The switch tier the domain should stay under; the placer always tries the "
        "lowest tier with room first, and with only `preferred` it goes above it (to any "
        "node) rather than wait. Must not be above `required`.",
    )

    @model_validator(mode="after")
    def _preferred_within_required(self) -> TopologySpec:
        if (
            self.required
            and self.preferred
            and TIERS.index(self.preferred) > TIERS.index(self.required)
        ):
            raise ValueError(TOPOLOGY_ORDER_RULE["message"])
        return self


class ParallelismSpec(_Model):
    groupGPUs: int = Field(
        ge=1,
        le=4096,
        description="GPUs in one tensorxexpert-parallel (TPxEP) group: each group is kept "
        "inside one NVLink domain (GB200/GB300 NVL72: up to 72).",
    )
    gpusPerNode: int = Field(
        ge=1,
        le=64,
        description="GPUs each of the domain's pods uses on its node (GB200/GB300 NVL72 "
        "compute tray: 4). groupGPUs must be a multiple of it, or divide it. Gang placement "
        "counts only nodes with this many free healthy GPUs.",
    )

    @property
    def group_nodes(self) -> int:
        """Nodes one TPxEP group spans (1 when a node holds one or more whole groups)."""
        return max(self.groupGPUs // self.gpusPerNode, 1)

    @model_validator(mode="after")
    def _groups_whole(self) -> ParallelismSpec:
        if self.groupGPUs % self.gpusPerNode and self.gpusPerNode % self.groupGPUs:
            raise ValueError(GROUP_SHAPE_RULE["message"])
        return self


class Toleration(_Model):
    """A pod toleration (core/v1 Toleration's fields and matching rules)."""

    key: str = Field(default="", max_length=317, description="Empty with Exists: every key.")
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = Field(default="", max_length=63)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="", description="Empty: every effect."
    )
    tolerationSeconds: int | None = Field(
        default=None, description="Accepted so pod tolerations can be copied; not used."
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
    topology: TopologySpec | None = Field(
        default=None,
        description="Needs allowMultipleCliques and numNodes: the domain is placed as one "
        "gang into the fewest NVLink fabric domains under the lowest scale-out switch tier "
        "with room (docs/compute-domains.md, Spanning NVLink domains).",
    )
    segmentSize: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES_PER_DOMAIN,
        description="Needs allowMultipleCliques and numNodes (a multiple of it): the domain is "
        "split into segments of this many nodes, each inside one NVLink fabric domain and "
        "each its own IMEX domain; segments are packed into whatever fabric domains have room.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="The tolerations of the domain's pods (copy their spec.tolerations): gang "
        "placement counts a node with a NoSchedule or NoExecute taint none of these tolerates "
        "as no room (its pods could never run there), unless at least half of the NVLink "
        "fabric nodes carry that taint (the fleet's convention, not a tray's condition).",
    )
    parallelism: ParallelismSpec | None = Field(
        default=None,
        description="The job's TPxEP group size: the placer keeps each group inside one NVLink "
        "fabric domain (a fabric domain takes whole groups; segmentSize must hold whole "
        "groups).",
    )

    @model_validator(mode="after")
    def _host_mode_holds_one_channel(self) -> ComputeDomainSpec:
        if self.imexMode == "host" and self.channel.allocationMode == "All":
            raise ValueError(HOST_SINGLE_CHANNEL_RULE["message"])
        spans = self.topology is not None or self.segmentSize is not None
        if spans and not (self.allowMultipleCliques and self.numNodes):
            raise ValueError(SPANS_RULE["message"])
        if self.segmentSize is not None and (self.numNodes or 0) % self.segmentSize:
            raise ValueError(
                f"numNodes {self.numNodes} is not a multiple of segmentSize {self.segmentSize}: "
                "every segment must be whole"
            )
        if self.parallelism is not None:
            group = self.parallelism.group_nodes
            if self.numNodes and self.numNodes % group:
                raise ValueError(
                    f"numNodes {self.numNodes} is not a multiple of the {group} nodes one TPxEP "
                    f"group spans (parallelism.groupGPUs / gpusPerNode)"
                )
            if self.segmentSize and self.segmentSize % group:
                raise ValueError(
                    f"segmentSize {self.segmentSize} does not hold whole TPxEP groups of "
                    f"{group} nodes (parallelism.groupGPUs / gpusPerNode)"
                )
        return self

    @property
    def spans(self) -> bool:
        """Placed as one gang across NVLink fabric domains (placement.py, hierarchy.py)."""
        return (
            self.allowMultipleCliques
            and (self.numNodes or 1) > 1
            and (
                self.topology is not None
                or self.segmentSize is not None
                or self.parallelism is not None
            )
        )

    @property
    def atom(self) -> int:
        """The node count a fabric domain's share of the gang must be a multiple of: a
        segment, else a TPxEP group, else one node."""
        if self.segmentSize:
            return self.segmentSize
        return self.parallelism.group_nodes if self.parallelism else 1


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
    segment: int | None = Field(
        default=None,
        description="With segmentSize: the node's segment in its fabric domain (index // "
        "segmentSize); the nodes of one segment form one IMEX domain of their own.",
    )


class PlacedShare(_Model):
    fabricDomain: str = Field(description="An NVLink fabric domain the gang is placed in.")
    nodes: int = Field(ge=1, description="How many of the gang's nodes go there.")


class PlacementStatus(_Model):
    tier: str = Field(
        description="The switch tier all shares are under (tier-1, tier-2, tier-3), or "
        "`any` when none holds the gang (allowed only without topology.required)."
    )
    switch: str = Field(default="", description="That tier's switch (its label value).")
    shares: list[PlacedShare] = Field(
        default_factory=list,
        description="The gang's nodes per NVLink fabric domain, each a multiple of "
        "segmentSize (else of the TPxEP group's nodes).",
    )


class SegmentStatus(_Model):
    fabricDomain: str
    segment: int = Field(description="The segment's number in its fabric domain.")
    nodes: list[str] = Field(default_factory=list, description="Its nodes so far.")
    ready: bool = Field(default=False, description="segmentSize nodes, all ready.")


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
    placement: PlacementStatus | None = Field(
        default=None,
        description="A spanning gang's placement (allowMultipleCliques with topology, "
        "segmentSize or parallelism), recorded before its claim template is made from it.",
    )
    measuredLoss: MeasuredLoss | None = Field(
        default=None,
        description="A spanning gang's (status.placement) newest measured loss taken in one "
        "of its fabric domains by the fabric check (--fabric-check-loss): the same nccl-tests "
        "all-reduce inside one NVLink domain and split across two. A failed run has an error "
        "and no figures.",
    )
    segments: list[SegmentStatus] = Field(
        default_factory=list,
        description="With segmentSize: each segment (its own IMEX domain, holding the domain's "
        "channel id in that IMEX domain) and its nodes.",
    )
    observedGeneration: int = 0


def placed_by_kueue(obj: Mapping[str, Any]) -> bool:
    """A stored ComputeDomain whose nodes Kueue assigns (PLACED_BY): never placed by fabricdra."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(PLACED_BY) == PLACED_BY_KUEUE)


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
SPANS_RULE = {
    "rule": "!(has(self.topology) || has(self.segmentSize)) || (has(self.numNodes) && "
    "has(self.allowMultipleCliques) && self.allowMultipleCliques)",
    "message": "topology and segmentSize place a gang across NVLink fabric domains: they need "
    "numNodes and allowMultipleCliques: true",
}
SEGMENT_WHOLE_RULE = {
    "rule": "!has(self.segmentSize) || !has(self.numNodes) || self.numNodes % self.segmentSize "
    "== 0",
    "message": "numNodes is not a multiple of segmentSize: every segment must be whole",
}
TOPOLOGY_ORDER_RULE = {
    "rule": "!has(self.required) || !has(self.preferred) || self.preferred <= self.required",
    "message": "topology.preferred is above topology.required: the domain can never go there",
}
GROUP_SHAPE_RULE = {
    "rule": "self.groupGPUs % self.gpusPerNode == 0 || self.gpusPerNode % self.groupGPUs == 0",
    "message": "parallelism.groupGPUs must be a multiple of gpusPerNode or divide it: a TPxEP "
    "group is whole nodes, or a node holds whole groups",
}
GROUP_WHOLE_RULE = {
    "rule": "!has(self.parallelism) || self.parallelism.groupGPUs < self.parallelism.gpusPerNode"
    " || ((!has(self.numNodes) || self.numNodes % (self.parallelism.groupGPUs / "
    "self.parallelism.gpusPerNode) == 0) && (!has(self.segmentSize) || self.segmentSize % "
    "(self.parallelism.groupGPUs / self.parallelism.gpusPerNode) == 0))",
    "message": "numNodes and segmentSize must hold whole TPxEP groups (parallelism.groupGPUs / "
    "gpusPerNode nodes each)",
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
    validations={
        "spec": [
            SPEC_IMMUTABLE_RULE,
            HOST_SINGLE_CHANNEL_RULE,
            SPANS_RULE,
            SEGMENT_WHOLE_RULE,
            GROUP_WHOLE_RULE,
        ],
        "spec.topology": [TOPOLOGY_ORDER_RULE],
        "spec.parallelism": [GROUP_SHAPE_RULE],
    },
)
