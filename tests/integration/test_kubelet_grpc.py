"""kubelet's side of the DRA plugin, for real: gRPC over unix sockets with the generated stubs,
claims in the real API server with their allocation written through the status subresource,
real character devices in a test dev root, CDI specs on disk checked against the CDI schema."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from e2e.harness.controlplane import ControlPlane
from fabricdra.kubeletplugin.agent import health_reports
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import HealthBroadcaster, PluginPaths, PluginServer
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.prepare import CDI_KIND, ApiClaimReader, DevicesDriver
from fabricdra.proto.gen.dra_health_v1 import api_pb2 as health_v1_pb2
from fabricdra.proto.gen.dra_health_v1 import api_pb2_grpc as health_v1_grpc
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2 as health_pb2
from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from fabricdra.proto.gen.dra_v1beta1 import api_pb2 as v1beta1_pb2
from fabricdra.proto.gen.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc
from fabricdra.proto.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from fabricdra.proto.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from tests.cdischema import validate
from tests.integration.kubelethost import (
    DRIVER,
    Host,
    RdmaHost,
    build_host,
    build_rdma_host,
    create_claim,
)

pytestmark = pytest.mark.integration

_ids = itertools.count()
GPU0, GPU1 = "gpu-0000-18-00-0", "gpu-0000-3a-00-0"
NIC0, NIC1, NIC2 = "rdma-0000-19-00-0", "rdma-0000-3b-00-0", "rdma-0000-4c-00-0"
VF60 = "rdma-0000-bd-00-2"  # mlx5_6v0, uverbs7


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(tmp_path_factory.mktemp("host"), mig_gpu=7)


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Any]:
    with control_plane.api_client() as client:
        yield client


@pytest.fixture
def ns(control_plane: ControlPlane) -> str:
    name = f"grpc-{next(_ids)}-{os.getpid()}"
    control_plane.create_namespace(name)
    return name


class Plugin:
    """The devices driver behind a real PluginServer, and kubelet's client stubs for it."""

    def __init__(
        self,
        base: Path,
        host: Host | RdmaHost,
        api: Any,
        inventory: DeviceInventory,
        *,
        node: str = "node-a",
        toolkit_dirs: tuple[Path, ...] = (),
        boot_id: str | None = "boot-1",
        instance: str | None = None,
        metadata: bool = False,
        nccl_topo: bool = False,
    ) -> None:
        self.metadata_dir = base / "plugin" / "metadata" if metadata else None
        self.nccl_topo_dir = base / "plugin" / "nccl-topo" if nccl_topo else None
        self.base, self.host, self.api, self.node = base, host, api, node
        self.inventory = inventory
        self.toolkit_dirs = toolkit_dirs
        self.boot_id = boot_id
        self.cdi_dir = base / "cdi"
        self.checkpoint_path = base / "state" / "checkpoint.json"
        self.paths = PluginPaths.for_driver(
            DRIVER, registry_dir=base / "registry", plugin_dir=base / "plugin", instance=instance
        )
        self.health = HealthBroadcaster(resend_seconds=0.2)
        self.server: PluginServer | None = None

    def start(self) -> None:
        # A new driver, checkpoint and server each time: a restart keeps only what is on disk.
        reader = ApiClaimReader(self.api)
        self.driver = DevicesDriver(
            node_name=self.node,
            inventory=lambda: self.inventory,
            claims=reader,
            events=reader,
            cdi=CdiWriter(self.cdi_dir, CDI_KIND),
            checkpoint=Checkpoint(self.checkpoint_path, boot_id=self.boot_id),
            host=self.host.layout,
            families=(NvidiaClaims(ToolkitSpecs(self.toolkit_dirs)),),
            pods=reader,
            metadata_dir=self.metadata_dir,
            nccl_topo_dir=self.nccl_topo_dir,
        )
        self.server = PluginServer(self.driver, self.paths, health=self.health)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def call(self, method: str, claims: list[tuple[str, str, str]], version: str = "v1") -> Any:
        pb, stub_class = {
            "v1": (v1_pb2, v1_grpc.DRAPluginStub),
            "v1beta1": (v1beta1_pb2, v1beta1_grpc.DRAPluginStub),
        }[version]
        request_class = getattr(pb, f"{method}Request")
        msg = request_class(claims=[pb.Claim(namespace=n, name=c, uid=u) for n, c, u in claims])
        with grpc.insecure_channel(f"unix://{self.paths.dra_socket}") as ch:
            return getattr(stub_class(ch), method)(msg, timeout=45)

    def prepare(self, claims: list[tuple[str, str, str]], version: str = "v1") -> Any:
        return self.call("NodePrepareResources", claims, version)

    def unprepare(self, claims: list[tuple[str, str, str]], version: str = "v1") -> Any:
        return self.call("NodeUnprepareResources", claims, version)

    def spec(self, uid: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.cdi_dir / f"{spec_file(uid)}").read_text())
        validate(doc)
        return doc

    def specs(self) -> list[str]:
        return sorted(os.listdir(self.cdi_dir)) if self.cdi_dir.exists() else []


def spec_file(uid: str) -> str:
    return f"k8s.devices.fabricdra.io-device_{uid}.json"


@pytest.fixture
def plugin(tmp_path_factory: pytest.TempPathFactory, host: Host, api: Any) -> Iterator[Plugin]:
    p = Plugin(tmp_path_factory.mktemp("pl"), host, api, host.inventory())
    p.start()
    yield p
    p.stop()


def result(request: str, device: str, pool: str = "node-a", **extra: str) -> dict[str, str]:
    return {"request": request, "device": device, "pool": pool, **extra}


def edits_by_device(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d["containerEdits"] for d in doc["devices"]}


# -- registration ---------------------------------------------------------------------------


def test_registration_answers_kubelet(plugin: Plugin) -> None:
    assert plugin.paths.registration_socket.parent == plugin.base / "registry"
    with grpc.insecure_channel(f"unix://{plugin.paths.registration_socket}") as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=30)
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True))
    assert (info.type, info.name) == ("DRAPlugin", "devices.fabricdra.io")
    assert info.endpoint == str(plugin.base / "plugin" / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert plugin.server is not None
    assert plugin.server.registered.is_set()


# -- prepare ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_gpus_and_their_nics(plugin: Plugin, api: Any, ns: str, version: str) -> None:
    uid = create_claim(
        api,
        ns,
        "pair",
        [result("gpu", GPU0), result("gpu", GPU1), result("nic", NIC0), result("nic", NIC1)],
    )
    resp = plugin.prepare([(ns, "pair", uid)], version)
    entry = resp.claims[uid]
    assert entry.error == ""
    kind = "k8s.devices.fabricdra.io/device"
    common, gpus = f"{kind}=rdma-{uid}", f"{kind}=gpus-{uid}"
    assert [
        (d.device_name, d.pool_name, list(d.request_names), list(d.cdi_device_ids))
        for d in entry.devices
    ] == [
        (GPU0, "node-a", ["gpu"], [f"{kind}={GPU0}-{uid}", gpus]),
        (GPU1, "node-a", ["gpu"], [f"{kind}={GPU1}-{uid}", gpus]),
        (NIC0, "node-a", ["nic"], [f"{kind}={NIC0}-{uid}", common]),
        (NIC1, "node-a", ["nic"], [f"{kind}={NIC1}-{uid}", common]),
    ]

    doc = plugin.spec(uid)
    dev = plugin.host.layout.dev_root
    # hostPath differs from the container path only because of the test dev root
    assert doc["cdiVersion"] == "0.5.0"
    assert doc["kind"] == kind
    # a legacy-mode nvidia-container-runtime must not add GPUs on top (image env "all"); only
    # GPU grants say so, so a container given only the NICs keeps any device-plugin GPUs
    assert "containerEdits" not in doc
    edits = edits_by_device(doc)
    assert edits[f"gpus-{uid}"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    assert edits[f"{NIC0}-{uid}"] == {
        "deviceNodes": [
            {
                "path": "/dev/infiniband/uverbs0",
                "hostPath": f"{dev}/infiniband/uverbs0",
                "type": "c",
                "major": 231,
                "minor": 192,
            }
        ]
    }
    assert edits[f"{NIC1}-{uid}"]["deviceNodes"][0]["path"] == "/dev/infiniband/uverbs1"
    # rdma_cm and NCCL_IB_HCA once per claim; "=": NCCL matches the names exactly. The host
    # is rail-optimised (one NIC beside each GPU): every granted NIC has a measured rail, so
    # NCCL keeps each ring on its rail (docs/scale-out.md, "Rail").
    assert edits[f"rdma-{uid}"] == {
        "env": ["NCCL_IB_HCA==mlx5_0,mlx5_1", "NCCL_CROSS_NIC=0"],
        "deviceNodes": [
            {
                "path": "/dev/infiniband/rdma_cm",
                "hostPath": f"{dev}/infiniband/rdma_cm",
                "type": "c",
                "major": 10,
                "minor": 58,
            }
        ],
    }
    gpu_paths = [n["path"] for n in edits[f"{GPU1}-{uid}"]["deviceNodes"]]
    assert gpu_paths == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert edits[f"{GPU1}-{uid}"]["deviceNodes"][0]["minor"] == 1
    every_path = [n["path"] for e in edits.values() for n in e.get("deviceNodes", [])]
    assert "/dev/infiniband" not in every_path
    assert every_path.count("/dev/infiniband/rdma_cm") == 1
    assert not any(
        "NCCL" in e for k, ed in edits.items() if k != f"rdma-{uid}" for e in ed.get("env", [])
    )


def test_prepare_a_virtual_function(plugin: Plugin, api: Any, ns: str) -> None:
    uid = create_claim(api, ns, "vf", [result("nic", VF60)])
    entry = plugin.prepare([(ns, "vf", uid)]).claims[uid]
    assert entry.error == ""
    edits = edits_by_device(plugin.spec(uid))
    assert edits[f"{VF60}-{uid}"]["deviceNodes"][0]["path"] == "/dev/infiniband/uverbs7"
    # A VF carries its physical function's rail.
    assert edits[f"rdma-{uid}"]["env"] == ["NCCL_IB_HCA==mlx5_6v0", "NCCL_CROSS_NIC=0"]


def test_a_pf_with_vfs_is_not_offered_whole(plugin: Plugin, api: Any, ns: str) -> None:
    uid = create_claim(api, ns, "pf", [result("nic", "rdma-0000-bd-00-0")])
    entry = plugin.prepare([(ns, "pf", uid)]).claims[uid]
    assert "rdma-0000-bd-00-0" in entry.error
    assert "not offered by this node" in entry.error
    assert plugin.specs() == []


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_shared_endpoint_serves_several_claims(
    tmp_path_factory: pytest.TempPathFactory, host: Host, api: Any, ns: str, version: str
) -> None:
    p = Plugin(tmp_path_factory.mktemp("sh"), host, api, host.inventory(DeviceConfig("shared")))
    p.start()
    try:
        # 1.36 model: one device, allocated many times, told apart by shareID
        a = create_claim(
            api, ns, "a", [result("nic", NIC0, shareID="0f0e0d0c-1111-2222-3333-444455556666")]
        )
        b = create_claim(
            api, ns, "b", [result("nic", NIC0, shareID="1f0e0d0c-1111-2222-3333-444455556666")]
        )
        # 1.34/1.35 model: holder devices <endpoint>-s<k>
        c = create_claim(api, ns, "c", [result("nic", f"{NIC0}-s5")])
        resp = p.prepare([(ns, "a", a), (ns, "b", b), (ns, "c", c)], version)
        assert all(r.error == "" for r in resp.claims.values()), resp
        da, db, dc = (resp.claims[u].devices[0] for u in (a, b, c))
        assert da.device_name == db.device_name == NIC0
        assert dc.device_name == f"{NIC0}-s5"
        if version == "v1":
            assert da.share_id == "0f0e0d0c-1111-2222-3333-444455556666"
        assert len({da.cdi_device_ids[0], db.cdi_device_ids[0], dc.cdi_device_ids[0]}) == 3
        for uid in (a, b, c):
            nodes = [
                n["path"]
                for e in p.spec(uid)["devices"]
                for n in e["containerEdits"].get("deviceNodes", [])
            ]
            assert "/dev/infiniband/uverbs0" in nodes
    finally:
        p.stop()


def test_prepare_is_idempotent(plugin: Plugin, api: Any, ns: str) -> None:
    uid = create_claim(api, ns, "again", [result("gpu", GPU0), result("nic", NIC0)])
    first = plugin.prepare([(ns, "again", uid)])
    path = plugin.cdi_dir / spec_file(uid)
    before = path.stat()
    second = plugin.prepare([(ns, "again", uid)])
    assert first == second
    assert path.stat().st_ino == before.st_ino  # unchanged content is not rewritten
    assert plugin.specs() == [spec_file(uid)]


def test_restart_between_prepare_and_unprepare(plugin: Plugin, api: Any, ns: str) -> None:
    uid = create_claim(api, ns, "restart", [result("nic", NIC1)])
    first = plugin.prepare([(ns, "restart", uid)])
    plugin.restart()
    # kubelet restarted too: it asks again, and gets the same answer from the new process
    assert plugin.prepare([(ns, "restart", uid)]) == first
    plugin.restart()
    resp = plugin.unprepare([(ns, "restart", uid)])
    assert resp.claims[uid].error == ""
    assert plugin.specs() == []
    assert Checkpoint(plugin.checkpoint_path).get(uid) is None


def test_unprepare_removes_only_its_own_claim(plugin: Plugin, api: Any, ns: str) -> None:
    keep = create_claim(api, ns, "keep", [result("gpu", GPU0)])
    drop = create_claim(api, ns, "drop", [result("gpu", GPU1)])
    plugin.prepare([(ns, "keep", keep), (ns, "drop", drop)])
    # the claim may already be gone from the API when kubelet unprepares it
    from kubernetes import client

    client.ResourceV1Api(api).delete_namespaced_resource_claim("drop", ns)
    resp = plugin.unprepare([(ns, "drop", drop)], "v1beta1")
    assert resp.claims[drop].error == ""
    assert plugin.specs() == [spec_file(keep)]
    assert Checkpoint(plugin.checkpoint_path).get(keep) is not None


def test_unprepare_of_a_never_prepared_claim_succeeds(plugin: Plugin, ns: str) -> None:
    resp = plugin.unprepare([(ns, "never", "3b0c8f3e-0000-0000-0000-000000000000")])
    assert dict(resp.claims) == {
        "3b0c8f3e-0000-0000-0000-000000000000": v1_pb2.NodeUnprepareResourceResponse()
    }


# -- bad requests ---------------------------------------------------------------------------


def test_bad_claims_fail_alone_with_a_clear_error(plugin: Plugin, api: Any, ns: str) -> None:
    good = create_claim(api, ns, "good", [result("gpu", GPU0)])
    replaced = create_claim(api, ns, "replaced", [result("gpu", GPU1)])
    unknown = create_claim(api, ns, "unknown", [result("gpu", "gpu-0000-ff-00-0")])
    other_pool = create_claim(api, ns, "other-pool", [result("nic", NIC0, pool="node-b")])
    other_driver = create_claim(
        api,
        ns,
        "other-driver",
        [{"request": "x", "device": "d", "pool": "node-a", "driver": "gpu.example.com"}],
    )
    # a shared-holder name in exclusive mode: parses to no endpoint
    no_endpoint = create_claim(api, ns, "holder", [result("nic", f"{NIC0}-s3")])
    claims = [
        (ns, "good", good),
        (ns, "replaced", "00000000-dead-beef-0000-000000000000"),
        (ns, "unknown", unknown),
        (ns, "other-pool", other_pool),
        (ns, "other-driver", other_driver),
        (ns, "holder", no_endpoint),
        (ns, "missing", "11111111-0000-0000-0000-000000000000"),
    ]
    resp = plugin.prepare(claims)
    errors = {name: resp.claims[uid].error for _, name, uid in claims}
    assert errors["good"] == ""
    assert f"has uid {replaced}" in errors["replaced"]
    assert "gpu-0000-ff-00-0" in errors["unknown"]
    assert "not offered by this node" in errors["unknown"]
    assert "pool 'node-b'" in errors["other-pool"]
    assert "no devices of driver devices.fabricdra.io" in errors["other-driver"]
    assert f"{NIC0}-s3" in errors["holder"]
    assert "not found" in errors["missing"].lower()
    assert all(not resp.claims[uid].devices for _, n, uid in claims if n != "good")
    assert plugin.specs() == [spec_file(good)]  # nothing written for the refused claims


def test_missing_verbs_device_names_the_locations_checked(
    tmp_path_factory: pytest.TempPathFactory, api: Any, ns: str
) -> None:
    host = build_host(tmp_path_factory.mktemp("nv"), vf_nics=())
    (host.layout.dev_root / "infiniband" / "uverbs2").unlink()
    p = Plugin(tmp_path_factory.mktemp("pv"), host, api, host.inventory())
    p.start()
    try:
        uid = create_claim(api, ns, "noverbs", [result("nic", NIC2)])
        error = p.prepare([(ns, "noverbs", uid)]).claims[uid].error
    finally:
        p.stop()
    assert "mlx5_2" in error
    assert f"{host.layout.dev_root}/infiniband/uverbs2" in error
    assert f"{host.root}/sys/class/infiniband_verbs/uverbs2/ibdev" in error
    assert p.specs() == []


# -- GPUs: toolkit ids and MIG --------------------------------------------------------------


def test_toolkit_ids_when_its_spec_is_on_the_host(
    tmp_path_factory: pytest.TempPathFactory, host: Host, api: Any, ns: str
) -> None:
    base = tmp_path_factory.mktemp("tk")
    etc_cdi = base / "etc-cdi"
    etc_cdi.mkdir()
    uuid0 = json.loads(host.nvml_snapshot.read_text())[host.hgx.gpus[0]]["uuid"]
    # nvidia-ctk's default (index) naming: matched by device node; the MIG one by its caps
    (etc_cdi / "nvidia.yaml").write_text(
        yaml.safe_dump(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [
                    {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
                    {
                        "name": "7:0",
                        "containerEdits": {
                            "deviceNodes": [
                                {"path": "/dev/nvidia7"},
                                {"path": "/dev/nvidia-caps/nvidia-cap1"},
                                {"path": "/dev/nvidia-caps/nvidia-cap2"},
                            ]
                        },
                    },
                    {
                        "name": "all",
                        "containerEdits": {
                            "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}]
                        },
                    },
                ],
            }
        )
    )
    p = Plugin(base, host, api, host.inventory(), toolkit_dirs=(etc_cdi,))
    p.start()
    try:
        uid = create_claim(
            api,
            ns,
            "tk",
            [result("gpu", GPU0), result("mig", "mig-0000-cd-00-0-gi1-ci0"), result("nic", NIC0)],
        )
        resp = p.prepare([(ns, "tk", uid)]).claims[uid]
        assert resp.error == ""
        ids = [list(d.cdi_device_ids) for d in resp.devices]
        gpus = f"{CDI_KIND}=gpus-{uid}"
        assert ids[0] == ["nvidia.com/gpu=0", gpus]
        assert ids[1] == ["nvidia.com/gpu=7:0", gpus]
        assert [d["name"] for d in p.spec(uid)["devices"]] == [
            f"{NIC0}-{uid}",
            f"rdma-{uid}",
            f"gpus-{uid}",
        ]
        # the uuid naming strategy wins when present
        (etc_cdi / "nvidia.yaml").write_text(
            yaml.safe_dump(
                {
                    "cdiVersion": "0.5.0",
                    "kind": "nvidia.com/gpu",
                    "devices": [
                        {
                            "name": uuid0,
                            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]},
                        }
                    ],
                }
            )
        )
        assert p.unprepare([(ns, "tk", uid)]).claims[uid].error == ""  # GPU0 is free again
        uid2 = create_claim(api, ns, "tk2", [result("gpu", GPU0)])
        resp2 = p.prepare([(ns, "tk2", uid2)]).claims[uid2]
        assert list(resp2.devices[0].cdi_device_ids) == [
            f"nvidia.com/gpu={uuid0}",
            f"{CDI_KIND}=gpus-{uid2}",
        ]
        # of ours only the device that keeps a legacy runtime from adding GPUs
        assert [d["name"] for d in p.spec(uid2)["devices"]] == [f"gpus-{uid2}"]
    finally:
        p.stop()


def test_mig_without_toolkit_gets_its_capability_nodes(plugin: Plugin, api: Any, ns: str) -> None:
    uid = create_claim(api, ns, "mig", [result("mig", "mig-0000-cd-00-0-gi2-ci0")])
    entry = plugin.prepare([(ns, "mig", uid)]).claims[uid]
    assert entry.error == ""
    dev, void = plugin.spec(uid)["devices"]
    assert void == {
        "name": f"gpus-{uid}",
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
    }
    assert [n["path"] for n in dev["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia7",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-caps/nvidia-cap11",
        "/dev/nvidia-caps/nvidia-cap12",
    ]
    assert "env" not in dev["containerEdits"]  # no NUMA/CPU claims for a MIG slice


# -- device metadata (issue 32 point 5, KEP-5304) ---------------------------------------------


def test_device_metadata_reaches_the_container_through_the_cdi_ids_kubelet_gets(
    tmp_path_factory: pytest.TempPathFactory, host: Host, api: Any, ns: str
) -> None:
    p = Plugin(tmp_path_factory.mktemp("md"), host, api, host.inventory(), metadata=True)
    p.start()
    try:
        uid = create_claim(api, ns, "train", [result("gpu", GPU0)])
        (device,) = p.prepare([(ns, "train", uid)]).claims[uid].devices
        name = f"metadata-gpu-{uid}"
        assert list(device.cdi_device_ids)[-1] == f"k8s.devices.fabricdra.io/device={name}"
        (mount,) = edits_by_device(p.spec(uid))[name]["mounts"]  # the spec validates as CDI
        assert mount["containerPath"] == (
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/gpu/"
            "devices.fabricdra.io-metadata.json"
        )
        doc = json.loads(Path(mount["hostPath"]).read_text())
        assert doc["metadata"]["uid"] == uid
        assert [d["name"] for d in doc["requests"][0]["devices"]] == [GPU0]
        assert p.unprepare([(ns, "train", uid)]).claims[uid].error == ""
        assert not Path(mount["hostPath"]).exists()
    finally:
        p.stop()


def test_nccl_topology_of_two_gpus_and_their_rail_hcas_over_grpc(
    tmp_path_factory: pytest.TempPathFactory, api: Any, ns: str
) -> None:
    """Issue 27 point 6: a DGX H100 claim of GPUs 0-1 and their rail HCAs; the container gets
    NCCL_TOPO_FILE and a read-only mount of NCCL's XML describing exactly those four devices
    (their rails on the nets); unprepare removes it."""
    import xml.etree.ElementTree as ET

    dgx = build_host(tmp_path_factory.mktemp("dgx"), dgx=True)
    p = Plugin(tmp_path_factory.mktemp("topo"), dgx, api, dgx.inventory(), nccl_topo=True)
    p.start()
    try:
        results = [result("gpu", GPU0), result("gpu", GPU1)]
        results += [result("nic", NIC0), result("nic", NIC1)]
        uid = create_claim(api, ns, "ring", results)
        devices = p.prepare([(ns, "ring", uid)]).claims[uid].devices
        name = f"nccltopo-{uid}"
        assert all(f"k8s.devices.fabricdra.io/device={name}" in d.cdi_device_ids for d in devices)
        edits = edits_by_device(p.spec(uid))[name]  # the spec validates as CDI
        target = f"/var/run/fabricdra/nccl-topo-{uid}.xml"
        assert edits["env"] == [f"NCCL_TOPO_FILE={target}"]
        (mount,) = edits["mounts"]
        assert (mount["containerPath"], mount["options"]) == (target, ["ro", "bind"])
        root = ET.fromstring(Path(mount["hostPath"]).read_text())
        gpus = {x.attrib["busid"] for x in root.iter("pci") if x.find("gpu") is not None}
        assert gpus == {"0000:18:00.0", "0000:3a:00.0"}
        nets = {n.attrib["name"]: n.attrib.get("rail") for n in root.iter("net")}
        assert nets == {"mlx5_0": "0", "mlx5_1": "1"}
        assert p.unprepare([(ns, "ring", uid)]).claims[uid].error == ""
        assert not Path(mount["hostPath"]).exists()
    finally:
        p.stop()


# -- health -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("health_grpc", "health_pb2"),
    [(health_v1_grpc, health_v1_pb2), (health_grpc, health_pb2)],
    ids=["v1", "v1alpha1"],
)
def test_health_stream_reports_a_failed_link_unhealthy(
    tmp_path_factory: pytest.TempPathFactory, api: Any, health_grpc: Any, health_pb2: Any
) -> None:
    host = build_host(tmp_path_factory.mktemp("hb"), vf_nics=(), broken_nics=(2,))
    p = Plugin(tmp_path_factory.mktemp("ph"), host, api, host.inventory())
    p.health.publish(health_reports("node-a", p.inventory))
    p.start()
    try:
        with grpc.insecure_channel(f"unix://{p.paths.dra_socket}") as ch:
            stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                health_pb2.NodeWatchResourcesRequest(), timeout=60
            )
            first = {d.device.device_name: d for d in next(stream).devices}
            assert first[NIC2].health == health_pb2.UNHEALTHY
            assert first[NIC2].message  # the link's reason
            assert first[NIC2].device.pool_name == "node-a"
            assert first[NIC1].health == health_pb2.HEALTHY
            assert first[GPU0].health == health_pb2.UNKNOWN  # no GPU health reading given
            # the link heals: the next discovery pass publishes, the stream says so
            healed = build_host(tmp_path_factory.mktemp("hh"), vf_nics=())
            p.health.publish(health_reports("node-a", healed.inventory()))
            update = next(stream)
            while {d.device.device_name: d.health for d in update.devices}[
                NIC2
            ] != health_pb2.HEALTHY:
                update = next(stream)
            stream.cancel()
    finally:
        p.stop()


# -- isolation (issue 10) -----------------------------------------------------------------------


def test_an_exclusive_device_is_never_prepared_for_a_second_claim(
    plugin: Plugin, api: Any, ns: str
) -> None:
    mig = "mig-0000-cd-00-0-gi1-ci0"
    first = create_claim(api, ns, "first", [result("nic", NIC0), result("gpu", GPU0)])
    nic = create_claim(api, ns, "nic", [result("nic", NIC0)])
    gpu = create_claim(api, ns, "gpu", [result("gpu", GPU0)])
    mig_a = create_claim(api, ns, "mig-a", [result("mig", mig)])
    mig_b = create_claim(api, ns, "mig-b", [result("mig", mig)])
    claims = [(ns, "first", first), (ns, "nic", nic), (ns, "gpu", gpu)]
    claims += [(ns, "mig-a", mig_a), (ns, "mig-b", mig_b)]
    resp = plugin.prepare(claims)
    errors = {name: resp.claims[uid].error for _, name, uid in claims}
    assert errors["first"] == errors["mig-a"] == ""
    assert f"{NIC0} (request nic) is already prepared for claim {ns}/first" in errors["nic"]
    assert f"{GPU0} (request gpu) is already prepared for claim {ns}/first" in errors["gpu"]
    assert f"already prepared for claim {ns}/mig-a (uid {mig_a})" in errors["mig-b"]
    assert plugin.specs() == sorted([spec_file(first), spec_file(mig_a)])
    # once the holder is unprepared, the device is free again; a restart keeps the record
    plugin.restart()
    assert plugin.prepare([(ns, "nic", nic)]).claims[nic].error != ""
    assert plugin.unprepare([(ns, "first", first)]).claims[first].error == ""
    assert plugin.prepare([(ns, "nic", nic)]).claims[nic].error == ""


def test_an_rdma_mode_switch_never_lets_a_share_land_on_an_exclusive_hold(
    plugin: Plugin, host: Host, api: Any, ns: str
) -> None:
    """Issue 17: a result with a shareID used to skip the in-use check entirely."""
    first = create_claim(api, ns, "first", [result("nic", NIC1)])
    assert plugin.prepare([(ns, "first", first)]).claims[first].error == ""
    plugin.inventory = host.inventory(DeviceConfig("shared"))  # --rdma-mode shared from now on
    try:
        share = create_claim(
            api, ns, "share", [result("nic", NIC1, shareID="3f0e0d0c-1111-2222-3333-444455556666")]
        )
        gpu = create_claim(
            api, ns, "gpu", [result("gpu", GPU1, shareID="4f0e0d0c-1111-2222-3333-444455556666")]
        )
        resp = plugin.prepare([(ns, "share", share), (ns, "gpu", gpu)])
        assert (
            f"device {NIC1} (request nic) is already prepared for claim {ns}/first "
            f"(uid {first}) exclusively; a share cannot be added"
        ) in resp.claims[share].error
        assert "was allocated as a share" in resp.claims[gpu].error  # a GPU is never shared
        assert plugin.specs() == [spec_file(first)]
    finally:
        plugin.inventory = host.inventory()


def test_admin_access_is_exempt_from_the_in_use_check(plugin: Plugin, api: Any, ns: str) -> None:
    from kubernetes import client

    # the API server allows admin access only in namespaces labelled for it
    admin_label = {"resource.kubernetes.io/admin-access": "true"}
    client.CoreV1Api(api).patch_namespace(ns, {"metadata": {"labels": admin_label}})
    user = create_claim(api, ns, "user", [result("nic", NIC1)])
    admin = create_claim(api, ns, "admin", [{**result("nic", NIC1), "adminAccess": True}])
    late = create_claim(api, ns, "late", [result("nic", NIC2)])
    assert plugin.prepare([(ns, "user", user)]).claims[user].error == ""
    assert plugin.prepare([(ns, "admin", admin)]).claims[admin].error == ""
    # an admin-access holder blocks nobody
    assert plugin.unprepare([(ns, "user", user)]).claims[user].error == ""
    admin2 = create_claim(api, ns, "admin2", [{**result("nic", NIC2), "adminAccess": True}])
    assert plugin.prepare([(ns, "admin2", admin2)]).claims[admin2].error == ""
    assert plugin.prepare([(ns, "late", late)]).claims[late].error == ""


def test_opaque_configuration_for_this_driver_is_refused(plugin: Plugin, api: Any, ns: str) -> None:
    def with_config(name: str, config: list[dict[str, Any]]) -> str:
        results = [result("nic", NIC0)]
        return create_claim(api, ns, name, results, requests=("nic", "gpu"), config=config)

    def opaque(driver: str, requests: list[str] | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "source": "FromClaim",
            "opaque": {"driver": driver, "parameters": {"mtu": 9000}},
        }
        if requests is not None:
            c["requests"] = requests
        return c

    ours = with_config("ours", [opaque(DRIVER)])
    other_request = with_config("other-request", [opaque(DRIVER, ["gpu"])])
    other_driver = with_config("other-driver", [opaque("gpu.example.com")])
    error = plugin.prepare([(ns, "ours", ours)]).claims[ours].error
    assert "opaque configuration for driver devices.fabricdra.io" in error
    assert "FromClaim" in error
    assert plugin.specs() == []
    for name, uid in (("other-request", other_request), ("other-driver", other_driver)):
        assert plugin.prepare([(ns, name, uid)]).claims[uid].error == ""
        assert plugin.unprepare([(ns, name, uid)]).claims[uid].error == ""


def _events(api: Any, ns: str, uid: str) -> list[Any]:
    from kubernetes import client

    found = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.uid={uid}"
    )
    return list(found.items)


def _container_hca_lists(p: Plugin, entries: list[Any], request: str = "") -> set[str]:
    """Every NCCL_IB_HCA value a container can end with: kubelet gives it the CDI ids of the
    devices of each claim it uses (all of them, or those of its `request`), and the runtime
    applies their environment last-wins, in some order."""
    ids = [
        i
        for entry in entries
        for d in entry.devices
        if not request or not d.request_names or request in d.request_names
        for i in d.cdi_device_ids
    ]
    values = set()
    for spec in p.specs():
        doc = json.loads((p.cdi_dir / spec).read_text())
        for dev in doc["devices"]:
            if f"{doc['kind']}={dev['name']}" in ids:
                env = dev["containerEdits"].get("env", [])
                values |= {e.split("=", 1)[1] for e in env if e.startswith("NCCL_IB_HCA=")}
    return values


def test_a_whole_claim_with_two_nic_requests_gets_both_hcas(
    tmp_path_factory: pytest.TempPathFactory, api: Any, ns: str
) -> None:
    """Issue 17: a container using the whole claim ended with NCCL_IB_HCA==mlx5_3 only."""
    rdma = build_rdma_host(tmp_path_factory.mktemp("h12"), hcas=12)
    p = Plugin(tmp_path_factory.mktemp("p12"), rdma, api, rdma.inventory())
    p.start()
    try:
        a, b = rdma.device("mlx5_2"), rdma.device("mlx5_3")
        uid = create_claim(api, ns, "two", [result("nic-a", a), result("nic-b", b)])
        entry = p.prepare([(ns, "two", uid)]).claims[uid]
        assert entry.error == ""
        common = f"{CDI_KIND}=rdma-{uid}"
        assert [list(d.cdi_device_ids) for d in entry.devices] == [
            [f"{CDI_KIND}={a}-{uid}", common],
            [f"{CDI_KIND}={b}-{uid}", common],
        ]
        # one list wherever it appears: every order of applying the devices ends with both
        assert _container_hca_lists(p, [entry]) == {"=mlx5_2,mlx5_3"}
        assert _container_hca_lists(p, [entry], "nic-a") == {"=mlx5_2,mlx5_3"}
        assert edits_by_device(p.spec(uid))[f"{a}-{uid}"]["deviceNodes"][0]["path"] == (
            "/dev/infiniband/uverbs2"  # a one-request container gets only its own verbs device
        )
        assert _events(api, ns, uid) == []  # nothing left to warn about
    finally:
        p.stop()


def test_two_claims_of_one_pod_carry_one_hca_list(plugin: Plugin, api: Any, ns: str) -> None:
    from kubernetes import client

    uids = {
        name: create_claim(api, ns, name, [result("nic", nic)])
        for name, nic in (("left", NIC0), ("right", NIC1))
    }
    # A real pod using both claims (held by a scheduling gate, so it stays where it is): the
    # claim controller keeps a reservation only for a pod that exists and uses the claim.
    created = client.CoreV1Api(api).create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "trainer"},
            "spec": {
                "schedulingGates": [{"name": "fabricdra.io/test"}],
                "resourceClaims": [{"name": n, "resourceClaimName": n} for n in uids],
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"claims": [{"name": n} for n in uids]},
                    }
                ],
            },
        },
    )
    pod = {"resource": "pods", "name": "trainer", "uid": created.metadata.uid}
    for name in uids:
        client.ResourceV1Api(api).patch_namespaced_resource_claim_status(
            name, ns, {"status": {"reservedFor": [pod]}}
        )
    lonely = create_claim(api, ns, "lonely", [result("nic", NIC2)])
    # kubelet prepares a pod's claims of one driver in one call
    resp = plugin.prepare([(ns, "left", uids["left"]), (ns, "right", uids["right"])])
    assert all(r.error == "" for r in resp.claims.values())
    assert plugin.prepare([(ns, "lonely", lonely)]).claims[lonely].error == ""
    both = [resp.claims[uids["left"]], resp.claims[uids["right"]]]
    assert _container_hca_lists(plugin, both) == {"=mlx5_0,mlx5_1"}
    lonely_entry = plugin.prepare([(ns, "lonely", lonely)]).claims[lonely]
    assert _container_hca_lists(plugin, [lonely_entry]) == {"=mlx5_2"}


# -- idempotence and checkpoint hygiene -------------------------------------------------------


def test_a_repeated_prepare_answers_from_the_checkpoint_after_the_inventory_changed(
    plugin: Plugin, api: Any, ns: str
) -> None:
    uid = create_claim(api, ns, "stable", [result("nic", NIC0), result("gpu", GPU1)])
    first = plugin.prepare([(ns, "stable", uid)])
    assert first.claims[uid].error == ""
    # The NIC's PF gained VFs and the GPU went into MIG mode: neither is offered any more.
    plugin.inventory = DeviceInventory(())
    assert plugin.prepare([(ns, "stable", uid)]) == first
    plugin.restart()  # also from a later process, with the record on disk
    assert plugin.prepare([(ns, "stable", uid)]) == first
    # a spec that went missing is rewritten only by a full prepare: refused honestly now
    (plugin.cdi_dir / spec_file(uid)).unlink()
    assert "not offered by this node" in plugin.prepare([(ns, "stable", uid)]).claims[uid].error


def test_entries_of_another_boot_are_dropped_with_their_specs(
    plugin: Plugin, api: Any, ns: str
) -> None:
    uid = create_claim(api, ns, "old", [result("nic", NIC0)])
    assert plugin.prepare([(ns, "old", uid)]).claims[uid].error == ""
    plugin.restart()  # same boot: kept
    assert Checkpoint(plugin.checkpoint_path).get(uid) is not None
    plugin.stop()
    plugin.boot_id = "boot-2"
    plugin.start()
    assert plugin.specs() == []
    assert plugin.driver.checkpoint.get(uid) is None
    # the device it held is free for another claim
    other = create_claim(api, ns, "new", [result("nic", NIC0)])
    assert plugin.prepare([(ns, "new", other)]).claims[other].error == ""


def test_the_sweep_reports_claims_gone_from_the_api_and_frees_nothing(
    plugin: Plugin, api: Any, ns: str
) -> None:
    """Gone from the API is not unused: a force-deleted pod's container runs until kubelet
    stops it and unprepares. The sweep names such claims; only kubelet's unprepare frees."""
    from kubernetes import client

    from fabricdra.kubeletplugin.kubelet import ClaimSweeper

    resource = client.ResourceV1Api(api)
    kept = create_claim(api, ns, "kept", [result("nic", NIC0)])
    gone = create_claim(api, ns, "gone", [result("nic", NIC1)])
    renewed = create_claim(api, ns, "renewed", [result("nic", NIC2)])
    for name, uid in (("kept", kept), ("gone", gone), ("renewed", renewed)):
        assert plugin.prepare([(ns, name, uid)]).claims[uid].error == ""
    resource.delete_namespaced_resource_claim("gone", ns)
    resource.delete_namespaced_resource_claim("renewed", ns)
    renewed_again = create_claim(api, ns, "renewed", [result("nic", NIC2)])  # new uid
    sweeper = ClaimSweeper(plugin.driver.checkpoint, plugin.driver.claims, 600, DRIVER)
    assert sorted(e.uid for e in sweeper.sweep()) == sorted([gone, renewed])
    assert plugin.specs() == sorted(spec_file(u) for u in (kept, gone, renewed))
    assert len(Checkpoint(plugin.checkpoint_path).entries()) == 3
    # the device stays held: the new claim of the same name is refused until kubelet
    # unprepares the old one
    again = plugin.prepare([(ns, "renewed", renewed_again)]).claims[renewed_again].error
    assert "already prepared for claim" in again
    assert plugin.unprepare([(ns, "renewed", renewed)]).claims[renewed].error == ""
    assert plugin.prepare([(ns, "renewed", renewed_again)]).claims[renewed_again].error == ""


# -- rolling update: two pods of the driver at once ------------------------------------------


def test_two_plugin_pods_during_a_rolling_update_share_one_state(
    tmp_path_factory: pytest.TempPathFactory, host: Host, api: Any, ns: str
) -> None:
    """A surge roll runs the old and the new pod side by side on the same folders (per-pod
    socket names): kubelet may prepare through one and unprepare through the other. The new
    pod refuses a device the old one prepared for another claim, unprepares the old pod's
    claim completely, and keeps serving after the old pod has stopped."""
    base = tmp_path_factory.mktemp("roll")
    old = Plugin(base, host, api, host.inventory(), instance="11111111-aaaa")
    new = Plugin(base, host, api, host.inventory(), instance="22222222-bbbb")
    old.start()
    new.start()
    try:
        a = create_claim(api, ns, "a", [result("nic", NIC0)])
        b = create_claim(api, ns, "b", [result("nic", NIC0)])
        assert old.prepare([(ns, "a", a)]).claims[a].error == ""
        refused = new.prepare([(ns, "b", b)]).claims[b].error
        assert "already prepared for claim" in refused
        assert new.specs() == [spec_file(a)]
        assert new.unprepare([(ns, "a", a)]).claims[a].error == ""
        assert new.specs() == []
        old.stop()
        assert new.paths.dra_socket.exists()
        assert new.paths.registration_socket.exists()
        assert sorted(p.name for p in (base / "registry").iterdir()) == [
            f"{DRIVER}-22222222-bbbb-reg.sock"
        ]
        assert new.prepare([(ns, "b", b)]).claims[b].error == ""
        assert new.specs() == [spec_file(b)]
    finally:
        old.stop()
        new.stop()
    entries = Checkpoint(new.checkpoint_path, boot_id="boot-1").entries()
    assert [e.uid for e in entries] == [b]
