"""How the multi-node NVLink check runs in the cluster (fabriccheck.py decides when, and what
the result means for the nodes).

NVIDIA validates multi-node NVLink with nvbandwidth built with `-DMULTINODE=1`, testcase
`multinode_device_to_device_memcpy_read_ce`, launched by MPI with one rank per GPU inside an
IMEX domain (NVIDIA MNNVL user guide, "Multinode Testing":
https://docs.nvidia.com/multi-node-nvlink-systems/mnnvl-user-guide/testing.html; NVIDIA GPU
Operator docs, ComputeDomains, "nvbandwidth-test-job.yaml": an MPIJob whose launcher runs
`mpirun ... nvbandwidth -t multinode_device_to_device_memcpy_read_ce` over workers that share
a ComputeDomain's channel claim). Here with the driver's own pieces, in the release namespace,
all named `fabricdra-fabric-check-<hash of the fabric domain>` (`<run>`):

1. a ComputeDomain `<run>` (elastic: no numNodes, so gang placement, which waits for the very
   label this check writes, does not hold it) whose channel ResourceClaimTemplate
   `<run>-channel` the controller then creates as for any domain: IMEX is set up across the
   trays exactly as for a workload;
2. a Secret `<run>-ssh`: a one-off Ed25519 key pair (sshkey.py) and its authorized_keys;
3. a headless Service `<run>` (publishNotReadyAddresses), so worker i is `w<i>.<run>`;
4. one worker pod per node, pinned by a node selector on `kubernetes.io/hostname` (the
   scheduler must place it: it allocates the domain's channel claim), privileged with every
   GPU (as the per-node verification pod), running sshd on port 2222 with the public key;
5. once every worker runs (it has its pod IP), a launcher pod that waits for every worker's
   sshd and runs `mpirun` over them, one rank per GPU (`--map-by ppr:<GPUs>:node`), with
   `nvbandwidth-multinode -t multinode_device_to_device_memcpy_read_ce` (nvbandwidth built with
   -DMULTINODE=1, beside the single-node build the per-node probes run); its log is the result.
   The launcher names the workers `w<i>.<run>` through `hostAliases` (its /etc/hosts) with
   their pod IPs, not through cluster DNS: the check then needs no DNS add-on and no search
   path that resolves the Service's subdomain (the harness has no CoreDNS; some clusters run
   without one for the namespace's pods). The Service stays for clusters' tools that list the
   workers by it.

The pods, Service and Secret are owned by the ComputeDomain (ownerReferences): the check
deletes the pods, then the ComputeDomain, and the garbage collector takes the rest. A
controller that stopped mid-check leaves them; the next leader deletes every ComputeDomain
labelled `fabricdra.io/fabric-check-run` (and its pods) before its first check.

The output (nvbandwidth's multinode format, the example in NVIDIA's GPU Operator
ComputeDomain docs and github.com/NVIDIA/nvbandwidth README):

    Process 0 (w0): device 0: HGX GB200 (00000008:01:00)
    ...
    Running multinode_device_to_device_memcpy_read_ce.
    memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)
              0         1 ...
    0       N/A    798.02 ...
    SUM multinode_device_to_device_memcpy_read_ce 44685.29

Rows and columns are MPI ranks; the `Process` lines name each rank's host (the worker pod's
hostname, so its node) and device. Every pair of GPUs on different nodes is held to the
device class's `gpuBandwidthGBs`; a cross-node pair reported `N/A` (no path) fails.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fabricdra.api import computedomain as cd
from fabricdra.api.jsontypes import JSON
from fabricdra.kube.rest import COMPUTE_DOMAINS, PODS, SECRETS, SERVICES, ApiError, Kind, NotFound

from . import fabricloss, sshkey
from .fabriccheck import CheckResult

log = logging.getLogger("fabricdra.controller")

TESTCASE = "multinode_device_to_device_memcpy_read_ce"
# nvbandwidth built with -DMULTINODE=1, installed beside the single-node build the per-node
# probes run (deployments/verification/Containerfile.nvidia).
PROGRAM = "nvbandwidth-multinode"
RUN_LABEL = "fabricdra.io/fabric-check-run"  # on everything a check creates: the run's name
DOMAIN_LABEL = "fabricdra.io/fabric-check-domain"  # and its fabric domain's hash
SSH_PORT = 2222
KEY_DIR = "/etc/fabric-check"
START_SECONDS = 300.0  # pulling the image and setting up IMEX, on top of the run's timeout


@dataclass(frozen=True)
class RunSettings:
    """The controller's settings for the check's pods (the chart's `verification.*`)."""

    image: str = ""  # the verification image: nvbandwidth-multinode, mpirun, sshd
    namespace: str = "fabricdra-system"  # the release namespace
    timeout_seconds: float = 600.0  # the whole MPI run, once the pods are up
    imex_mode: str = "managed"  # the check's ComputeDomain's imexMode
    runtime_class: str = ""  # e.g. `nvidia` (injects the driver's libraries)


def domain_hash(fabric: str) -> str:
    return hashlib.sha256(fabric.encode()).hexdigest()[:10]


def run_name(fabric: str, run_id: str) -> str:
    """One run's name: its domain's hash and the run's own id (a controller that lost the
    lead mid-run deletes its own run's objects, never a newer leader's run of that domain)."""
    return f"fabricdra-fabric-check-{domain_hash(fabric)}-{run_id}"


# --- the objects (pure) ------------------------------------------------------------------


def worker_script(port: int = SSH_PORT) -> str:
    """sshd for mpirun, with the pod's environment (what the runtime and CDI injected) kept for
    the ranks it starts (PermitUserEnvironment)."""
    return "\n".join(
        [
            "set -e",
            "mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh",
            f"cp {KEY_DIR}/authorized_keys /root/.ssh/authorized_keys",
            "chmod 600 /root/.ssh/authorized_keys",
            "env | grep -v '^HOME=' > /root/.ssh/environment",
            "ssh-keygen -A >/dev/null",
            f"exec /usr/sbin/sshd -D -e -p {port} -o PermitRootLogin=prohibit-password "
            "-o PasswordAuthentication=no -o PermitUserEnvironment=yes",
        ]
    )


def launcher_script(
    hosts: Sequence[str],
    gpus: int,
    timeout: float,
    port: int = SSH_PORT,
    program: Sequence[str] = (PROGRAM, "-t", TESTCASE),
) -> str:
    """Wait for every worker's sshd, then `program` (nvbandwidth's testcase; the measured
    loss: all_reduce_perf, fabricloss.py) with one rank per GPU over all of them."""
    ssh = (
        f"-p {port} -i /root/.ssh/id_ed25519 -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
    )
    wait = (
        f"for h in {' '.join(hosts)}; do "
        f"until ssh {ssh} -o ConnectTimeout=5 $h true; do sleep 2; done; done"
    )
    mpirun = [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        str(gpus * len(hosts)),
        "--host",
        ",".join(f"{h}:{gpus}" for h in hosts),
        "--map-by",
        f"ppr:{gpus}:node",
        "--bind-to",
        "none",
        "--mca",
        "plm_rsh_args",
        ssh,
        *program,
    ]
    return "\n".join(
        [
            "set -e",
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh",
            f"cp {KEY_DIR}/id_ed25519 /root/.ssh/id_ed25519 && chmod 600 /root/.ssh/id_ed25519",
            wait,
            f"exec timeout {int(timeout)} " + " ".join(shlex.quote(a) for a in mpirun),
        ]
    )


def objects(
    fabric: str,
    nodes: Sequence[str],
    gpus: int,
    settings: RunSettings,
    key: tuple[str, str],
    run_id: str = "0",
    *,
    program: Sequence[str] = (PROGRAM, "-t", TESTCASE),
    multiple_cliques: bool = False,
) -> dict[str, list[JSON]]:
    """Kind plural -> the bodies of one check, the ComputeDomain first (the others are owned
    by it: their ownerReferences get its UID once it exists, `own`). `multiple_cliques`: its
    nodes may be in several NVLink domains, each node's clique its own IMEX domain (the
    measured loss's split run: nothing crosses between the trays over NVLink)."""
    name, ns = run_name(fabric, run_id), settings.namespace
    meta_labels = {
        "app.kubernetes.io/name": "fabricdra",
        "app.kubernetes.io/component": "fabric-check",
        RUN_LABEL: name,
        DOMAIN_LABEL: domain_hash(fabric),
    }

    def meta(obj_name: str, **extra: str) -> JSON:
        return {"name": obj_name, "namespace": ns, "labels": {**meta_labels, **extra}}

    domain: JSON = {
        "apiVersion": cd.API_VERSION,
        "kind": cd.KIND,
        "metadata": meta(name),
        "spec": {
            "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}},
            "imexMode": settings.imex_mode,
            **({"allowMultipleCliques": True} if multiple_cliques else {}),
        },
    }
    private, public = key
    secret: JSON = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(f"{name}-ssh"),
        "type": "Opaque",
        "stringData": {"id_ed25519": private, "authorized_keys": public},
    }
    service = _service(meta(name), name)

    def pod(pod_name: str, role: str, script: str, extra: JSON) -> JSON:
        metadata = meta(pod_name, **{"fabricdra.io/fabric-check-role": role})
        return _pod(settings, name, metadata, role, script, extra)

    hosts = [f"w{i}.{name}" for i in range(len(nodes))]
    workers = [
        pod(
            f"{name}-w{i}",
            "worker",
            worker_script(),
            {
                "hostname": f"w{i}",
                "subdomain": name,
                # Not nodeName: the scheduler must allocate the domain's channel claim.
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [
                    {"name": "imex", "resourceClaimTemplateName": f"{name}-channel"}
                ],
            },
        )
        for i, node in enumerate(nodes)
    ]
    launcher = pod(
        f"{name}-launcher",
        "launcher",
        launcher_script(hosts, gpus, settings.timeout_seconds, program=program),
        {},
    )
    return {
        COMPUTE_DOMAINS.plural: [domain],
        SECRETS.plural: [secret],
        SERVICES.plural: [service],
        PODS.plural: [*workers, launcher],
    }


def _service(metadata: JSON, run: str) -> JSON:
    """The headless Service that names check `run`'s workers `w<i>.<run>` in DNS."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # DNS before sshd is up: the launcher waits
            "selector": {RUN_LABEL: run, "fabricdra.io/fabric-check-role": "worker"},
            "ports": [{"name": "ssh", "port": SSH_PORT}],
        },
    }


def _pod(
    settings: RunSettings, run: str, metadata: JSON, role: str, script: str, extra: JSON
) -> JSON:
    """One pod of check `run`: a worker (privileged, every GPU, the domain's channel, sshd)
    or the launcher; `extra`: its placement fields."""
    spec: JSON = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "activeDeadlineSeconds": int(settings.timeout_seconds + START_SECONDS),
        "tolerations": [{"operator": "Exists"}],
        "volumes": [{"name": "ssh", "secret": {"secretName": f"{run}-ssh", "defaultMode": 0o400}}],
        **extra,
    }
    container: JSON = {
        "name": role,
        "image": settings.image,
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "ssh", "mountPath": KEY_DIR, "readOnly": True}],
    }
    if role == "worker":
        container["securityContext"] = {"privileged": True}
        # NVIDIA's container runtime injects every GPU and the driver's libraries, as for
        # the per-node verification pod.
        container["env"] = [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ]
        container["resources"] = {"claims": [{"name": "imex"}]}
        container["ports"] = [{"name": "ssh", "containerPort": SSH_PORT}]
    spec["containers"] = [container]
    if settings.runtime_class and role == "worker":
        spec["runtimeClassName"] = settings.runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def with_workers(launcher: JSON, ips: Sequence[str]) -> JSON:
    """The launcher resolving worker i's name `w<i>.<run>` to its pod IP `ips[i]`."""
    run = launcher["metadata"]["labels"][RUN_LABEL]
    aliases = [{"ip": ip, "hostnames": [f"w{i}.{run}"]} for i, ip in enumerate(ips)]
    return {**launcher, "spec": {**launcher["spec"], "hostAliases": aliases}}


def own(body: JSON, domain: JSON) -> JSON:
    """`body` owned by the check's ComputeDomain (deleted with it by the garbage collector)."""
    ref = {
        "apiVersion": cd.API_VERSION,
        "kind": cd.KIND,
        "name": domain["metadata"]["name"],
        "uid": domain["metadata"]["uid"],
    }
    return {**body, "metadata": {**body["metadata"], "ownerReferences": [ref]}}


# --- the output (pure) -------------------------------------------------------------------

_PROCESS = re.compile(r"^\s*Process (\d+) \(([^)]*)\): device (\d+)")
_TITLE = re.compile(r"^\s*memcpy CE GPU\(row\) (<-|->) GPU\(column\) bandwidth \(GB/s\)")


@dataclass(frozen=True)
class Matrix:
    ranks: dict[int, tuple[str, int]]  # rank -> (host, device)
    arrow: str  # `<-` or `->`, as the title prints it
    values: dict[tuple[int, int], float | None]  # (row, column) -> GB/s; None: N/A


def parse(output: str) -> Matrix | None:
    """nvbandwidth's multinode output: the ranks' hosts and the testcase's matrix (None when
    the testcase's matrix is not there: it did not run)."""
    ranks: dict[int, tuple[str, int]] = {}
    lines = output.splitlines()
    for line in lines:
        m = _PROCESS.match(line)
        if m:
            ranks[int(m.group(1))] = (m.group(2), int(m.group(3)))
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == f"Running {TESTCASE}.")
    except StopIteration:
        return None
    title = next((i for i in range(start + 1, len(lines)) if _TITLE.match(lines[i])), None)
    if title is None or title + 1 >= len(lines):
        return None
    arrow = _TITLE.match(lines[title]).group(1)  # type: ignore[union-attr]
    columns = [int(c) for c in lines[title + 1].split()]
    values: dict[tuple[int, int], float | None] = {}
    for line in lines[title + 2 :]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        row = int(cells[0])
        for col, cell in zip(columns, cells[1:], strict=False):
            try:
                values[(row, col)] = float(cell)
            except ValueError:
                values[(row, col)] = None  # N/A
    return Matrix(ranks, arrow, values)


def judge(matrix: Matrix, host_nodes: Mapping[str, str], threshold_gbs: float) -> CheckResult:
    """Every pair of GPUs on different nodes against the floor."""
    if not matrix.ranks:
        return CheckResult("NotRun", "nvbandwidth named no rank's host (no `Process` lines)")

    def where(rank: int) -> tuple[str, str]:
        host, device = matrix.ranks[rank]
        node = host_nodes.get(host.split(".")[0], host)
        return node, f"{node}/GPU {device}"

    cross: list[tuple[float | None, int, int]] = []
    for (row, col), gbs in matrix.values.items():
        if row == col or row not in matrix.ranks or col not in matrix.ranks:
            continue
        if where(row)[0] != where(col)[0]:
            cross.append((gbs, row, col))
    if not cross:
        return CheckResult("NotRun", "the matrix has no GPU pair across nodes")
    measured = [c for c in cross if c[0] is not None]
    missing = [c for c in cross if c[0] is None]
    low = [c for c in measured if c[0] is not None and c[0] < threshold_gbs]

    def pair(row: int, col: int) -> str:
        return f"{where(row)[1]} {matrix.arrow} {where(col)[1]}"

    minimum = min((c[0] for c in measured if c[0] is not None), default=None)
    if missing:
        _, row, col = missing[0]
        return CheckResult(
            "Failed",
            f"{pair(row, col)}: N/A (no path between them; {len(missing)} of {len(cross)} "
            "cross-node pairs)",
            minimum,
            pair(row, col),
            (where(row)[0], where(col)[0]),
        )
    worst_gbs, row, col = min(measured, key=lambda c: c[0] or 0.0)
    assert worst_gbs is not None
    if low:
        return CheckResult(
            "Failed",
            f"{pair(row, col)}: {worst_gbs:.2f} GB/s, below {threshold_gbs:g} GB/s "
            f"({len(low)} of {len(cross)} cross-node pairs below)",
            worst_gbs,
            pair(row, col),
            (where(row)[0], where(col)[0]),
        )
    return CheckResult(
        "Passed",
        f"{len(cross)} cross-node GPU pairs at {worst_gbs:.2f} GB/s or more "
        f"(floor {threshold_gbs:g} GB/s)",
        worst_gbs,
        pair(row, col),
    )


# --- the run (I/O) -----------------------------------------------------------------------


class _Api(Protocol):
    def get(self, kind: Kind, name: str, namespace: str | None = None) -> JSON: ...

    def list(
        self, kind: Kind, namespace: str | None = None, *, label_selector: str | None = None
    ) -> JSON: ...

    def create(self, kind: Kind, body: JSON, namespace: str | None = None) -> JSON: ...

    def call(self, method: str, path: str, *, body: Any = None) -> JSON: ...

    def text(self, path: str, *, query: Mapping[str, Any] | None = None) -> str: ...


_KINDS = {COMPUTE_DOMAINS.plural: COMPUTE_DOMAINS, SECRETS.plural: SECRETS,
          SERVICES.plural: SERVICES, PODS.plural: PODS}  # fmt: skip


class KubeRunner:
    """Runs the check in the cluster (the module docstring)."""

    def __init__(
        self,
        rest: _Api,
        settings: RunSettings,
        *,
        poll_seconds: float = 5.0,
        start_seconds: float = START_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        new_key: Callable[[], tuple[str, str]] = sshkey.new_pair,
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        """`stopped`: the controller is stopping (it lost the lead): stop waiting."""
        self.rest, self.settings = rest, settings
        self.poll_seconds, self.start_seconds = poll_seconds, start_seconds
        self.sleep, self.clock, self.new_key = sleep, clock, new_key
        self.stopped = stopped

    def run(self, fabric: str, gpus: Mapping[str, int], threshold_gbs: float) -> CheckResult:
        if not self.settings.image:
            return CheckResult(
                "NotRun",
                "no verification image is configured to run it from (the chart's "
                "verification.image, the controller's --fabric-check-image)",
            )
        nodes = list(gpus)
        per_node = min(gpus.values()) if gpus else 0
        if per_node < 1:
            return CheckResult("NotRun", "a node of the check publishes no GPU")
        output, phase, why = self._launch(fabric, nodes, per_node)
        if output is None:
            return CheckResult("NotRun", why)
        matrix = parse(output)
        if matrix is None:
            tail = " | ".join(output.strip().splitlines()[-3:])
            return CheckResult(
                "NotRun", f"the launcher ({phase}) printed no {TESTCASE} matrix: {tail[-300:]}"
            )
        return judge(matrix, {f"w{i}": n for i, n in enumerate(nodes)}, threshold_gbs)

    def all_reduce(
        self, key: str, nodes: Sequence[str], per_node: int, *, multiple_cliques: bool
    ) -> tuple[str | None, str]:
        """The measured loss's run (fabricloss.py): nccl-tests all_reduce_perf over `nodes`,
        `per_node` ranks each, in the same kind of run as the check (its own ComputeDomain:
        one IMEX domain, or one per clique with `multiple_cliques`). Its output, else None and
        why it did not run. `key`: what names the run (a fabric domain and the placement)."""
        if not self.settings.image:
            return None, "no verification image is configured to run it from"
        if per_node < 1:
            return None, "a node of the run publishes no GPU"
        output, _, why = self._launch(
            key, list(nodes), per_node, program=fabricloss.command(),
            multiple_cliques=multiple_cliques,
        )  # fmt: skip
        return output, why

    def _launch(
        self,
        fabric: str,
        nodes: list[str],
        per_node: int,
        *,
        program: Sequence[str] = (PROGRAM, "-t", TESTCASE),
        multiple_cliques: bool = False,
    ) -> tuple[str | None, str, str]:
        """One run's objects created, its launcher's log read, everything deleted: (the log,
        the launcher's phase, ""), else (None, "", why not)."""
        ns = self.settings.namespace
        # An earlier try of this domain's check that was not deleted (an API error then).
        selector = f"{DOMAIN_LABEL}={domain_hash(fabric)}"
        for old in self.rest.list(COMPUTE_DOMAINS, ns, label_selector=selector)["items"]:
            self._delete_run(old["metadata"]["name"])
        run_id = uuid.uuid4().hex[:5]
        name = run_name(fabric, run_id)
        bodies = objects(
            fabric, nodes, per_node, self.settings, self.new_key(), run_id,
            program=program, multiple_cliques=multiple_cliques,
        )  # fmt: skip
        *workers, launcher = bodies[PODS.plural]
        try:
            domain = self.rest.create(COMPUTE_DOMAINS, bodies[COMPUTE_DOMAINS.plural][0], ns)
            for body in [*bodies[SECRETS.plural], *bodies[SERVICES.plural], *workers]:
                self.rest.create(_KINDS[f"{body['kind'].lower()}s"], own(body, domain), ns)
        except ApiError as e:
            self._delete_run(name)
            return None, "", f"could not create the check's objects: {e}"
        log.info("fabric check of %s started: %s over %s", fabric, name, ", ".join(nodes))
        try:
            ips, why = self._wait_workers([w["metadata"]["name"] for w in workers])
            if ips is None:
                waiting = self._workers_waiting(name)
                return (
                    None,
                    "",
                    (f"the check did not finish: {why}" + (f"; {waiting}" if waiting else "")),
                )
            self.rest.create(PODS, own(with_workers(launcher, ips), domain), ns)
            phase, why = self._wait(f"{name}-launcher", self.settings.timeout_seconds)
            if phase not in ("Succeeded", "Failed"):
                waiting = self._workers_waiting(name)
                return (
                    None,
                    "",
                    (f"the check did not finish: {why}" + (f"; {waiting}" if waiting else "")),
                )
            output = self.rest.text(
                PODS.path(ns, f"{name}-launcher", "log"), query={"container": "launcher"}
            )
        except ApiError as e:
            return None, "", f"could not follow the check: {e}"
        finally:
            self._delete_run(name)
        return output, phase, ""

    def cleanup(self) -> None:
        """Every check's objects an earlier controller left (it stopped mid-check)."""
        ns = self.settings.namespace
        found = self.rest.list(COMPUTE_DOMAINS, ns, label_selector=RUN_LABEL)["items"]
        for obj in found:
            log.info("deleting fabric check %s left by an earlier run", obj["metadata"]["name"])
            self._delete_run(obj["metadata"]["name"])

    def _delete_run(self, name: str) -> None:
        """Its pods first (they hold the domain's channel claims), then the ComputeDomain: the
        garbage collector deletes what it owns (Secret, Service)."""
        ns = self.settings.namespace
        try:
            pods = self.rest.list(PODS, ns, label_selector=f"{RUN_LABEL}={name}")["items"]
        except ApiError as e:
            log.warning("fabric check %s: listing its pods failed: %s", name, e)
            pods = []
        for pod in pods:
            self._delete(PODS, pod["metadata"]["name"])
        self._delete(COMPUTE_DOMAINS, name)

    def _delete(self, kind: Kind, name: str) -> None:
        try:
            self.rest.call(
                "DELETE",
                kind.path(self.settings.namespace, name),
                body={"gracePeriodSeconds": 0, "propagationPolicy": "Background"},
            )
        except NotFound:
            pass
        except ApiError as e:
            log.warning("fabric check: %s %s not deleted: %s", kind.plural, name, e)

    def _wait_workers(self, pods: Sequence[str]) -> tuple[list[str] | None, str]:
        """Every worker Running with its pod IP (the IPs, in order), else None and why."""
        deadline = self.clock() + self.start_seconds
        while True:
            ips: list[str] = []
            for pod in pods:
                try:
                    status = self.rest.get(PODS, pod, self.settings.namespace).get("status") or {}
                except NotFound:
                    return None, f"the worker pod {pod} was deleted"
                phase = status.get("phase") or "Pending"
                if phase in ("Succeeded", "Failed"):
                    return None, f"the worker pod {pod} ended ({phase})"
                if phase == "Running" and status.get("podIP"):
                    ips.append(status["podIP"])
            if len(ips) == len(pods):
                return ips, ""
            if self.clock() >= deadline:
                return None, f"the workers still not running after {self.start_seconds:g} s"
            if self.stopped():
                return None, "the controller is stopping"
            self.sleep(self.poll_seconds)

    def _wait(self, pod: str, timeout: float) -> tuple[str, str]:
        deadline = self.clock() + timeout + self.start_seconds
        while True:
            try:
                obj = self.rest.get(PODS, pod, self.settings.namespace)
            except NotFound:
                return "Gone", "the launcher pod was deleted"
            status = obj.get("status") or {}
            phase = status.get("phase") or "Pending"
            if phase in ("Succeeded", "Failed"):
                return phase, status.get("reason") or phase
            if self.clock() >= deadline:
                return phase, f"the launcher still {phase} after {timeout + self.start_seconds:g} s"
            if self.stopped():
                return phase, "the controller is stopping"
            self.sleep(self.poll_seconds)

    def _workers_waiting(self, name: str) -> str:
        """Why workers have not started (unschedulable, image pull), for the NotRun reason."""
        ns = self.settings.namespace
        pods = self.rest.list(PODS, ns, label_selector=f"{RUN_LABEL}={name}")["items"]
        out = []
        for pod in pods:
            status = pod.get("status") or {}
            if status.get("phase") == "Running":
                continue
            why = next(
                (
                    str(c.get("message") or c.get("reason"))
                    for c in status.get("conditions") or []
                    if c.get("status") == "False" and (c.get("message") or c.get("reason"))
                ),
                status.get("phase") or "Pending",
            )
            out.append(f"{pod['metadata']['name']}: {why}")
        return "; ".join(out)
