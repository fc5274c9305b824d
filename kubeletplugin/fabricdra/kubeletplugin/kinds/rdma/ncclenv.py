"""NCCL_IB_HCA for the RDMA devices prepare hands out: one list per claim, the same in every CDI
device that carries it, so no runtime's order of applying CDI devices can shrink it.

Why one list per claim, not per request: CDI environment is last-wins, and kubelet gives a
container that uses a whole claim the CDI ids of *every* device of the claim (request name
empty), a container bound to one request those of that request's devices (and of devices with
no request names). Whatever a one-request container can be given, a whole-claim container is
given too; so if two of a claim's devices carried different lists, some order would leave the
whole-claim container with one request's list: NCCL would silently use one NIC of eight. Every
list a claim's devices carry is therefore the whole claim's list, in one claim-level CDI device
(`rdma-<claim uid>`, with `/dev/infiniband/rdma_cm`) that every RDMA device of the claim
includes. A container bound to one request is told the other requests' HCA names too; it gets
no verbs device for them, and NCCL skips an HCA it cannot open (docs/kubelet-plugin.md cites
the source), so it uses exactly its own.

Several claims of one pod: each claim's list is widened to the pod's (the union over the
prepared claims of this driver that share a consumer pod, from the checkpoint), and the specs of
those already prepared are rewritten to it, so a container using several of them sees the same
list whatever order they are applied in. kubelet prepares a pod's claims of one driver in one
call, one after the other, so the last one prepared widens all of them before kubelet creates a
container.

A claim of a PodGroup (KEP-5729: `reservedFor` names the group, `scheduling.k8s.io`
`podgroups`, not its pods) is a companion of the claims of the group's pods: the pods a claim is
reserved for are read (`spec.schedulingGroup.podGroupName`) and their group recorded beside
their UIDs (`consumers`). Two pods' own claims are not companions because the pods share a
group: only a claim of the group links them to it.

Names are exact (`=` prefix: NCCL otherwise matches prefixes, `mlx5_1` also selecting
`mlx5_10` ... `mlx5_17`) and in natural order (`mlx5_2` before `mlx5_10`), so equal sets give
equal strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...kubelet import PrepareError
from ...kubelet.cdi import write_atomic
from ...kubelet.checkpoint import ClaimEntry

VAR = "NCCL_IB_HCA"
# claims whose NICs all have a measured rail (kinds/rdma/__init__.py)
CROSS_NIC_OFF = "NCCL_CROSS_NIC=0"
_PREFIX = f"{VAR}=="  # the variable, then NCCL's "exact names" marker
_DIGITS = re.compile(r"(\d+)")


def claim_device(claim_uid: str) -> str:
    """The claim-level CDI device: NCCL_IB_HCA and rdma_cm, once per claim."""
    return f"rdma-{claim_uid}"


def ordered(names: Iterable[str]) -> list[str]:
    """Distinct names in natural order: mlx5_2 < mlx5_10."""
    # split() with a group alternates text and digits, so the keys always compare like with like
    return sorted(set(names), key=_natural)


def _natural(name: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in _DIGITS.split(name)]


def env(names: Iterable[str]) -> str:
    return _PREFIX + ",".join(ordered(names))


def names_in(env_entries: Iterable[str]) -> set[str]:
    """The HCA names every NCCL_IB_HCA entry among `env_entries` selects (exact form only:
    the only form prepare writes)."""
    out: set[str] = set()
    for e in env_entries:
        if e.startswith(_PREFIX):
            out.update(n for n in e[len(_PREFIX) :].split(",") if n)
    return out


# How a checkpoint entry's `consumers` name what is not a pod's UID (a UID has no colon).
GROUP = "podgroup:"  # the claim is reserved for this PodGroup: podgroup:<namespace>/<name>
MEMBER = "in-podgroup:"  # a pod it is reserved for belongs to this PodGroup


def reserved_pods(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The `reservedFor` entries of the claim that name a Pod (core group, `pods`)."""
    return [
        r
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if isinstance(r, dict) and r.get("resource") == "pods" and not r.get("apiGroup")
    ]


def reserved_groups(claim: dict[str, Any]) -> list[str]:
    """The PodGroups (KEP-5729) the claim is reserved for, as `<namespace>/<name>`."""
    namespace = (claim.get("metadata") or {}).get("namespace", "")
    return [
        f"{namespace}/{r['name']}"
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if isinstance(r, dict)
        and r.get("resource") == "podgroups"
        and r.get("apiGroup") == "scheduling.k8s.io"
        and r.get("name")
    ]


def consumers(claim: dict[str, Any], pod_groups: Mapping[str, str | None]) -> tuple[str, ...]:
    """What the claim is reserved for, as the checkpoint records it: its pods' UIDs, its
    PodGroups (`GROUP`) and the groups of its pods (`MEMBER`; `pod_groups`: pod name -> group
    name, for the pods that were read)."""
    namespace = (claim.get("metadata") or {}).get("namespace", "")
    pods = reserved_pods(claim)
    out = [str(r["uid"]) for r in pods if r.get("uid")]
    out += [GROUP + g for g in reserved_groups(claim)]
    for r in pods:
        group = pod_groups.get(str(r.get("name")))
        if group:
            out.append(f"{MEMBER}{namespace}/{group}")
    return tuple(dict.fromkeys(out))


def _split(consumers: Iterable[str]) -> tuple[set[str], set[str], set[str]]:
    pods, groups, members = set(), set(), set()
    for c in consumers:
        if c.startswith(GROUP):
            groups.add(c[len(GROUP) :])
        elif c.startswith(MEMBER):
            members.add(c[len(MEMBER) :])
        else:
            pods.add(c)
    return pods, groups, members


def linked(a: Iterable[str], b: Iterable[str]) -> bool:
    """Whether one pod may use claims with these consumers together: a pod in both, a
    PodGroup in both, or one claim's group holding a pod of the other."""
    pods_a, groups_a, members_a = _split(a)
    pods_b, groups_b, members_b = _split(b)
    return bool(pods_a & pods_b or groups_a & (groups_b | members_b) or members_a & groups_b)


def companions(
    entries: Iterable[ClaimEntry], claim_uid: str, consumers: Sequence[str]
) -> list[ClaimEntry]:
    """Prepared claims (other than `claim_uid`) a pod of this claim may use with it
    (`linked`)."""
    if not consumers:
        return []
    return [e for e in entries if e.uid != claim_uid and linked(consumers, e.consumers)]


def pod_hcas(
    entries: Iterable[ClaimEntry],
    claim_uid: str,
    claim: dict[str, Any],
    own: Iterable[str | None],
    pod_groups: Mapping[str, str | None] | None = None,
) -> tuple[list[str], list[str]]:
    """The names the NCCL_IB_HCA of claim `claim_uid` (the ResourceClaim `claim`, whose RDMA
    devices are `own`) selects: its own and those of the prepared claims a pod of it may use
    with it; and the spec files of those claims, to `widen_all` to them. ([], []) for a claim
    without RDMA devices: it carries no list."""
    names = {n for n in own if n}
    if not names:
        return [], []
    specs = []
    for entry in companions(entries, claim_uid, consumers(claim, pod_groups or {})):
        for path in entry.cdi_specs:
            theirs = spec_hcas(path)
            if theirs:
                names |= theirs
                specs.append(path)
    return ordered(names), specs


def widen_all(spec_paths: Iterable[str], names: Sequence[str]) -> None:
    """`widen` each spec; called before the claim's own spec is recorded, so a failure leaves
    nothing of that claim behind (and kubelet's retry prepares it afresh)."""
    for path in spec_paths:
        try:
            widen(path, names)
        except OSError as e:
            raise PrepareError(f"cannot widen NCCL_IB_HCA in {path}: {e}") from None


def spec_hcas(spec_path: str | Path) -> set[str]:
    """The HCA names a written spec's NCCL_IB_HCA entries select; none for a spec that cannot
    be read (it carries no list a container could see either)."""
    doc = _read(Path(spec_path))
    if doc is None:
        return set()
    return names_in(e for d in _devices(doc) for e in _env(d))


def widen(spec_path: str | Path, names: Iterable[str]) -> bool:
    """Rewrite every NCCL_IB_HCA entry of a written spec to select `names` as well (also the
    per-request devices of specs written by earlier versions). True when the file changed.
    Raises OSError when it cannot be rewritten."""
    path = Path(spec_path)
    doc = _read(path)
    if doc is None:
        return False
    current = names_in(e for d in _devices(doc) for e in _env(d))
    if not current or current.issuperset(names):
        return False  # no list to widen, or wide enough already
    value = env(current.union(names))
    for d in _devices(doc):
        edits = d.get("containerEdits")
        if isinstance(edits, dict) and isinstance(edits.get("env"), list):
            edits["env"] = [value if str(e).startswith(_PREFIX) else e for e in edits["env"]]
    # The same form as CdiWriter.write: compact, sorted keys, atomic rename.
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    write_atomic(path, data, durable=False)
    return True


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _devices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in doc.get("devices") or [] if isinstance(d, dict)]


def _env(device: dict[str, Any]) -> list[str]:
    edits = device.get("containerEdits")
    if not isinstance(edits, dict):
        return []
    return [str(e) for e in edits.get("env") or []]
