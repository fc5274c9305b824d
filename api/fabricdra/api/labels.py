"""Node label keys fabricdra publishes. Every key lives under one prefix, the only keys the
driver ever adds or removes on a Node."""

PREFIX = "fabricdra.io/"

RDMA_CAPABLE = PREFIX + "rdma.capable"
RDMA_DISTANCE = PREFIX + "rdma.distance"
RDMA_NUMA = PREFIX + "rdma.numa"
FABRIC_DOMAIN = PREFIX + "fabric.domain"
FABRIC_MEMBERS = PREFIX + "fabric.members"
# "true" while the node's verification gate is open (docs/verification.md); absent otherwise.
VERIFIED = PREFIX + "verified"
# "true" on every node of a fabric domain whose multi-node NVLink check passed, written by the
# ComputeDomain controller (docs/verification.md, "Multi-node NVLink"); absent otherwise. Not
# under a managed prefix (`fabric.` is the node agent's): the agent never removes it.
FABRIC_VERIFIED = PREFIX + "fabric-verified"
# Node annotation, JSON: the fabric check's record for the node (FabricCheckRecord in
# fabricdra.api.fabriccheck): what was checked, when, with which figures, and why.
FABRIC_CHECK = PREFIX + "fabric-check"
# Node annotation, JSON: the scale-out cabling check's verdict for the node, written by the
# controller with the tier labels (docs/labels.md, "Scale-out tiers"): {"result": "Passed" |
# "Failed", "railOptimised", "leaves", "findings"}. Absent where the node has no known leaf.
CABLING_CHECK = PREFIX + "network.cabling"
# The nearest scale-out tier label (api/scaleout.TIER_LABELS[0]): a node with it is tiered.
TIER_1 = PREFIX + "network.tier-1"
# The fabric domain value of nodes in no multi-node fabric (the fleet view's name for them).
NO_FABRIC = "none"

# Set by the operator, read by the node agent (never written by it): the node's RDMA mode,
# exclusive | shared | off (docs/labels.md). Not under a managed prefix, so never removed.
RDMA_MODE = PREFIX + "rdma-mode"

# The keys discovery derives (VERIFIED is the verification gate's, set by the publisher).
ALL = (RDMA_CAPABLE, RDMA_DISTANCE, RDMA_NUMA, FABRIC_DOMAIN, FABRIC_MEMBERS)
# The families a writer may remove stale keys from (and only these).
MANAGED_PREFIXES = (PREFIX + "rdma.", PREFIX + "fabric.")
