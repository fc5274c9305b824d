"""ComputeDomains at fleet scale: a real kube-apiserver, kube-scheduler and
kube-controller-manager (started here, stopped at exit), the controller as its own process,
and simulated nodes without kubelets.

Each simulated node is a Node object (compute-domain plugin label; an NVL72-shaped NVLink
fabric domain of `--domain-size` consecutive nodes, 18 by default: NVIDIA GB200 NVL72 is 18
compute trays, 72 GPUs, https://www.nvidia.com/en-us/data-center/gb200-nvl72/; the three
switch-tier labels of a rail-optimised fabric, bench/placesim.py: blocks of 32 nodes under a
tier-1 leaf, 256 under a tier-2 spine, 1,024 under a tier-3 core) with the
`devices.fabricdra.io` ResourceSlices our node agent publishes for the
bundled sample node (8 GPUs, RDMA NICs): the first node's written through the real publisher
code (NodePublisher.sync), the others copies of them (`--setup-workers` threads). Stand-in
IMEX daemons report READY (and renew their report as the real
daemon does) on every node the controller holds. Every node is usable before the controller
starts: Ready, without the `node.kubernetes.io/not-ready` taint the node lifecycle
controller puts on a Node it saw before its Ready status (a review found copies still
carrying it while gangs were placed: placement ran on a shrunken fleet); the bench waits for
that and prints `nodes_unusable_after_setup` and `nodes_usable_s`. The controller runs as the chart
runs it: fleet metrics on (a metrics port; `/metrics` is scraped at the end,
`fleet_metrics_scrape_s`) and `--fabric-check true`, the nodes labelled
`fabricdra.io/fabric-verified=true` as a passed multi-node check leaves them (there is no GPU to
run nvbandwidth on). Then `--domains` managed ComputeDomains of
`--per-domain` nodes are created at once, each with `--per-domain` pods (one per node, kept in
one fabric domain by podAffinity) claiming the domain's channel.

Prints, as JSON:
- nodes_setup_s: Nodes and their slices written (not a goal, for context);
- controller_startup_s: controller started -> its compute-domain slice on every node;
- all_bound_s / all_ready_s: domains created -> every pod bound / every domain Ready;
- ready_after_bound_s: the worst domain's Ready time minus its last pod's bind (goal < 30 s);
- jobs_split_over_fabrics / jobs_per_fabric: jobs whose pods span several fabric domains
  (must be 0) and how many jobs each fabric domain runs;
- writes_per_domain / burst_writes: the controller's API writes (audit log, by its user
  agent) during the burst, per domain, and all of them by verb and resource;
- steady_writes_per_domain / steady_writes_per_node_minute: its writes over `--steady`
  seconds once all are Ready (goal 0);
- sched_gpu_only_pods_per_s / sched_aligned_pods_per_s / aligned_ratio: scheduler
  throughput for `--sched-pods` pods with "1 GPU" claims and as many with "1 GPU + 1 NIC
  on one pciRoot" claims, on the same nodes, in `--sched-rounds` alternating rounds
  (medians; each round from the first pod created to the last bound; goal: ratio >= 0.5);
- admission_p50_s / admission_p99_s: a workload claim's latest allocation -> the controller's
  Admitted condition (seen by a watch here; a gang's claim waits for its whole gang), the same
  from its gang's last allocation (admission_after_gang_*), and `reallocations` (allocations
  refused NodeHeld and made again by the scheduler);
- controller_cpu_{startup,burst,steady,total}_s: the controller process's CPU seconds;
- controller_rss_mb / controller_memory_limit_mb: its peak RSS and the chart's memory limit;
- load_average_start / load_average_end: the machine's load (shared machines);
- placement (bench/placesim.py, in process, `--sim-nodes`, `--sim-jobs`, `--seed`): a mixed
  arrival sequence through fabricdra's placer and a first-fit flat placer: multi-domain jobs
  kept under one tier-2 switch, single-domain gangs split, stranded GPUs at the end.

    python -m bench.scale [--nodes 1000] [--domain-size 18] [--domains 50] [--per-domain 18]

The defaults are the issue's figures (`--help` says more about sizes); on a 2-core VM shared
with other work, start smaller (`--nodes 108 --domains 5 --per-domain 18 --sched-pods 40`);
`--sim-only` runs the placement simulation alone (seconds at 5,000 nodes). `--domains 0`
skips the domains and measures only the scheduler rounds
(about 5 minutes at 1,000 nodes, against 13 for the whole run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from bench import placesim
from e2e.harness.controlplane import ControlPlane, KubeControllerManager, KubeScheduler
from fabricdra.api import computedomain as cd
from fabricdra.api import labels as node_labels
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.controller import capacity
from fabricdra.controller.manager import USER_AGENT
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    DEVICE_CLASSES,
    NODES,
    PODS,
    SLICES,
    ApiError,
    Conflict,
    Kind,
    Rest,
)
from fabricdra.kubeletplugin.computedomain.report import write_report
from tests.integration.computedomain_helpers import (
    condition,
    domain_body,
    give_addresses,
    install_crd,
)

WRITE_VERBS = ("create", "patch", "update", "delete")
DEVICE_CLASS_DIR = Path(__file__).resolve().parents[1] / "api" / "deviceclasses"
NODE_LEASES = Kind("coordination.k8s.io", "v1", "leases", True)
SYSTEM = "fabricdra-system"
CHART_VALUES = Path(__file__).resolve().parents[1] / "charts" / "fabricdra" / "values.yaml"


def _until(check: Callable[[], Any], timeout: float, step: float = 0.2) -> float:
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(step)
    return time.perf_counter() - start


def _node_ip(name: str) -> str:
    """A simulated node's InternalIP, the one its stand-in daemon reports (stable across
    processes, unlike hash())."""
    n = int(name.rsplit("-", 1)[-1]) if name.rsplit("-", 1)[-1].isdigit() else sum(name.encode())
    return f"10.{n // 250 % 250}.{n % 250}.1"


def _publish_nodes(
    cp: ControlPlane, names: list[str], domain_size: int, fabrics: int, workers: int = 8
) -> None:
    """Node objects with the sample node's slices. The first node's are written by the real
    NodePublisher; the others are copies of what it wrote (its slices and labels, renamed),
    created by `workers` threads: one Node create, one status patch and the slices per node,
    against about ten requests through the publisher (105 s per 1,000 nodes before). The
    copies have no NodeDevices record (nothing here reads one)."""
    from fabricdra.kubeletplugin.assembly import build_devices
    from fabricdra.kubeletplugin.discovery.node import discover
    from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
    from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
    from fabricdra.kubeletplugin.publisher import NodePublisher
    from fabricdra.kubeletplugin.samples import sample_node

    with sample_node() as (sys_root, snapshot):
        readings = load_snapshot(str(snapshot))
        found = discover(SysfsTree(str(sys_root)), nvml_source=lambda: readings)
    assert found.interfaces is not None
    assert found.accelerators is not None
    devices = build_devices(found.interfaces, found.accelerators)
    api = cp.api_client()
    rest = Rest(api)

    def rack(i: int, name: str) -> dict[str, str]:
        # After the publisher (which owns the fabricdra.io/ labels it discovers; the sample is
        # an HGX node without a multi-node fabric): the simulated rack membership, its
        # switches, and the label a passed multi-node NVLink check leaves.
        return {
            cd.PLUGIN_NODE_LABEL: "true",
            node_labels.FABRIC_DOMAIN: _fabric_of(i, domain_size, fabrics),
            node_labels.FABRIC_VERIFIED: "true",
            **dict(zip(TIER_LABELS, placesim.tiers_of(i), strict=True)),
            "kubernetes.io/hostname": name,  # as a kubelet sets it (the pods' anti-affinity)
        }

    first = names[0]
    cp.create_node(first)
    give_addresses(cp, first, _node_ip(first))  # a report's IP must be its Node's own
    NodePublisher(api, first).sync(found, devices)
    rest.patch(NODES, first, {"metadata": {"labels": rack(0, first)}})
    node = rest.get(NODES, first)
    published = dict(node["metadata"].get("labels") or {})
    status = {k: v for k, v in node["status"].items() if k in ("capacity", "allocatable")}
    status["conditions"] = [
        {k: v for k, v in c.items() if k in ("type", "status", "reason", "message")}
        for c in node["status"]["conditions"]
    ]
    slices = [
        {"metadata": {k: v for k, v in o["metadata"].items() if k in ("name", "labels",
                                                                       "ownerReferences")},
         "spec": o["spec"]}
        for o in rest.list(SLICES, field_selector=f"spec.nodeName={first}")["items"]
    ]  # fmt: skip
    template = json.dumps(slices)

    def clone(item: tuple[int, str]) -> None:
        i, name = item
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        labels = {**published, **rack(i, name)}
        uid = rest.create(NODES, {"metadata": {"name": name, "labels": labels}})["metadata"]["uid"]
        body = {
            **status,
            "conditions": [{**c, "lastHeartbeatTime": now, "lastTransitionTime": now}
                           for c in status["conditions"]],
            "addresses": [{"type": "Hostname", "address": name},
                          {"type": "InternalIP", "address": _node_ip(name)}],
        }  # fmt: skip
        rest.patch(NODES, name, {"status": body}, sub="status")
        # Same-width names: the first node's name appears only where this node's belongs.
        for obj in json.loads(template.replace(f'"{first}', f'"{name}')):
            for ref in obj["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Node":
                    ref["uid"] = uid
            rest.create(SLICES, obj)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(clone, list(enumerate(names))[1:]))


def _fabric_of(i: int, domain_size: int, fabrics: int = 0) -> str:
    """Node i's NVLink domain: consecutive nodes, `domain_size` per rack; with `fabrics`, the
    earlier runs' layout (round robin over that many domains, not NVL72-shaped)."""
    return f"fabric-{i % fabrics}" if fabrics else f"nvl72-{i // domain_size:04d}"


def _wait_usable(rest: Rest, count: int, timeout: float) -> tuple[int, float]:
    """How many Nodes could not take pods when first looked at, and the seconds until all
    `count` can (capacity.unusable: Ready, no not-ready / unreachable / unschedulable taint):
    placement must see the whole fleet from the start."""
    seen: list[int] = []

    def usable() -> bool:
        items = rest.list(NODES, label_selector=cd.PLUGIN_NODE_LABEL)["items"]
        ok = sum(1 for n in items if not capacity.unusable(n))
        seen.append(count - ok)
        return ok >= count

    took = _until(usable, timeout=timeout, step=2.0)
    return seen[0], took


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _install_crds(rest: Rest) -> None:
    """The node agent's NodeDevices CRD (the ComputeDomain one comes from install_crd)."""
    crds = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", False)
    for path in sorted((DEVICE_CLASS_DIR.parent / "crds").glob("*.yaml")):
        with contextlib.suppress(Conflict):
            rest.create(crds, yaml.safe_load(path.read_text()))


def _install_device_classes(rest: Rest) -> None:
    for path in sorted(DEVICE_CLASS_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                with contextlib.suppress(Conflict):
                    rest.create(DEVICE_CLASSES, doc)


def _controller(
    cp: ControlPlane, gang_timeout: float, metrics_port: int
) -> subprocess.Popen[bytes]:
    # As the chart runs it: metrics (the fleet collector with them) and the fabric check on.
    env = {
        **os.environ,
        "FABRICDRA_METRICS_PORT": str(metrics_port),
        "FABRICDRA_FABRIC_CHECK": "true",
        "FABRICDRA_GANG_TIMEOUT_SECONDS": str(gang_timeout),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricdra.cli",
            "controller",
            "--kubeconfig",
            str(cp.kubeconfig),
            "--namespace",
            SYSTEM,
            "--leader-elect",
            "false",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


def _memory_limit_mb() -> float:
    """The controller's memory limit in the chart's values (what its peak RSS must stay under)."""
    values = yaml.safe_load((CHART_VALUES).read_text())
    limit = str(values["controller"]["resources"]["limits"]["memory"])
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}
    return next(float(limit[: -len(u)]) * f for u, f in units.items() if limit.endswith(u))


class AdmissionClock:
    """When each workload claim was first seen allocated and first seen admitted (the
    controller's binding condition), from a watch in the bench process: an admission's
    latency, for every claim, without polling."""

    def __init__(self, rest: Rest, namespace: str) -> None:
        from fabricdra.kube.informer import Informer

        self.allocated: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.domain: dict[str, str] = {}
        self.reallocations = 0
        self.informer = Informer(rest, CLAIMS, namespace=namespace, resync=3600)
        self.informer.on_event(self._seen)

    def _seen(self, event: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            return
        now = time.perf_counter()
        key = new["metadata"]["name"]
        status = new.get("status") or {}
        allocation = status.get("allocation")
        before = ((old or {}).get("status") or {}).get("allocation")
        if (
            allocation
            and key not in self.admitted
            and (key not in self.allocated or allocation != before)
        ):
            # Its latest allocation: one refused (NodeHeld, another gang's pod on the node)
            # is dropped by the scheduler and the pod placed again; that wait is the
            # scheduler's, counted in `reallocations`.
            self.reallocations += key in self.allocated
            self.allocated[key] = now
            self.domain[key] = new["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL, "")
        for dev in status.get("devices") or []:
            for c in dev.get("conditions") or []:
                if c.get("type") == cd.ADMITTED_CONDITION and c.get("status") == "True":
                    self.admitted.setdefault(key, now)

    def figures(self) -> dict[str, Any]:
        """p50/p99 of a claim's (admitted) allocation -> admitted (a gang's claim waits for its
        whole gang), and of the gang's last allocation -> admitted (the controller's own
        share), and how many allocations were refused and made again."""
        keys = [k for k in self.admitted if k in self.allocated]
        if not keys:
            return {"admitted_claims": 0}
        last: dict[str, float] = {}
        for k in keys:
            d = self.domain.get(k, "")
            last[d] = max(last.get(d, 0.0), self.allocated[k])
        waits = sorted(self.admitted[k] - self.allocated[k] for k in keys)
        after_gang = sorted(max(self.admitted[k] - last[self.domain.get(k, "")], 0.0)
                            for k in keys)  # fmt: skip

        def pct(xs: list[float], p: float) -> float:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))], 2)

        return {
            "admitted_claims": len(keys),
            "reallocations": self.reallocations,
            "admission_p50_s": pct(waits, 0.5),
            "admission_p99_s": pct(waits, 0.99),
            "admission_after_gang_p50_s": pct(after_gang, 0.5),
            "admission_after_gang_p99_s": pct(after_gang, 0.99),
        }


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


class StandInDaemons:
    """What each node's IMEX daemon does for the controller: a READY report Lease on every node
    the controller holds for a domain, renewed as the real daemon renews it."""

    def __init__(self, rest: Rest, lease_seconds: int = 40) -> None:
        self.rest, self.lease_seconds = rest, lease_seconds
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        # Several writers, first reports before renewals: one thread writing 900 reports
        # (GET + write each) and their heartbeats fell behind on a loaded machine, which
        # delayed Ready by the stand-in's backlog, not the controller's (real daemons each
        # write their own).
        renewed: dict[tuple[str, str], float] = {}

        def report(item: tuple[bool, str, str]) -> None:
            renew, uid, name = item
            try:
                write_report(
                    self.rest,
                    SYSTEM,
                    uid,
                    name,
                    ready=True,
                    message="READY",
                    ip=_node_ip(name),
                    lease_seconds=self.lease_seconds,
                    renew=renew,
                )
                renewed[(uid, name)] = time.monotonic()
            except ApiError:
                pass

        with ThreadPoolExecutor(max_workers=4) as pool:
            while not self.stop.wait(1.0):
                listing = self.rest.list(NODES, label_selector=cd.DOMAIN_LABEL)
                now = time.monotonic()
                due = []
                for node in listing.get("items", []):
                    name = node["metadata"]["name"]
                    uid = node["metadata"]["labels"][cd.DOMAIN_LABEL]
                    last = renewed.get((uid, name))
                    if last is not None and now - last < self.lease_seconds / 3:
                        continue
                    due.append((last is not None, uid, name))
                list(pool.map(report, sorted(due)))  # False (first report) sorts first


def _workload_pod(name: str, job: str, template: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"job": job}},
        "spec": {
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"job": job}},
                            "topologyKey": node_labels.FABRIC_DOMAIN,
                        }
                    ]
                },
                "podAntiAffinity": {  # one pod per node, as a multi-node job runs
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"job": job}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                },
            },
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/none",
                    "resources": {"claims": [{"name": "imex"}]},
                }
            ],
            "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": template}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _device_pod(name: str, aligned: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    requests: list[dict[str, Any]] = [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.fabricdra.io"}}
    ]
    claim: dict[str, Any] = {"devices": {"requests": requests}}
    if aligned:
        requests.append({"name": "nic", "exactly": {"deviceClassName": "rdma.fabricdra.io"}})
        claim["devices"]["constraints"] = [
            {"requests": ["gpu", "nic"], "matchAttribute": "devices.fabricdra.io/pciRoot"}
        ]
    return {
        "metadata": {"name": name, "labels": {"bench": "sched"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/none",
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
            "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
            "terminationGracePeriodSeconds": 0,
        },
    }, {"metadata": {"name": name}, "spec": claim}


def _bound(rest: Rest, ns: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in rest.list(PODS, ns)["items"]
        if p["spec"].get("nodeName")
    }


def _sched_rate(rest: Rest, ns: str, count: int, aligned: bool, round_: int = 0) -> float:
    """Pods bound per second, from the first creation to the last bind."""
    prefix = f"{'a' if aligned else 'g'}{round_}-"
    start = time.perf_counter()
    for i in range(count):
        pod, claim = _device_pod(f"{prefix}{i:04d}", aligned)
        rest.create(CLAIMS, claim, ns)
        rest.create(PODS, pod, ns)
    _until(
        lambda: sum(1 for p in _bound(rest, ns) if p.startswith(prefix)) >= count,
        timeout=900,
        step=0.5,  # each poll lists the namespace's pods: keep it off the measured server
    )
    return round(count / (time.perf_counter() - start), 1)


def _stuck(rest: Rest, bound: int, total: int, ready: int) -> str:
    """What is in the way, when the run does not finish."""
    why: dict[str, int] = {}
    for pod in rest.list(PODS, "jobs")["items"]:
        for c in pod.get("status", {}).get("conditions", []) or []:
            if c["type"] == "PodScheduled" and c["status"] != "True":
                key = str(c.get("message", c.get("reason", "")))[:160]
                why[key] = why.get(key, 0) + 1
    domains = {
        o["metadata"]["name"]: (condition(o, cd.READY) or {}).get("message", "")[:120]
        for o in rest.list(COMPUTE_DOMAINS, "jobs")["items"]
    }
    claims = {
        c["metadata"]["name"]: sorted(
            r.get("pool", "")
            for r in ((c.get("status") or {}).get("allocation") or {})
            .get("devices", {})
            .get("results", [])
        )
        for c in rest.list(CLAIMS, "jobs")["items"]
    }
    # The controller's answer at binding on each claim not admitted (GangTimeout, NodeHeld,
    # none yet) and whether a pod holds it: who is waiting for whom.
    answers: dict[str, str] = {}
    for c in rest.list(CLAIMS, "jobs")["items"]:
        conds = [
            f"{cond.get('reason', '')}: {str(cond.get('message', ''))[:100]}"
            for d in (c.get("status") or {}).get("devices", []) or []
            for cond in d.get("conditions", []) or []
        ]
        if not any(a.startswith("Admitted") for a in conds):
            reserved = len((c.get("status") or {}).get("reservedFor") or [])
            answers[c["metadata"]["name"]] = f"{'; '.join(conds) or 'none'} (reserved {reserved})"
    placed = {
        o["metadata"]["name"]: (o.get("status") or {}).get("fabricDomain", "")
        for o in rest.list(COMPUTE_DOMAINS, "jobs")["items"]
    }
    return json.dumps(
        {
            "bound": bound,
            "pods": total,
            "ready": ready,
            "pending": why,
            "domains": domains,
            "placed": placed,
            "claims": claims,
            "answers": answers,
        }
    )


def _quiet_logs() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def _burst(
    cp: ControlPlane,
    rest: Rest,
    args: argparse.Namespace,
    names: list[str],
    out: dict[str, Any],
    pid: int,
) -> None:
    """The domains created at once: their pods bound, Ready, the writes of the burst and of
    the steady state after it, the controller's CPU in each (figures into `out`)."""
    before = len(cp.audit_events(user_agent=USER_AGENT, verbs=WRITE_VERBS))
    clock = AdmissionClock(rest, "jobs")
    clock.informer.start()
    cpu = _cpu_seconds(pid)
    start = time.perf_counter()
    for d in range(args.domains):
        rest.create(
            COMPUTE_DOMAINS,
            domain_body(f"job{d:03d}", rct=f"job{d:03d}-imex", num_nodes=args.per_domain),
            "jobs",
        )
    _until(
        lambda: len(rest.list(CLAIM_TEMPLATES, "jobs")["items"]) >= args.domains,
        timeout=600,
    )
    # With --stagger, each job's second half of pods comes that many seconds after its
    # first: a stagger past the gang timeout makes every gang time out once, as a loaded
    # scheduler does, and shows what a released gang does next.
    half = args.per_domain // 2 if args.stagger > 0 else args.per_domain
    for part in (range(half), range(half, args.per_domain)):
        if part.start and part:
            time.sleep(args.stagger)
        for d in range(args.domains):
            for p in part:
                body = _workload_pod(f"job{d:03d}-{p:02d}", f"job{d:03d}", f"job{d:03d}-imex")
                rest.create(PODS, body, "jobs")
    total = args.domains * args.per_domain
    bound_at: dict[str, float] = {}
    ready_at: dict[str, float] = {}

    def progress() -> bool:
        now = time.perf_counter() - start
        for pod in _bound(rest, "jobs"):
            bound_at.setdefault(pod, now)
        for obj in rest.list(COMPUTE_DOMAINS, "jobs")["items"]:
            if (condition(obj, cd.READY) or {}).get("status") == "True":
                ready_at.setdefault(obj["metadata"]["name"], now)
        return bool(len(bound_at) >= total and len(ready_at) >= args.domains)

    try:
        # Each poll lists every pod and domain: once a second keeps the bench
        # itself from competing with what it measures.
        _until(progress, timeout=args.timeout, step=1.0)
    except TimeoutError:
        raise TimeoutError(_stuck(rest, len(bound_at), total, len(ready_at))) from None
    out["all_bound_s"] = round(max(bound_at.values()), 1)
    out["all_ready_s"] = round(max(ready_at.values()), 1)
    lags = [
        ready_at[f"job{d:03d}"]
        - max(bound_at[f"job{d:03d}-{p:02d}"] for p in range(args.per_domain))
        for d in range(args.domains)
    ]
    out["ready_after_bound_s"] = round(max(lags), 1)
    # Where the gangs ended up: each job inside one fabric domain, and how many
    # jobs each fabric domain took (placement is best fit, placement.best_fit).
    nodes_of = _bound(rest, "jobs")
    fabric_of = {n: _fabric_of(i, args.domain_size, args.fabrics) for i, n in enumerate(names)}
    jobs: dict[str, set[str]] = {}
    for pod, node in nodes_of.items():
        jobs.setdefault(pod.rsplit("-", 1)[0], set()).add(fabric_of[node])
    out["jobs_split_over_fabrics"] = sum(1 for f in jobs.values() if len(f) > 1)
    per_fabric: dict[str, int] = {}
    for fabrics_of_job in jobs.values():
        for f in fabrics_of_job:
            per_fabric[f] = per_fabric.get(f, 0) + 1
    out["jobs_per_fabric"] = dict(sorted(per_fabric.items()))
    time.sleep(2.0)  # trailing writes land in the audit log
    events = cp.audit_events(user_agent=USER_AGENT, verbs=WRITE_VERBS)
    burst = len(events)
    out["writes_per_domain"] = round((burst - before) / args.domains, 1)
    kinds: dict[str, int] = {}
    for ev in events[before:]:
        ref = ev.get("objectRef") or {}
        what = f"{ev['verb']} {ref.get('resource', '')}"
        what += f"/{ref['subresource']}" if ref.get("subresource") else ""
        kinds[what] = kinds.get(what, 0) + 1
    out["burst_writes"] = dict(sorted(kinds.items(), key=lambda kv: -kv[1]))
    out.update(clock.figures())
    clock.informer.stop()
    out["controller_cpu_burst_s"] = round(_cpu_seconds(pid) - cpu, 1)

    cpu = _cpu_seconds(pid)
    time.sleep(args.steady)
    out["controller_cpu_steady_s"] = round(_cpu_seconds(pid) - cpu, 1)
    steady = len(cp.audit_events(user_agent=USER_AGENT, verbs=WRITE_VERBS)) - burst
    out["steady_seconds"] = args.steady
    out["steady_writes_per_domain"] = round(steady / args.domains, 2)
    out["steady_writes_per_node_minute"] = round(steady / args.nodes / (args.steady / 60), 4)


def run(args: argparse.Namespace) -> dict[str, Any]:
    _quiet_logs()
    with tempfile.TemporaryDirectory(prefix="fabricdra-scale-") as tmp:
        cp = ControlPlane(Path(tmp) / "cp")
        cp.start()
        scheduler, kcm = (
            KubeScheduler(cp),
            KubeControllerManager(cp, node_monitor_grace_period="8760h"),
        )
        controller: subprocess.Popen[bytes] | None = None
        daemons: StandInDaemons | None = None
        try:
            scheduler.start()
            kcm.start()
            rest = Rest(cp.api_client())
            install_crd(rest)
            _install_crds(rest)
            _install_device_classes(rest)
            out: dict[str, Any] = {
                "nodes": args.nodes,
                "domain_size": args.domain_size,
                "fabric_domains": args.fabrics or -(-args.nodes // args.domain_size),
                "domains": args.domains,
                "per_domain": args.per_domain,
            }
            out["load_average_start"] = [round(x, 1) for x in os.getloadavg()]
            names = [f"node-{i:05d}" for i in range(args.nodes)]
            start = time.perf_counter()
            _publish_nodes(cp, names, args.domain_size, args.fabrics, args.setup_workers)
            out["nodes_setup_s"] = round(time.perf_counter() - start, 1)
            unusable, took = _wait_usable(rest, args.nodes, args.timeout)
            out["nodes_unusable_after_setup"] = unusable
            out["nodes_usable_s"] = round(took, 1)

            port = _free_port()
            controller = _controller(cp, args.gang_timeout, port)
            daemons = StandInDaemons(rest)
            daemons.start()
            cp.create_namespace("jobs")
            # The burst's writes start from a settled controller: its start-up (one
            # compute-domain slice per node, the device classes) is not the domains' cost.
            out["controller_startup_s"] = round(
                _until(
                    lambda: (
                        len(rest.list(SLICES, label_selector=f"{cd.TARGET_LABEL}=node")["items"])
                        >= args.nodes
                    ),
                    timeout=600,
                    step=1.0,
                ),
                1,
            )
            out["controller_cpu_startup_s"] = _cpu_seconds(controller.pid)
            print(json.dumps(out), file=sys.stderr, flush=True)  # kept if a later step fails
            time.sleep(2.0)
            # --domains 0: the scheduler rounds only (device-order work needs those
            # figures at full size, without the burst).
            if args.domains:
                _burst(cp, rest, args, names, out, controller.pid)

            cp.create_namespace("sched")
            # Alternating rounds (GPU-only first, then aligned first, ...), medians: the
            # machine's load drifts over minutes, and one pair measured in a fixed order
            # would charge the drift to one kind.
            rates: dict[bool, list[float]] = {False: [], True: []}
            for r in range(args.sched_rounds):
                for kind in (False, True) if r % 2 == 0 else (True, False):
                    rates[kind].append(_sched_rate(rest, "sched", args.sched_pods, kind, r))
            if args.sched_rounds:  # 0: the controller's figures only
                gpu_only = round(statistics.median(rates[False]), 2)
                aligned = round(statistics.median(rates[True]), 2)
                out["sched_rounds"] = {"gpu_only": rates[False], "aligned": rates[True]}
                out["sched_gpu_only_pods_per_s"] = gpu_only
                out["sched_aligned_pods_per_s"] = aligned
                out["aligned_ratio"] = round(aligned / gpu_only, 2) if gpu_only else None
            # The fleet metrics, computed at scrape time from the controller's caches.
            scrape = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as r:
                text = r.read().decode()
            out["fleet_metrics_scrape_s"] = round(time.perf_counter() - scrape, 2)
            out["fleet_metrics_up"] = "fabricdra_fleet_up 1.0" in text
            out["controller_rss_mb"] = _peak_rss_mb(controller.pid)
            out["controller_memory_limit_mb"] = _memory_limit_mb()
            out["controller_cpu_total_s"] = _cpu_seconds(controller.pid)
            out["load_average_end"] = [round(x, 1) for x in os.getloadavg()]
            return out
        finally:
            if daemons is not None:
                daemons.stop.set()
            if controller is not None:
                controller.terminate()
                controller.wait(timeout=30)
            kcm.stop()
            scheduler.stop()
            cp.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__.split("\n")[0],
        epilog="Sizes: 1,000 nodes in NVL72 racks of 18 (56 racks, the last of 10), 50 "
        "domains of 18 nodes: each takes a whole rack. Setup writes about 5 objects per "
        "node; on a 2-core VM shared with other work start at --nodes 108 --domains 5 "
        "--per-domain 18. Every domain must fit one fabric domain: --per-domain <= "
        "--domain-size. --sim-only: the placement simulation alone.",
    )
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (default 1000)")
    parser.add_argument(
        "--domain-size",
        type=int,
        default=placesim.DOMAIN,
        help="nodes per NVLink fabric domain, consecutive (default 18: GB200 NVL72's trays)",
    )
    parser.add_argument(
        "--domains",
        type=int,
        default=50,
        help="ComputeDomains created at once (default 50; 0: only the scheduler rounds)",
    )
    parser.add_argument(
        "--per-domain",
        type=int,
        default=18,
        help="numNodes of each domain, and its pods, one per node (default 18)",
    )
    parser.add_argument(
        "--steady", type=float, default=60.0, help="seconds of steady state counted (default 60)"
    )
    parser.add_argument(
        "--sched-pods",
        type=int,
        default=200,
        help="pods per scheduler throughput run, GPU-only then GPU + NIC aligned (default 200)",
    )
    parser.add_argument(
        "--sched-rounds",
        type=int,
        default=2,
        help="alternating GPU-only / aligned rounds; the medians are reported (default 2; 0: none)",
    )
    parser.add_argument(
        "--setup-workers",
        type=int,
        default=8,
        help="threads writing the simulated Nodes and slices (default 8)",
    )
    parser.add_argument(
        "--gang-timeout",
        type=float,
        default=300.0,
        help="the controller's --gang-timeout-seconds (default 300)",
    )
    parser.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="create each job's second half of pods this many seconds after its first "
        "(default 0: all at once); past --gang-timeout, every gang times out once",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="give up (and print what is stuck) after this many seconds (default 1800)",
    )
    parser.add_argument(
        "--fabrics",
        type=int,
        default=0,
        help="the earlier runs' layout: nodes round robin over this many fabric domains "
        "(default 0: NVL72 racks of --domain-size)",
    )
    parser.add_argument(
        "--sim-nodes",
        type=int,
        default=0,
        help="nodes of the placement simulation (default: --nodes)",
    )
    parser.add_argument(
        "--sim-jobs", type=int, default=3000, help="jobs in the simulated arrival sequence"
    )
    parser.add_argument("--seed", type=int, default=1, help="the arrival sequence's seed")
    parser.add_argument(
        "--sim-only",
        action="store_true",
        help="run only the placement simulation (no control plane)",
    )
    args = parser.parse_args()
    if args.domain_size < 1 or args.nodes < 1:
        parser.error("--nodes and --domain-size must be positive")
    if args.per_domain > (args.nodes // args.fabrics if args.fabrics else args.domain_size):
        parser.error("--per-domain exceeds a fabric domain's nodes")
    sim = placesim.simulate(args.sim_nodes or args.nodes, args.sim_jobs, args.seed)
    if args.sim_only:
        print(json.dumps({"placement": sim}, indent=2))
        return
    print(json.dumps({**run(args), "placement": sim}, indent=2))


if __name__ == "__main__":
    main()
