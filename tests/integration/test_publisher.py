"""NodePublisher against a real kube-apiserver: writes counted from the audit log."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import ControlPlane
from fabricdra.api import crdgen
from fabricdra.api.nodedevices import CRD, NodeDevicesSpec
from fabricdra.kubeletplugin import metrics
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory
from fabricdra.kubeletplugin.discovery.node import Discovery, Previous, discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.prepare import ApiClaimReader
from fabricdra.kubeletplugin.publisher import NodePublisher
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100, write_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

REPO = Path(__file__).resolve().parents[2]
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
DRIVER = "devices.fabricdra.io"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Node:
    """One fake node: its sysfs tree, NVML snapshot and a publisher with its own user agent."""

    def __init__(self, cp: ControlPlane, root: Path, **hgx: Any) -> None:
        self.cp = cp
        self.name = _name("pub-node")
        self.root = root
        b = SysfsBuilder(root / "sys")
        self.hgx = hgx_h100(b, **hgx)
        self.sys = b.root
        snap = write_json(root / "nvml.json", h100_snapshot(self.hgx.gpus))
        self.readings = load_snapshot(snap)
        cp.create_node(self.name)
        self.publisher_count = 0
        self.api: Any = None
        self.new_publisher()

    def new_publisher(self) -> None:
        """A fresh publisher and client, as after a plugin restart."""
        if self.api is not None:
            self.api.close()
        self.publisher_count += 1
        self.agent = f"fabricdra-test-{self.name}-{self.publisher_count}"
        self.api = self.cp.api_client()
        self.api.user_agent = self.agent
        self.publisher = NodePublisher(self.api, self.name)

    def discover(self, previous: Discovery | None = None) -> Discovery:
        prev = Previous(previous.interfaces, previous.accelerators) if previous else None
        return discover(SysfsTree(str(self.sys)), nvml_source=lambda: self.readings, previous=prev)

    def writes(self, agent: str | None = None) -> list[dict[str, Any]]:
        return self.cp.audit_events(user_agent=agent or self.agent, verbs=WRITE_VERBS)

    def slices(self) -> list[Any]:
        with self.cp.api_client() as api:
            return list(
                client.ResourceV1Api(api)
                .list_resource_slice(field_selector=f"spec.nodeName={self.name}")
                .items
            )

    def node_devices(self) -> dict[str, Any] | None:
        with self.cp.api_client() as api:
            try:
                obj: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(
                    "fabricdra.io", "v1alpha1", "nodedevices", self.name
                )
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
            return obj

    def labels(self) -> dict[str, str]:
        with self.cp.api_client() as api:
            return dict(client.CoreV1Api(api).read_node(self.name).metadata.labels or {})

    def set_labels(self, labels: dict[str, str | None]) -> None:
        with self.cp.api_client() as api:
            client.CoreV1Api(api).patch_node(self.name, {"metadata": {"labels": labels}})


@pytest.fixture
def node(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Node]:
    n = Node(control_plane, tmp_path)
    yield n
    n.api.close()


def _inventory(d: Discovery, **kw: Any) -> DeviceInventory:
    assert d.interfaces is not None
    assert d.accelerators is not None
    return build_devices(d.interfaces, d.accelerators, **kw)


def test_publish_then_unchanged_passes_write_nothing(node: Node) -> None:
    d = node.discover()
    first = node.publisher.sync(d, _inventory(d))
    assert first.ok, first.errors
    assert first.writes == {"ResourceSlice": 1, "NodeDevices": 1, "Node": 1}
    (s,) = node.slices()
    assert s.spec.driver == DRIVER
    assert s.spec.pool.name == node.name
    assert s.spec.pool.resource_slice_count == 1
    assert len(s.spec.devices) == 16
    assert s.metadata.owner_references[0].kind == "Node"
    writes = len(node.writes())
    assert writes == 3

    # Second pass over the unchanged node (a fresh discovery, not the same objects).
    d2 = node.discover(previous=d)
    second = node.publisher.sync(d2, _inventory(d2))
    assert second.ok, second.errors
    assert second.writes == {}
    assert len(node.writes()) == writes

    # A restarted plugin (new publisher, new client) finds everything as it left it.
    node.new_publisher()
    third = node.publisher.sync(d2, _inventory(d2))
    assert third.ok, third.errors
    assert third.writes == {}
    assert node.writes() == []
    # ...and it did read the live objects (the comparison is against the server).
    assert node.cp.audit_events(user_agent=node.agent, verbs=("get", "list"))


def _metric() -> dict[tuple[str, str], float]:
    """fabricdra_api_writes_total by (kind, verb), as /metrics would serve it."""
    out = {}
    for family in metrics.REGISTRY.collect():
        if family.name == "fabricdra_api_writes":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[(sample.labels["kind"], sample.labels["verb"])] = sample.value
    return out


def _grew(before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0) for k, v in _metric().items() if v != before.get(k, 0)}


def _accepted(events: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """Writes the server accepted, by (resource, verb), from the audit log."""
    out: dict[tuple[str, str], int] = {}
    for e in events:
        if e.get("responseStatus", {}).get("code", 0) < 300:
            key = (e["objectRef"]["resource"], e["verb"])
            out[key] = out.get(key, 0) + 1
    return out


def test_the_node_agents_writes_are_counted_in_the_rest_layer(
    node: Node, control_plane: ControlPlane
) -> None:
    """Issue 11: the node agent's writes are counted where they are sent (`CountingRest`, as
    the controller's are): the metric, the pass's result and the API server's audit log agree,
    a pass that changes nothing counts 0, and a changed pass counts exactly its writes."""
    before = _metric()
    d = node.discover()
    first = node.publisher.sync(d, _inventory(d))
    assert first.ok, first.errors
    sent = {("resourceslices", "create"): 1, ("nodedevices", "create"): 1, ("nodes", "patch"): 1}
    assert node.publisher.rest.writes() == sent
    assert _accepted(node.writes()) == sent
    assert _grew(before) == {
        ("ResourceSlice", "create"): 1,
        ("NodeDevices", "create"): 1,
        ("Node", "patch"): 1,
    }

    unchanged = _metric()
    assert node.publisher.sync(node.discover(previous=d), _inventory(d)).writes == {}
    assert _grew(unchanged) == {}
    assert node.publisher.rest.total_writes() == 3

    # A stale managed label: the next pass removes it with one patch, and counts that one.
    node.set_labels({"fabricdra.io/rdma.stale": "x"})
    changed = _metric()
    result = node.publisher.sync(node.discover(previous=d), _inventory(d))
    assert result.writes == {"Node": 1}
    assert _grew(changed) == {("Node", "patch"): 1}
    assert _accepted(node.writes()) == {**sent, ("nodes", "patch"): 2}

    # Prepare's warning events are the node agent's writes too.
    namespace = _name("events")
    control_plane.create_namespace(namespace)
    claim = {"metadata": {"name": "c1", "namespace": namespace, "uid": str(uuid.uuid4())}}
    events = _metric()
    ApiClaimReader(node.api).warn(claim, "DeviceBusy", "test", 5.0)
    assert _grew(events) == {("Event", "create"): 1}
    assert _accepted(node.writes())[("events", "create")] == 1


def test_slices_deleted_by_kubelet_are_recreated(node: Node) -> None:
    d = node.discover()
    inv = _inventory(d, config=DeviceConfig(rdma_mode="shared"))
    node.publisher.sync(d, inv)
    (before,) = node.slices()
    with node.cp.api_client() as api:  # what kubelet does at start-up
        client.ResourceV1Api(api).delete_collection_resource_slice(
            field_selector=f"spec.nodeName={node.name}"
        )
    assert node.slices() == []
    result = node.publisher.sync(d, inv)
    assert result.ok, result.errors
    assert result.writes == {"ResourceSlice": 1}
    (after,) = node.slices()
    assert after.metadata.name == before.metadata.name
    assert [x.name for x in after.spec.devices] == [x.name for x in before.spec.devices]
    shared = next(x for x in after.spec.devices if x.name.startswith("rdma-"))
    assert shared.allow_multiple_allocations is True
    assert shared.capacity["holders"].value == "64"
    assert node.publisher.sync(d, inv).writes == {}


def test_a_failed_link_taints_its_device_and_the_taint_is_stable(node: Node) -> None:
    d = node.discover()
    node.publisher.sync(d, _inventory(d))
    (s0,) = node.slices()
    # The NIC of GPU 2 loses its link: rewrite its port state files as the kernel would.
    port = node.sys / "class" / "infiniband" / "mlx5_2" / "ports" / "1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("3: Disabled\n")
    d2 = node.discover(previous=d)
    r = node.publisher.sync(d2, _inventory(d2))
    assert r.ok, r.errors
    assert r.writes == {"ResourceSlice": 1, "NodeDevices": 1, "Event": 1}
    (s1,) = node.slices()
    assert s1.spec.pool.generation == s0.spec.pool.generation + 1
    nic = next(
        x
        for x in s1.spec.devices
        if "rdmaDevice" in x.attributes and x.attributes["rdmaDevice"].string == "mlx5_2"
    )
    (taint,) = nic.taints
    assert (taint.key, taint.effect) == ("fabricdra.io/unhealthy", "NoSchedule")
    assert taint.time_added is not None
    # Only it blocks; devices without a health reading here (the GPUs) carry an informative
    # taint (effect None) and nothing else.
    assert sum(1 for x in s1.spec.devices if _blocking(x)) == 1
    # The record carries the Failed verdict, so the seed's inspection sees which NIC broke.
    nd = node.node_devices()
    assert nd is not None
    broken = [
        i for i in nd["spec"]["interfaces"] if i.get("link") and i["link"]["verdict"] == "Failed"
    ]
    assert [i["rdmaDevice"] for i in broken] == ["mlx5_2"]
    # Unchanged failure on the next pass: no write (the first-seen time is kept).
    d3 = node.discover(previous=d2)
    assert node.publisher.sync(d3, _inventory(d3)).writes == {}
    # The link heals: the taint goes away.
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    d4 = node.discover(previous=d3)
    assert node.publisher.sync(d4, _inventory(d4)).ok
    (s2,) = node.slices()
    assert not any(_blocking(x) for x in s2.spec.devices)


def _blocking(device: Any) -> list[Any]:
    """The taints of a published device that keep pods off it (not the informative ones)."""
    return [t for t in device.taints or [] if t.effect != "None"]


def test_node_devices_record_written_only_on_change(node: Node) -> None:
    d = node.discover()
    node.publisher.sync(d, _inventory(d))
    nd = node.node_devices()
    assert nd is not None
    assert nd["metadata"]["ownerReferences"][0]["name"] == node.name
    spec = NodeDevicesSpec.model_validate(nd["spec"])
    assert spec.interfaces == d.interfaces
    assert [a for g in spec.groups for a in g.accelerators] == d.accelerators
    # The seed's inspection, rewritten for NodeDevices (docs/node-devices.md).
    endpoints = [
        {"name": e["name"], "rdmaDevice": e["rdmaDevice"], "link": e["link"]}
        for i in nd["spec"]["interfaces"]
        for e in [i, *(i.get("virtualFunctions") or [])]
        if e["rdma"] or e["link"]
    ]
    assert len(endpoints) == 8
    version = nd["metadata"]["resourceVersion"]
    node.new_publisher()
    d2 = node.discover(previous=d)
    assert node.publisher.sync(d2, _inventory(d2)).writes == {}
    after = node.node_devices()
    assert after is not None
    assert after["metadata"]["resourceVersion"] == version


def test_every_published_efa_device_is_in_the_node_devices_record(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """EFA functions have no netdev, so discovery's interfaces never held them: the record's
    `adapters` does (issue 31 point 4), and an unchanged pass writes nothing."""
    from fabricdra.kubeletplugin.assembly import assemble
    from tests.sysfs.nodes import aws_efa_node

    b = SysfsBuilder(tmp_path / "efa" / "sys")
    aws_efa_node(b, efas=2)
    name = _name("efa-node")
    control_plane.create_node(name)
    with control_plane.api_client() as api:
        publisher = NodePublisher(api, name)
        for _ in range(2):
            d = discover(SysfsTree(str(b.root)))
            inventory = assemble(d, DeviceConfig(efa=True), SysfsTree(str(b.root)))
            result = publisher.sync(d, inventory)
        assert result.writes == {}  # the second pass: the stored record compares equal
        nd = client.CustomObjectsApi(api).get_cluster_custom_object(
            "fabricdra.io", "v1alpha1", "nodedevices", name
        )
    spec = NodeDevicesSpec.model_validate(nd["spec"])
    assert [(a.pciBusId, a.rdmaDevice) for a in spec.adapters] == [
        ("0000:51:00.0", "efa_0"),
        ("0000:52:00.0", "efa_1"),
    ]


def test_label_removal_rules(node: Node) -> None:
    node.set_labels(
        {
            "fabricdra.io/rdma.stale": "true",  # no longer reported: removed
            "fabricdra.io/fabric.members": "9",  # no longer reported: removed
            "fabricdra.io/other": "keep",  # ours, but not a managed family: untouched
            "example.com/foreign": "keep",  # not ours: untouched
        }
    )
    d = node.discover()
    r = node.publisher.sync(d, _inventory(d))
    assert r.ok, r.errors
    labels = node.labels()
    for key, value in d.labels.desired.items():
        assert labels[key] == value
    assert labels["fabricdra.io/rdma.capable"] == "true"
    assert "fabricdra.io/rdma.stale" not in labels
    assert "fabricdra.io/fabric.members" not in labels
    assert labels["fabricdra.io/other"] == "keep"
    assert labels["example.com/foreign"] == "keep"
    assert [e["verb"] for e in node.writes() if e["objectRef"]["resource"] == "nodes"] == ["patch"]

    # Enumeration fails (the interface list cannot be read): nothing is removed, not even a
    # stale key, and nothing is written for the record whose part could not be read.
    node.set_labels({"fabricdra.io/rdma.stale": "true"})
    shutil.move(str(node.sys / "class" / "net"), str(node.root / "net-away"))
    failed = node.discover()
    assert failed.failures
    assert failed.interfaces is None
    node.new_publisher()
    r2 = node.publisher.sync(failed, build_devices([], failed.accelerators or []))
    labels = node.labels()
    assert labels["fabricdra.io/rdma.stale"] == "true"
    assert labels["fabricdra.io/rdma.capable"] == "true"
    assert "Node" not in r2.writes
    assert "NodeDevices" not in r2.writes  # the live record's interfaces are kept
    assert "ResourceSlice" not in r2.writes  # the published slices too
    assert len(node.slices()[0].spec.devices) == 16


def test_device_classes_select_by_type_and_mode(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        names = {c.metadata.name for c in client.ResourceV1Api(api).list_device_class().items}
    assert {
        "gpu.fabricdra.io",
        "mig.fabricdra.io",
        "rdma.fabricdra.io",
        "rdma-shared.fabricdra.io",
        "rdma-vf.fabricdra.io",
    } <= names


def test_checked_in_crd_is_what_the_server_accepted(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(
            "nodedevices.fabricdra.io"
        )
    assert crd.spec.scope == "Cluster"
    assert (crdgen.CRD_DIR / CRD.filename).read_text() == crdgen.render(CRD.crd())


def test_basic_model_multi_slice_pool(node: Node) -> None:
    """The 1.34/1.35 fallback on a real server: 8 shared endpoints as 64 holders each, 5 slices
    in one pool; unchanged passes write nothing; a change rewrites the pool at a new
    generation; a dropped slice is recreated at the current one."""
    from fabricdra.kubeletplugin.resourceslices import ApiFeatures

    node.publisher = NodePublisher(node.api, node.name, features=ApiFeatures("basic"))
    d = node.discover()
    inv = _inventory(d, config=DeviceConfig(rdma_mode="shared"))
    first = node.publisher.sync(d, inv)
    assert first.ok, first.errors
    assert first.writes["ResourceSlice"] == 5
    slices = node.slices()
    assert len(slices) == 5
    assert {(s.spec.pool.generation, s.spec.pool.resource_slice_count) for s in slices} == {(0, 5)}
    names = [x.name for s in slices for x in s.spec.devices]
    assert len(names) == len(set(names)) == 8 + 8 * 64
    assert all(inv.get(n) is not None for n in names)
    assert node.publisher.sync(d, inv).writes == {}

    # One slice disappears: only it is recreated, into the same generation.
    victim = sorted(s.metadata.name for s in slices)[2]
    with node.cp.api_client() as api:
        client.ResourceV1Api(api).delete_resource_slice(victim)
    again = node.publisher.sync(d, inv)
    assert again.writes == {"ResourceSlice": 1}
    assert {s.spec.pool.generation for s in node.slices()} == {0}

    # Fewer holders: every slice moves to generation 1 and the surplus slice goes.
    fewer = _inventory(d, config=DeviceConfig(rdma_mode="shared", rdma_shared_holders=16))
    changed = node.publisher.sync(d, fewer)
    assert changed.ok, changed.errors
    slices = node.slices()
    assert len(slices) == 2  # 8 GPUs + 128 holders = 136 devices
    assert {(s.spec.pool.generation, s.spec.pool.resource_slice_count) for s in slices} == {(1, 2)}
    assert node.publisher.sync(d, fewer).writes == {}


class ConflictingProxy:
    """Plain HTTP in front of the real API server (which it reaches with the admin client).
    The first time the publisher PUTs the slice named `victim`, someone else writes that slice
    first (a real PATCH, a new resourceVersion): the API server itself answers the PUT 409."""

    def __init__(self, upstream: Any, victim: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.conflicts = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                path = self.path.split("?")[0]
                if (
                    self.command == "PUT"
                    and path.endswith(f"/resourceslices/{victim}")
                    and (proxy.conflicts == 0)
                ):
                    proxy.conflicts += 1
                    client.ResourceV1Api(upstream).patch_resource_slice(
                        victim, {"metadata": {"labels": {"touched-by": "someone-else"}}}
                    )
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")
                }
                resp = upstream.rest_client.pool_manager.request(
                    self.command,
                    upstream.configuration.host + self.path,
                    body=body,
                    headers=headers,
                    preload_content=True,
                )
                self.send_response(resp.status)
                self.send_header(
                    "Content-Type", resp.headers.get("Content-Type", "application/json")
                )
                self.send_header("Content-Length", str(len(resp.data)))
                self.end_headers()
                self.wfile.write(resp.data)

            do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def api_client(self) -> Any:
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        return client.ApiClient(config)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_conflict_midway_through_a_rewrite_is_retried_within_the_pass(node: Node) -> None:
    """A 409 on the second slice of a rewrite: the pass lists again and finishes, so the pool
    never stays at two generations until the next pass."""
    from fabricdra.kubeletplugin.resourceslices import ApiFeatures, slice_name

    basic = ApiFeatures("basic")
    d = node.discover()
    shared = _inventory(d, config=DeviceConfig(rdma_mode="shared"))
    assert NodePublisher(node.api, node.name, features=basic).sync(d, shared).ok
    assert len(node.slices()) == 5

    victim = slice_name(node.name, DRIVER, 1)
    proxy = ConflictingProxy(node.api, victim)
    try:
        with proxy.api_client() as api:
            publisher = NodePublisher(api, node.name, features=basic)
            fewer = _inventory(d, config=DeviceConfig(rdma_mode="shared", rdma_shared_holders=60))
            result = publisher.sync(d, fewer)
    finally:
        proxy.close()
    assert proxy.conflicts == 1
    assert result.ok, result.errors
    slices = node.slices()
    assert len({s.spec.pool.generation for s in slices}) == 1
    names = sorted(x.name for s in slices for x in s.spec.devices)
    assert names == sorted(
        [d.name for d in fewer if d.name not in fewer.holder_sets]
        + [f"{d.name}-s{k}" for d in fewer if d.name in fewer.holder_sets for k in range(60)]
    )
