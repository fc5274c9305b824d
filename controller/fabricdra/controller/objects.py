"""The objects a ComputeDomain needs, built as plain dicts (pure; no API calls).

- the workload ResourceClaimTemplate, in the domain's namespace, owned by the domain;
- managed IMEX mode: the daemon ResourceClaimTemplate and the IMEX DaemonSet, in the driver's
  namespace (owner references cannot cross namespaces, so these carry the domain label and are
  removed by the controller before it drops the domain's finalizer);
- per node: the `compute-domain.fabricdra.io` ResourceSlice with the node's channel and daemon
  devices, whose `owner` attribute is how the scheduler sees which domain holds the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api import deviceclass_table, opaque
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.jsontypes import JSON

# The IMEX daemons run the controller's own release, never a moving tag: `latest` would let a
# node pull a different build than the one the controller was tested with.
CONFIG_DIR = "/imexd"  # the daemon's per-domain host folder, as its container sees it
DEFAULT_IMAGE = f"ghcr.io/fabricdra/fabricdra:{version('fabricdra')}"


# The IMEX daemon container's requests, and a memory limit (no CPU limit): docs/
# compute-domains.md, "Sizing the IMEX daemon", says where each figure comes from.
DEFAULT_DAEMON_CPU = "100m"
DEFAULT_DAEMON_MEMORY = "128Mi"
DEFAULT_DAEMON_MEMORY_LIMIT = "1Gi"


@dataclass(frozen=True)
class DaemonSettings:
    """How the per-domain IMEX DaemonSet is run (controller flags)."""

    namespace: str = "fabricdra-system"
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    service_account: str = "fabricdra-imex-daemon"
    priority_class: str = "system-node-critical"
    # The daemon container's requests, and its memory limit. No CPU limit: it would stretch
    # the start-up burst and IMEX's peer handling, and buys no protection (the pod is
    # system-node-critical, which kubelet ranks with Guaranteed pods for the OOM killer).
    # See docs/compute-domains.md, "Sizing the IMEX daemon".
    cpu: str = DEFAULT_DAEMON_CPU
    memory: str = DEFAULT_DAEMON_MEMORY
    memory_limit: str = DEFAULT_DAEMON_MEMORY_LIMIT
    # Extra environment of the daemon containers (the chart's `extraEnv`, e.g. the API server's
    # address where pods cannot reach the `kubernetes` Service), after the daemon's own.
    extra_env: tuple[JSON, ...] = ()


def owner_reference(domain: ComputeDomain) -> JSON:
    return {
        "apiVersion": cd.API_VERSION,
        "kind": cd.KIND,
        "name": domain.name,
        "uid": domain.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def channel_config(domain: ComputeDomain, channel: int) -> JSON:
    """The opaque parameters the node plugin reads at prepare: which domain, which channel.
    Built through the model both sides share, so a bad one is refused here, before any claim
    carries it, with the message the node plugin would give."""
    return opaque.ChannelConfig.build(
        domainUID=domain.uid,
        domainName=domain.name,
        namespace=domain.namespace,
        channel=channel,
        allocationMode=domain.spec.channel.allocationMode,
        imexMode=domain.spec.imexMode,
    ).params()


def daemon_config(domain: ComputeDomain) -> JSON:
    """The opaque parameters of an IMEX daemon's claim: which domain it serves."""
    return opaque.DaemonConfig.build(
        domainUID=domain.uid, domainName=domain.name, namespace=domain.namespace
    ).params()


def _channel_selector(uid: str, fabric: str | list[str] | None) -> str:
    attrs = f"device.attributes['{cd.DRIVER}']"
    rule = f"{attrs}.type == 'channel' && {attrs}.{cd.ATTR_OWNER} in ['{cd.FREE_OWNER}', '{uid}']"
    if isinstance(fabric, list):
        # A spanning gang (hierarchy.py): the fabric domains of its placement, and no other.
        listed = ", ".join(f"'{f}'" for f in fabric)
        rule += f" && {attrs}.{cd.ATTR_FABRIC} in [{listed}]"
    elif fabric is not None:
        # Pinned: the scheduler only considers nodes of the domain's fabric domain, so a pod
        # that cannot fit there stays quietly Pending instead of failing binding elsewhere.
        rule += f" && {attrs}.{cd.ATTR_FABRIC} == '{fabric}'"
    return rule


# The pin `_channel_selector` writes, read back from a claim made from the template.
_PINNED = re.compile(
    re.escape(f"device.attributes['{cd.DRIVER}'].{cd.ATTR_FABRIC} == '") + r"([^']*)'"
)


def pinned_fabric(claim: JSON) -> str | None:
    """The fabric domain a workload claim's channel request is pinned to (the template's
    selector when the claim was made: a claim's spec never changes), None if unpinned."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for request in requests:
        for selector in (request.get("exactly") or {}).get("selectors") or []:
            found = _PINNED.search(str((selector.get("cel") or {}).get("expression") or ""))
            if found:
                return found.group(1)
    return None


def workload_claim_template(
    domain: ComputeDomain, channel: int, fabric: str | list[str] | None = None
) -> JSON:
    """`fabric`: the fabric domain the domain is pinned to (None while unpinned; "" pins it
    to nodes without a fabric; a list: a spanning gang's fabric domains)."""
    labels = {cd.DOMAIN_LABEL: domain.uid, cd.TARGET_LABEL: "workload"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": domain.spec.channel.resourceClaimTemplate.name,
            "namespace": domain.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(domain)],
        },
        "spec": {
            # Claims made from the template carry the domain label: the controller finds a
            # claim's domain from it when it admits the claim's node.
            "metadata": {"labels": labels},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "channel",
                            "exactly": {
                                "deviceClassName": cd.CHANNEL_CLASS,
                                "selectors": [
                                    {"cel": {"expression": _channel_selector(domain.uid, fabric)}}
                                ],
                            },
                        }
                    ],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": cd.DRIVER,
                                "parameters": channel_config(domain, channel),
                            },
                        }
                    ],
                },
            },
        },
    }


def daemon_name(domain: ComputeDomain) -> str:
    return f"imex-{domain.uid}"


def daemon_claim_template(domain: ComputeDomain, settings: DaemonSettings) -> JSON:
    labels = {cd.DOMAIN_LABEL: domain.uid, cd.TARGET_LABEL: "daemon"}
    attrs = f"device.attributes['{cd.DRIVER}']"
    selector = f"{attrs}.type == 'daemon' && {attrs}.{cd.ATTR_OWNER} == '{domain.uid}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": daemon_name(domain),
            "namespace": settings.namespace,
            "labels": labels,
        },
        "spec": {
            "metadata": {"labels": labels},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "daemon",
                            "exactly": {
                                "deviceClassName": cd.DAEMON_CLASS,
                                "selectors": [{"cel": {"expression": selector}}],
                            },
                        }
                    ],
                    "config": [
                        {
                            "requests": ["daemon"],
                            "opaque": {"driver": cd.DRIVER, "parameters": daemon_config(domain)},
                        }
                    ],
                }
            },
        },
    }


def daemon_set(domain: ComputeDomain, settings: DaemonSettings) -> JSON:
    """One IMEX daemon per node the domain holds. The node selector is the node label the
    controller sets when it admits a node for the domain, so daemons start exactly where the
    domain's workloads were scheduled, and stop when the node is released."""
    name = daemon_name(domain)
    labels = {cd.DOMAIN_LABEL: domain.uid, cd.TARGET_LABEL: "daemon"}
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "FABRICDRA_DOMAIN_NAME", "value": domain.name},
        {"name": "FABRICDRA_DOMAIN_NAMESPACE", "value": domain.namespace},
        {"name": "FABRICDRA_DOMAIN_UID", "value": domain.uid},
        {"name": "FABRICDRA_REPORT_NAMESPACE", "value": settings.namespace},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {cd.DOMAIN_LABEL: domain.uid},
                    "serviceAccountName": settings.service_account,
                    # The daemon gates the domain's workloads: it must not be preempted or
                    # wait behind them in the scheduling queue.
                    "priorityClassName": settings.priority_class,
                    "hostNetwork": True,
                    "tolerations": [{"operator": "Exists"}],
                    "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": name}],
                    "containers": [
                        {
                            "name": "imex",
                            "image": settings.image,
                            "imagePullPolicy": settings.image_pull_policy,
                            "args": ["imex-daemon"],
                            # Root, not the image's user: the daemon writes the per-domain host
                            # folder the node plugin made (root's, 0755) and IMEX opens the
                            # fabric-imex-mgmt capability device, which the driver makes
                            # root-only (mode 0400). No privilege escalation on top.
                            "securityContext": {
                                "runAsUser": 0,
                                "runAsGroup": 0,
                                "allowPrivilegeEscalation": False,
                            },
                            "env": [*env, *settings.extra_env],
                            "resources": {
                                "requests": {"cpu": settings.cpu, "memory": settings.memory},
                                "limits": {"memory": settings.memory_limit},
                                "claims": [{"name": "imex"}],
                            },
                            **daemon_probes(),
                        }
                    ],
                },
            },
        },
    }


# The daemon's loop touches /imexd/alive at every turn (daemon.py); older than this, the
# daemon is stuck (a turn takes at most two API calls of 30 s and a 5 s IMEX query).
ALIVE_WITHIN_SECONDS = 120


def daemon_probes() -> JSON:
    """The IMEX daemon container's probes. File checks, not a Python start-up per probe (that
    cost 0.55 s CPU and 54 MB each). Readiness: IMEX answers READY (the daemon keeps
    /imexd/ready while it does). Startup: the daemon's loop has turned once (/imexd/alive
    exists; until then liveness is not asked). Liveness: the loop still turns (the file is
    younger than ALIVE_WITHIN_SECONDS), else kubelet restarts the container. A hung
    nvidia-imex is restarted by the daemon itself (imex.py, `hang_seconds`), which a
    liveness probe asking IMEX could not tell from an IMEX waiting for its peers or not run
    on purpose (no fabric, old driver)."""
    alive = f"{CONFIG_DIR}/alive"
    return {
        "startupProbe": {
            "exec": {"command": ["test", "-e", alive]},
            "periodSeconds": 2,
            "failureThreshold": 150,
        },
        "livenessProbe": {
            "exec": {
                "command": [
                    "sh",
                    "-c",
                    f'test $(( $(date +%s) - $(stat -c %Y "{alive}") )) -lt {ALIVE_WITHIN_SECONDS}',
                ]
            },
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "exec": {"command": ["test", "-e", f"{CONFIG_DIR}/ready"]},
            "periodSeconds": 5,
        },
    }


def slice_name(node: str) -> str:
    return f"{node}-compute-domain"


def node_devices(owner: str, fabric_domain: str) -> list[JSON]:
    attrs = {cd.ATTR_OWNER: {"string": owner}, cd.ATTR_FABRIC: {"string": fabric_domain}}
    return [
        {
            "name": cd.CHANNEL_DEVICE,
            "attributes": {"type": {"string": "channel"}, **attrs},
            # Every claim of the owning domain on this node shares the one channel device, so
            # several pods of one domain need no hand-shared ResourceClaim.
            "allowMultipleAllocations": True,
            "bindsToNode": True,
            "bindingConditions": [cd.ADMITTED_CONDITION],
            "bindingFailureConditions": [cd.CONFLICT_CONDITION],
        },
        {
            "name": cd.DAEMON_DEVICE,
            "attributes": {"type": {"string": "daemon"}, **attrs},
            "allowMultipleAllocations": True,
        },
    ]


def node_slice(node: str, node_uid: str, owner: str, fabric_domain: str, generation: int) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "labels": {cd.TARGET_LABEL: "node"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "driver": cd.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": node_devices(owner, fabric_domain),
        },
    }


def device_classes() -> list[JSON]:
    """The two DeviceClasses of the compute-domain driver (installed with the controller), rows
    of the one DeviceClass table (fabricdra.api.deviceclass_table)."""
    return [row.manifest() for row in deviceclass_table.rows("controller")]


def differs(desired: Any, live: Any) -> bool:
    """True when some field we set in `desired` has another value in `live` (fields the
    server adds are ignored)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return True
        return any(differs(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return True
        return any(differs(d, x) for d, x in zip(desired, live, strict=True))
    return bool(desired != live)
