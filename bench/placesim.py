"""Gang placement on a three-tier fabric, simulated in process (no API server): the same
seeded, mixed arrival sequence of whole-node jobs through fabricdra's placer and through a
first-fit flat placer, and what each leaves behind.

The fabric (issue 28 point 7): `nodes` trays; NVL72 NVLink domains of 18 trays (NVIDIA GB200
NVL72: 18 compute trays of 4 Blackwell GPUs each, 72 GPUs,
https://www.nvidia.com/en-us/data-center/gb200-nvl72/); rail-optimised blocks of 32 nodes under
one tier-1 (leaf) switch group (the DGX SuperPOD scalable unit of 32 nodes, each node's rails
to the SU's leaf switches:
https://docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-h100/latest/network-fabrics.html),
8 blocks (256 nodes) under a tier-2 spine, 4 spines (1,024 nodes) under a tier-3 core. The
18-node racks do not line up with 32-node blocks: a rack may straddle two leaves, as in
practice where racks and scalable units are planned apart.

Placers:
* `fabricdra`: a gang of up to one NVLink domain goes where `placement.best_fit` (the
  controller's own function) puts it, on that domain's free nodes; a gang larger than one
  domain goes where `hierarchy.place` (the spanning-gang placer, issue 28 points 1-2) puts it,
  in segments of `segment` nodes, when the placer has it (`SPANNING` says), else it is not
  placed at all (counted `unplaceable`).
* `flat`: the first `numNodes` free nodes in name order, whatever their domain or switch (a
  placer that sees no hierarchy).
Both retry every waiting job, in arrival order, whenever a job ends (backfill).

Figures: multi-domain jobs placed and the share of them kept under one tier-2 switch; single-
domain jobs split over NVLink domains (flat only: fabricdra never splits them); at the end of
the sequence, stranded GPUs (free GPUs on free nodes of NVLink domains that are partly taken:
no whole-rack job can use them), jobs waiting, and the largest whole-node segment left.
"""

from __future__ import annotations

import heapq
import importlib.util
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabricdra.controller.placement import best_fit

DOMAIN = 18  # NVL72: 18 compute trays
GPUS_PER_NODE = 4  # a GB200 compute tray: 2 Grace CPUs, 4 Blackwell GPUs
BLOCK = 32  # rail-optimised block (scalable unit) under one tier-1 leaf group
TIER2_BLOCKS = 8
TIER3_TIER2 = 4
SPANNING = importlib.util.find_spec("fabricdra.controller.hierarchy") is not None


def tiers_of(i: int) -> tuple[str, str, str]:
    """Node i's tier-1, tier-2, tier-3 switch (the bench's tier label values)."""
    return (
        f"leaf-{i // BLOCK:03d}",
        f"spine-{i // (BLOCK * TIER2_BLOCKS):02d}",
        f"core-{i // (BLOCK * TIER2_BLOCKS * TIER3_TIER2):02d}",
    )


def domain_of(i: int) -> str:
    return f"nvl72-{i // DOMAIN:04d}"


@dataclass(frozen=True)
class Job:
    name: str
    nodes: int
    segment: int  # nodes per NVLink-local segment (== nodes for one-domain jobs)
    arrive: float
    duration: float


def arrivals(nodes: int, count: int, seed: int) -> list[Job]:
    """A mixed sequence: mostly one-domain gangs of 1-18 nodes, a fifth multi-domain gangs of
    2-8 racks' worth in segments of 9 or 18; offered load about 95 % of the fleet."""
    rng = random.Random(seed)
    jobs = []
    sizes = []
    for _ in range(count):
        if rng.random() < 0.2:
            segment = rng.choice((9, 18))
            size = segment * rng.randint(max(2, 36 // segment), 144 // segment)
        else:
            size = rng.choice((1, 2, 4, 6, 8, 9, 12, 16, 17, 18))
            segment = size
        sizes.append((size, segment, rng.uniform(50, 150)))
    mean = sum(s for s, _, _ in sizes) / len(sizes)
    gap = mean * 100 / (0.95 * nodes)  # mean duration 100: offered nodes ~ 95 % of the fleet
    t = 0.0
    for k, (size, segment, duration) in enumerate(sizes):
        t += rng.expovariate(1 / gap)
        jobs.append(Job(f"job{k:05d}", size, segment, t, duration))
    return jobs


@dataclass
class Fleet:
    n: int
    free: list[bool] = field(init=False)
    doms: dict[str, list[int]] = field(init=False)
    holes: dict[str, int] = field(init=False)  # domain -> free nodes, kept as nodes change
    total: int = field(init=False)

    def __post_init__(self) -> None:
        self.free = [True] * self.n
        self.doms = {}
        for i in range(self.n):
            self.doms.setdefault(domain_of(i), []).append(i)
        self.holes = {d: len(m) for d, m in self.doms.items()}
        self.total = self.n

    def free_in(self, dom: str) -> list[int]:
        return [i for i in self.doms[dom] if self.free[i]]

    def set(self, nodes: list[int], free: bool) -> None:
        for i in nodes:
            self.free[i] = free
            self.holes[domain_of(i)] += 1 if free else -1
        self.total += len(nodes) if free else -len(nodes)


Placer = Callable[[Fleet, Job], list[int] | None]


def flat(fleet: Fleet, job: Job) -> list[int] | None:
    if fleet.total < job.nodes:
        return None
    picked = [i for i in range(fleet.n) if fleet.free[i]][: job.nodes]
    return picked if len(picked) == job.nodes else None


def fabricdra(fleet: Fleet, job: Job) -> list[int] | None:
    if fleet.total < job.nodes:
        return None
    holes = dict(fleet.holes)
    if job.nodes <= DOMAIN:
        dom = best_fit(job.nodes, holes)
        return None if dom is None else fleet.free_in(dom)[: job.nodes]
    if not SPANNING:
        return None
    hierarchy = _hierarchy()
    switches = _switches(fleet)
    plan = hierarchy.place(job.nodes, holes, switches, atom=job.segment)
    if not isinstance(plan, hierarchy.Plan):
        return None
    return [i for d, k in sorted(plan.shares.items()) for i in fleet.free_in(d)[:k]]


_SWITCHES: dict[int, Any] = {}


def _hierarchy() -> Any:
    """The spanning-gang placer module (issue 28 points 1-2), where this tree has it."""
    return importlib.import_module("fabricdra.controller.hierarchy")


def _switches(fleet: Fleet) -> Any:
    """hierarchy.Switches of the fleet (fixed: built once per fleet size)."""
    hierarchy = _hierarchy()
    if fleet.n not in _SWITCHES:
        _SWITCHES[fleet.n] = hierarchy.Switches(
            {d: _domain_tiers(members) for d, members in fleet.doms.items()}
        )
    return _SWITCHES[fleet.n]


def _domain_tiers(members: Sequence[int]) -> tuple[str | None, ...]:
    """A domain's switch per tier: the one its nodes share, else None (straddles two)."""
    out: list[str | None] = []
    for t in range(3):
        seen = {tiers_of(i)[t] for i in members}
        out.append(seen.pop() if len(seen) == 1 else None)
    return tuple(out)


def run(nodes: int, jobs: list[Job], placer: Placer) -> dict[str, Any]:
    fleet = Fleet(nodes)
    ending: list[tuple[float, str, list[int]]] = []
    waiting: list[Job] = []
    placed: dict[str, list[int]] = {}

    def try_place(job: Job, now: float) -> bool:
        got = placer(fleet, job)
        if got is None:
            return False
        fleet.set(got, False)
        placed[job.name] = got
        heapq.heappush(ending, (now + job.duration, job.name, got))
        return True

    now = 0.0
    for job in jobs:
        now = job.arrive
        freed = False
        while ending and ending[0][0] <= now:
            _, _, got = heapq.heappop(ending)
            fleet.set(got, True)
            freed = True
        if freed:
            waiting = [w for w in waiting if not try_place(w, now)]
        if not try_place(job, now):
            waiting.append(job)
    multi = [j for j in jobs if j.nodes > DOMAIN]
    multi_placed = [j for j in multi if j.name in placed]
    under_t2 = sum(1 for j in multi_placed if len({tiers_of(i)[1] for i in placed[j.name]}) == 1)
    single = [j for j in jobs if 1 < j.nodes <= DOMAIN and j.name in placed]
    split = sum(1 for j in single if len({domain_of(i) for i in placed[j.name]}) > 1)
    stranded = 0
    largest = 0
    for members in fleet.doms.values():
        free = sum(1 for i in members if fleet.free[i])
        largest = max(largest, free)
        if 0 < free < len(members):
            stranded += free * GPUS_PER_NODE
    return {
        "jobs": len(jobs),
        "placed": len(placed),
        "multi_domain_jobs": len(multi),
        "multi_domain_placed": len(multi_placed),
        "multi_domain_under_one_tier2": under_t2,
        "multi_domain_under_one_tier2_share": round(under_t2 / len(multi_placed), 3)
        if multi_placed
        else None,
        "single_domain_gangs_split_over_nvlink_domains": split,
        "waiting_at_end": len(waiting),
        "stranded_gpus_at_end": stranded,
        "free_gpus_at_end": sum(fleet.free) * GPUS_PER_NODE,
        "largest_free_segment_at_end": largest,
    }


def simulate(nodes: int, count: int, seed: int) -> dict[str, Any]:
    jobs = arrivals(nodes, count, seed)
    return {
        "sim_nodes": nodes,
        "sim_nvlink_domains": (nodes + DOMAIN - 1) // DOMAIN,
        "sim_tier1_blocks": (nodes + BLOCK - 1) // BLOCK,
        "sim_seed": seed,
        "spanning_placer": SPANNING,
        "fabricdra": run(nodes, jobs, fabricdra),
        "flat_first_fit": run(nodes, jobs, flat),
    }
