"""The controller's reconcilers and gang placement get the few collaborators they use, not the
whole Controller (issue 21 point 5): they are built here from their declared dependencies
alone, with in-memory caches and an in-memory API, and reconcile a domain and a node."""

from __future__ import annotations

import ast
import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api import computedomain as cd
from fabricdra.api.jsontypes import JSON
from fabricdra.controller import objects
from fabricdra.controller.deps import DomainDeps, NodeDeps, PlacementDeps
from fabricdra.controller.domains import DomainReconciler
from fabricdra.controller.indexes import BY_UID
from fabricdra.controller.liveness import Heartbeats
from fabricdra.controller.nodes import NodeReconciler
from fabricdra.controller.ownership import Ownership
from fabricdra.controller.placement import Placement
from fabricdra.controller.writes import Writer
from fabricdra.kube.rest import CLAIM_TEMPLATES, COMPUTE_DOMAINS, DAEMON_SETS, SLICES, Kind

PACKAGE = Path(__file__).resolve().parents[2] / "controller" / "fabricdra" / "controller"


@pytest.mark.parametrize(
    "module",
    ["domains.py", "nodes.py", "placement.py", "records.py", "fabriccheck.py", "fabriccheckrun.py"],
)
def test_reconciler_modules_do_not_know_the_controller(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text())
    imported = {
        (node.module or "", alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert [i for i in imported if i[0] in ("manager", "fabricdra.controller.manager")] == []
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "Controller" not in names


class MemCache:
    """The read side of an informer over a dict, with the indexes the reconcilers query."""

    def __init__(
        self,
        objs: list[JSON] | None = None,
        indexes: dict[str, Callable[[JSON], list[str]]] | None = None,
    ) -> None:
        self.objs = {self._key(o): o for o in objs or []}
        self.indexes = indexes or {}

    @staticmethod
    def _key(o: JSON) -> str:
        ns = o["metadata"].get("namespace")
        return f"{ns}/{o['metadata']['name']}" if ns else o["metadata"]["name"]

    def get(self, key: str) -> JSON | None:
        return self.objs.get(key)

    def items(self) -> list[JSON]:
        return list(self.objs.values())

    def by_index(self, name: str, value: str) -> list[JSON]:
        func = self.indexes.get(name)
        return [o for o in self.objs.values() if func is not None and value in func(o)]

    def index_values(self, name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.objs.values():
            for v in self.indexes[name](o) if name in self.indexes else []:
                out[v] = out.get(v, 0) + 1
        return out


def _merge(target: JSON, patch: JSON) -> JSON:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
    return target


class MemApi:
    """An in-memory API holding objects by (plural, namespace, name); merge patches only."""

    def __init__(self) -> None:
        self.store: dict[tuple[str, str | None, str], JSON] = {}
        self.version = 1

    def put(self, kind: Kind, obj: JSON) -> JSON:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        key = (kind.plural, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        self.store[key] = obj
        return copy.deepcopy(obj)

    def get(self, kind: Kind, name: str, namespace: str | None = None, **_: Any) -> JSON:
        return copy.deepcopy(self.store[(kind.plural, namespace, name)])

    def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> JSON | None:
        obj = self.store.get((kind.plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, kind: Kind, body: JSON, namespace: str | None = None, **_: Any) -> JSON:
        body = copy.deepcopy(body)
        if namespace:
            body["metadata"]["namespace"] = namespace
        return self.put(kind, body)

    def patch(
        self, kind: Kind, name: str, patch: Any, namespace: str | None = None, **_: Any
    ) -> JSON:
        live = self.get(kind, name, namespace)
        want = patch.get("metadata", {}).get("resourceVersion")
        assert want in (None, live["metadata"]["resourceVersion"]), "a stale write"
        return self.put(kind, _merge(live, patch))

    def list(self, kind: Kind, namespace: str | None = None, **_: Any) -> JSON:
        return {"items": []}

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> bool:
        return self.store.pop((kind.plural, namespace, name), None) is not None

    def replace(self, kind: Kind, name: str, body: JSON, namespace: str | None = None) -> JSON:
        return self.put(kind, body)

    def apply(self, *args: Any, **kwargs: Any) -> JSON:
        raise AssertionError("no claim to answer here")


def _placement(api: MemApi, domains: MemCache, nodes: MemCache, own: Ownership) -> Placement:
    return Placement(
        PlacementDeps(
            rest=api,
            domains=domains,
            nodes=nodes,
            claims=MemCache(),
            device_slices=MemCache(),
            allocations=MemCache(),
            ownership=own,
            require_verified_nodes=False,
            enqueue_domain=lambda key: None,
        )
    )


def node_deps(
    api: MemApi, domains: MemCache, nodes: MemCache, own: Ownership, **kw: Any
) -> NodeDeps:
    """The node reconciler's deps over in-memory ones (`kw`: the settings to change)."""
    deps = NodeDeps(
        rest=api,
        writer=Writer(api, "test"),  # type: ignore[arg-type]
        domains=domains,
        claims=MemCache(),
        nodes=nodes,
        slices=MemCache(),
        ownership=own,
        placement=_placement(api, domains, nodes, own),
        gang_timeout_seconds=300.0,
        require_synced=lambda: None,
        enqueue_domain=lambda key: None,
        enqueue_node=lambda key: None,
        enqueue_node_after=lambda key, delay: None,
    )
    return dataclasses.replace(deps, **kw)


def test_domain_reconciler_from_its_deps_alone() -> None:
    api = MemApi()
    live = api.create(
        COMPUTE_DOMAINS,
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "uid-a", "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}},
        },
    )
    domains, nodes, own = MemCache([live]), MemCache(), Ownership()
    own.set_key("uid-a", "team/job")
    requeued: list[tuple[str, float]] = []
    reconciler = DomainReconciler(
        DomainDeps(
            rest=api,
            writer=Writer(api, "test"),  # type: ignore[arg-type]
            domains=domains,
            claims=MemCache(),
            nodes=nodes,
            leases=MemCache(),
            templates=MemCache(),
            daemonsets=MemCache(),
            ownership=own,
            placement=_placement(api, domains, nodes, own),
            heartbeats=Heartbeats(),
            namespace="fabricdra-system",
            daemon=objects.DaemonSettings(),
            channel_count=cd.CHANNEL_COUNT,
            requeue_after=lambda key, delay: requeued.append((key, delay)),
        )
    )
    reconciler.reconcile("team/job")
    # Each write was conditional on what the previous one returned; the cache is not updated
    # by anything here, so the pass went on from the API's answers.
    stored = api.get(COMPUTE_DOMAINS, "job", "team")
    assert cd.FINALIZER in stored["metadata"]["finalizers"]
    assert stored["status"]["channels"] == [0]
    assert api.get_or_none(CLAIM_TEMPLATES, "job-imex", "team") is not None
    assert [k for k in api.store if k[0] == DAEMON_SETS.plural] != []  # managed mode
    assert requeued == []


def test_node_reconciler_from_its_deps_alone() -> None:
    api = MemApi()
    node = {"metadata": {"name": "n1", "uid": "node-uid", "labels": {}}}
    domains = MemCache(indexes={BY_UID: lambda o: [o["metadata"]["uid"]]})
    nodes, own = MemCache([node]), Ownership()
    synced: list[bool] = []
    reconciler = NodeReconciler(
        node_deps(api, domains, nodes, own, require_synced=lambda: synced.append(True))
    )
    reconciler.reconcile("n1")
    assert synced == [True]
    published = api.get(SLICES, objects.slice_name("n1"))
    channel = next(d for d in published["spec"]["devices"] if d["name"] == cd.CHANNEL_DEVICE)
    assert channel["attributes"][cd.ATTR_OWNER]["string"] == cd.FREE_OWNER
    assert own.owner("n1") == cd.FREE_OWNER
