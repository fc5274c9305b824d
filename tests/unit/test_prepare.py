"""Prepare over a fake host (sysfs trees laid out as the kernel does, real character devices in
a test dev root, recorded NVML answers), with no cluster: the CDI specs it writes and what a
container ends up with once kubelet and a CDI runtime have applied them.

`Kubelet.container` follows kubelet's rule for the CDI ids a container gets (for each claim it
uses: every device when it names no request, else the devices whose request names contain the
request or are empty); `Cdi` resolves those ids from the spec folder and gives every value an
environment variable can end with. A variable with one possible value ends with it whatever
order the runtime applies the CDI devices in (CDI environment is last-wins).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from fabricdra.kube.rest import ApiError
from fabricdra.kubeletplugin.devices import DeviceInventory
from fabricdra.kubeletplugin.kinds import accelerator, rdma
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import ClaimRef, PreparedDevice, PrepareError
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.prepare import CDI_KIND, DevicesDriver
from tests.integration.kubelethost import Host, RdmaHost, build_host, build_rdma_host

DRIVER = "devices.fabricdra.io"
NS = "team"
GPU0, GPU1 = "gpu-0000-18-00-0", "gpu-0000-3a-00-0"
NIC0, NIC1 = "rdma-0000-19-00-0", "rdma-0000-3b-00-0"
MIG_GI1 = "mig-0000-cd-00-0-gi1-ci0"  # GPU 7 (/dev/nvidia7), capabilities nvidia-cap1/2


# -- the fake API, kubelet and CDI runtime --------------------------------------------------


@dataclass
class Claims:
    """ResourceClaims as the API server would return them."""

    objs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pod_reads: list[str] = field(default_factory=list)

    def add(
        self,
        name: str,
        results: list[dict[str, Any]],
        pods: Sequence[str] = (),
        groups: Sequence[str] = (),
    ) -> ClaimRef:
        uid = f"{len(self.objs):08d}-aaaa-4bbb-8ccc-{name[:12].ljust(12, '0')}"
        reserved = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
        # KEP-5729: a claim of a PodGroup is reserved for the group, not for its pods.
        reserved += [
            {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": g, "uid": f"g-{g}"}
            for g in groups
        ]
        self.objs[(NS, name)] = {
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"driver": DRIVER, "pool": "node-a", **r} for r in results]
                    }
                },
                "reservedFor": reserved,
            },
        }
        return ClaimRef(NS, name, uid)

    def add_pod(self, name: str, group: str | None = None) -> None:
        spec = {"schedulingGroup": {"podGroupName": group}} if group else {}
        self.pods[(NS, name)] = {
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": spec,
        }

    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        return copy.deepcopy(self.objs[(namespace, name)])

    def read_pod(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        self.pod_reads.append(name)
        if name == "gone":
            raise ApiError(404, f'pods "{name}" not found')
        if (namespace, name) not in self.pods:
            self.add_pod(name)  # a pod in no PodGroup
        return copy.deepcopy(self.pods[(namespace, name)])


class Cdi:
    """The CDI ids a runtime can resolve: our spec folder and the toolkit's."""

    def __init__(self, *folders: Path) -> None:
        self.devices: dict[str, list[dict[str, Any]]] = {}  # id -> [spec edits, device edits]
        for folder in folders:
            for path in sorted(folder.glob("*")):
                text = path.read_text()
                doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
                for d in doc["devices"]:
                    edits = [doc.get("containerEdits") or {}, d["containerEdits"]]
                    self.devices[f"{doc['kind']}={d['name']}"] = edits

    def edits(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        return [e for i in ids for e in self.devices[i]]  # KeyError: an id no spec defines

    def env_values(self, ids: Sequence[str], var: str) -> set[str]:
        """Every value `var` can end with, over all orders of applying `ids`."""
        return {
            e.split("=", 1)[1]
            for edits in self.edits(ids)
            for e in edits.get("env", [])
            if e.split("=", 1)[0] == var
        }

    def node_paths(self, ids: Sequence[str]) -> set[str]:
        return {n["path"] for edits in self.edits(ids) for n in edits.get("deviceNodes", [])}


def kubelet_ids(devices: Sequence[PreparedDevice], request: str = "") -> list[str]:
    """kubelet's cdiDevicesAsList for one `container.resources.claims` entry."""
    return [
        i
        for d in devices
        if not request or not d.request_names or request in d.request_names
        for i in d.cdi_device_ids
    ]


def hca_value(names: Sequence[str]) -> str:
    return "=" + ",".join(names)


# -- the node -----------------------------------------------------------------------------


@dataclass
class Node:
    base: Path
    host: Host | RdmaHost
    claims: Claims = field(default_factory=Claims)
    toolkit_dir: Path | None = None
    metadata: bool = False  # --device-metadata
    nccl_topo: bool = False  # --nccl-topo-file

    def __post_init__(self) -> None:
        self.inventory: DeviceInventory = self.host.inventory()
        self.driver = DevicesDriver(
            node_name="node-a",
            inventory=lambda: self.inventory,
            claims=self.claims,
            cdi=CdiWriter(self.base / "cdi", CDI_KIND),
            checkpoint=Checkpoint(self.base / "state" / "checkpoint.json", boot_id="boot-1"),
            host=self.host.layout,
            families=(NvidiaClaims(ToolkitSpecs((self.toolkit_dir,) if self.toolkit_dir else ())),),
            pods=self.claims,
            metadata_dir=self.base / "plugin" / "metadata" if self.metadata else None,
            nccl_topo_dir=self.base / "plugin" / "nccl-topo" if self.nccl_topo else None,
        )

    def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        return list(self.driver.prepare(claim))

    def cdi(self) -> Cdi:
        folders = [self.base / "cdi"] + ([self.toolkit_dir] if self.toolkit_dir else [])
        return Cdi(*folders)

    def spec(self, claim: ClaimRef) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.driver.cdi.path_for(claim.uid).read_text())
        return doc

    def verbs_of(self, hcas: Sequence[str]) -> set[str]:
        """The container paths of these HCAs' verbs devices."""
        eps = [rdma.payload_of(d).endpoint for d in self.inventory if d.type == "rdma"]
        by_name = {ep.rdmaDevice: ep.verbsDevice for ep in eps}
        return {f"/dev/infiniband/{by_name[h]}" for h in hcas}

    def hcas_reachable(self, ids: Sequence[str]) -> set[str]:
        """The HCAs whose verbs device a container given `ids` can open."""
        paths = self.cdi().node_paths(ids)
        eps = [rdma.payload_of(d).endpoint for d in self.inventory if d.type == "rdma"]
        return {
            ep.rdmaDevice
            for ep in eps
            if ep.rdmaDevice and f"/dev/infiniband/{ep.verbsDevice}" in paths
        }


@pytest.fixture(scope="module")
def dgx_nics(tmp_path_factory: pytest.TempPathFactory) -> RdmaHost:
    """A DGX-shaped NIC set: twelve HCAs (eight compute, four more), mlx5_0 ... mlx5_11."""
    return build_rdma_host(tmp_path_factory.mktemp("dgx"), hcas=12)


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(tmp_path_factory.mktemp("hgx"), mig_gpu=7)


@pytest.fixture
def nic_node(tmp_path: Path, dgx_nics: RdmaHost) -> Node:
    return Node(tmp_path, dgx_nics)


@pytest.fixture
def gpu_node(tmp_path: Path, hgx: Host) -> Node:
    return Node(tmp_path, hgx)


# -- point 1: every NIC reaches NCCL ------------------------------------------------------------


def test_a_whole_claim_with_eight_nic_requests_selects_all_eight(
    nic_node: Node, dgx_nics: RdmaHost
) -> None:
    # docs/examples/gpus-with-own-nics.yaml: one request per GPU's own NIC
    hcas = [f"mlx5_{i}" for i in (0, 1, 2, 3, 6, 7, 8, 9)]
    claim = nic_node.claims.add(
        "eight", [{"request": f"nic-{i}", "device": dgx_nics.device(h)} for i, h in enumerate(hcas)]
    )
    devices = nic_node.prepare(claim)
    ids = kubelet_ids(devices)  # a container that uses the whole claim
    cdi = nic_node.cdi()
    # One value, so every order of applying the CDI devices ends with all eight, exactly.
    assert cdi.env_values(ids, "NCCL_IB_HCA") == {hca_value(hcas)}
    assert nic_node.hcas_reachable(ids) == set(hcas)
    assert "/dev/infiniband/rdma_cm" in cdi.node_paths(ids)


def test_two_nic_requests_of_a_whole_claim_give_both_hcas(
    nic_node: Node, dgx_nics: RdmaHost
) -> None:
    # The reported case: NCCL_IB_HCA==mlx5_3 for a container given mlx5_2 and mlx5_3.
    a, b = dgx_nics.device("mlx5_2"), dgx_nics.device("mlx5_3")
    claim = nic_node.claims.add(
        "pair", [{"request": "nic-a", "device": a}, {"request": "nic-b", "device": b}]
    )
    ids = kubelet_ids(nic_node.prepare(claim))
    assert nic_node.cdi().env_values(ids, "NCCL_IB_HCA") == {"=mlx5_2,mlx5_3"}


def test_containers_bound_to_one_request_each_use_exactly_their_hcas(
    nic_node: Node, dgx_nics: RdmaHost
) -> None:
    a = ["mlx5_1"]
    b = ["mlx5_10", "mlx5_11"]  # mlx5_1 is a prefix of both: exact names only
    results = [{"request": "nic-a", "device": dgx_nics.device(h)} for h in a]
    results += [{"request": "nic-b", "device": dgx_nics.device(h)} for h in b]
    devices = nic_node.prepare(nic_node.claims.add("split", results))
    cdi = nic_node.cdi()
    for request, own in (("nic-a", a), ("nic-b", b)):
        ids = kubelet_ids(devices, request)
        # Only its own verbs devices: NCCL cannot open the other request's HCAs and skips them.
        assert nic_node.hcas_reachable(ids) == set(own)
        assert cdi.node_paths(ids) & nic_node.verbs_of(a + b) == nic_node.verbs_of(own)
        # The claim's one list (never fewer than its own, whatever the order) ...
        (value,) = cdi.env_values(ids, "NCCL_IB_HCA")
        assert value == "=mlx5_1,mlx5_10,mlx5_11"
        # ... so what NCCL uses is exactly its own HCAs.
        assert set(value[1:].split(",")) & nic_node.hcas_reachable(ids) == set(own)


def test_one_container_with_two_claims_of_its_pod_gets_every_hca(
    nic_node: Node, dgx_nics: RdmaHost
) -> None:
    d = dgx_nics.device
    left = nic_node.claims.add(
        "left",
        [{"request": "nic", "device": d("mlx5_0")}, {"request": "nic", "device": d("mlx5_1")}],
        pods=["trainer"],
    )
    right = nic_node.claims.add(
        "right", [{"request": "nic", "device": d("mlx5_5")}], pods=["trainer"]
    )
    other = nic_node.claims.add("other", [{"request": "nic", "device": d("mlx5_9")}], pods=["web"])
    # kubelet prepares a pod's claims of one driver in one call, one claim after the other
    by_claim = {c.name: nic_node.prepare(c) for c in (other, left, right)}
    cdi = nic_node.cdi()
    ids = kubelet_ids(by_claim["left"]) + kubelet_ids(by_claim["right"])
    assert cdi.env_values(ids, "NCCL_IB_HCA") == {"=mlx5_0,mlx5_1,mlx5_5"}
    # another pod's claim is neither widened nor widens
    assert cdi.env_values(kubelet_ids(by_claim["other"]), "NCCL_IB_HCA") == {"=mlx5_9"}
    # a container of the pod given one claim: a superset within the pod, its own verbs only
    only_right = kubelet_ids(by_claim["right"])
    assert cdi.env_values(only_right, "NCCL_IB_HCA") == {"=mlx5_0,mlx5_1,mlx5_5"}
    assert nic_node.hcas_reachable(only_right) == {"mlx5_5"}
    # a repeated prepare answers from the checkpoint and leaves the widened specs as they are
    assert nic_node.prepare(left) == by_claim["left"]
    assert nic_node.cdi().env_values(ids, "NCCL_IB_HCA") == {"=mlx5_0,mlx5_1,mlx5_5"}


@pytest.mark.parametrize("order", ["group-first", "pod-first"])
def test_a_pod_groups_claim_and_a_pods_own_claim_carry_one_hca_list(
    nic_node: Node, dgx_nics: RdmaHost, order: str
) -> None:
    """KEP-5729: a claim shared by a PodGroup is reserved for the group, the pod's own claim
    for the pod; a container of the pod using both still sees one list with every HCA."""
    d = dgx_nics.device
    nic_node.claims.add_pod("trainer-0", group="trainers")
    nic_node.claims.add_pod("web")
    group = nic_node.claims.add(
        "fabric", [{"request": "nic", "device": d("mlx5_0")}], groups=["trainers"]
    )
    own = nic_node.claims.add(
        "own", [{"request": "nic", "device": d("mlx5_5")}], pods=["trainer-0"]
    )
    other = nic_node.claims.add("other", [{"request": "nic", "device": d("mlx5_9")}], pods=["web"])
    claims = [group, own] if order == "group-first" else [own, group]
    by_claim = {c.name: nic_node.prepare(c) for c in [other, *claims]}
    cdi = nic_node.cdi()
    ids = kubelet_ids(by_claim["fabric"]) + kubelet_ids(by_claim["own"])
    assert cdi.env_values(ids, "NCCL_IB_HCA") == {"=mlx5_0,mlx5_5"}
    assert cdi.env_values(kubelet_ids(by_claim["fabric"]), "NCCL_IB_HCA") == {"=mlx5_0,mlx5_5"}
    # a pod outside the group is neither widened nor widens
    assert cdi.env_values(kubelet_ids(by_claim["other"]), "NCCL_IB_HCA") == {"=mlx5_9"}


def test_only_an_rdma_claims_pods_are_read_and_an_unreadable_one_fails_it(
    gpu_node: Node,
) -> None:
    gpu_node.claims.add_pod("a")
    gpu = gpu_node.claims.add("g", [{"request": "gpu", "device": GPU0}], pods=["a"])
    gpu_node.prepare(gpu)
    assert gpu_node.claims.pod_reads == []  # no NCCL list: no PodGroup to look for
    nic = gpu_node.claims.add("n", [{"request": "nic", "device": NIC0}], pods=["gone"])
    with pytest.raises(PrepareError, match=r"cannot read pod team/gone .* for its PodGroup: 404"):
        gpu_node.prepare(nic)
    assert not gpu_node.driver.cdi.path_for(nic.uid).exists()


# -- point 2: NVIDIA_VISIBLE_DEVICES=void only with GPUs ---------------------------------------


def test_a_nic_only_claim_leaves_the_device_plugins_gpus_alone(gpu_node: Node) -> None:
    claim = gpu_node.claims.add("nics", [{"request": "nic", "device": NIC0}])
    ids = kubelet_ids(gpu_node.prepare(claim))
    assert gpu_node.cdi().env_values(ids, "NVIDIA_VISIBLE_DEVICES") == set()
    assert "NVIDIA_VISIBLE_DEVICES" not in json.dumps(gpu_node.spec(claim))


def test_only_containers_given_gpus_get_void(gpu_node: Node) -> None:
    claim = gpu_node.claims.add(
        "mixed",
        [
            {"request": "gpu", "device": GPU0},
            {"request": "mig", "device": MIG_GI1},
            {"request": "nic", "device": NIC1},
        ],
    )
    devices = gpu_node.prepare(claim)
    cdi = gpu_node.cdi()
    assert cdi.env_values(kubelet_ids(devices), "NVIDIA_VISIBLE_DEVICES") == {"void"}
    assert cdi.env_values(kubelet_ids(devices, "gpu"), "NVIDIA_VISIBLE_DEVICES") == {"void"}
    assert cdi.env_values(kubelet_ids(devices, "mig"), "NVIDIA_VISIBLE_DEVICES") == {"void"}
    assert cdi.env_values(kubelet_ids(devices, "nic"), "NVIDIA_VISIBLE_DEVICES") == set()
    assert "containerEdits" not in gpu_node.spec(claim)  # nothing spec-wide


def test_gpus_through_the_toolkits_ids_get_void_too(tmp_path: Path, hgx: Host) -> None:
    toolkit = _toolkit(tmp_path / "etc-cdi", [_device("0", "/dev/nvidia0")])
    node = Node(tmp_path, hgx, toolkit_dir=toolkit)
    devices = node.prepare(node.claims.add("tk", [{"request": "gpu", "device": GPU0}]))
    assert devices[0].cdi_device_ids[0] == "nvidia.com/gpu=0"
    assert node.cdi().env_values(kubelet_ids(devices), "NVIDIA_VISIBLE_DEVICES") == {"void"}


# -- point 4: a MIG grant never resolves to the toolkit's `all` --------------------------------


def _device(name: str, *nodes: str) -> dict[str, Any]:
    return {"name": name, "containerEdits": {"deviceNodes": [{"path": p} for p in nodes]}}


def _toolkit(folder: Path, devices: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}
    (folder / "nvidia.yaml").write_text(yaml.safe_dump(spec))
    return folder


def _mig_uuid(node: Node, name: str) -> str:
    dev = node.inventory.get(name)
    assert dev is not None
    mig = accelerator.payload_of(dev).mig
    assert mig is not None
    assert mig.uuid
    return mig.uuid


CAPS = ("/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2")


def test_a_mig_grant_never_gets_the_all_device_on_a_one_instance_node(
    tmp_path: Path, hgx: Host
) -> None:
    # One GPU, one instance: `all` holds exactly the instance's nodes, and the toolkit wrote
    # no device of the instance's own (a stale spec).
    toolkit = _toolkit(tmp_path / "etc-cdi", [_device("all", "/dev/nvidia7", *CAPS)])
    node = Node(tmp_path, hgx, toolkit_dir=toolkit)
    devices = node.prepare(node.claims.add("mig", [{"request": "mig", "device": MIG_GI1}]))
    ids = list(devices[0].cdi_device_ids)
    assert not any(i.startswith("nvidia.com/gpu=") for i in ids)
    assert node.cdi().node_paths(ids) == {
        "/dev/nvidia7",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        *CAPS,
    }


def test_a_toolkit_device_found_by_uuid_is_used_only_with_exactly_its_nodes(
    tmp_path: Path, hgx: Host
) -> None:
    node = Node(tmp_path, hgx)
    uuid = _mig_uuid(node, MIG_GI1)
    # named by the instance's UUID, but holding another instance's capabilities too
    _toolkit(
        tmp_path / "etc-cdi",
        [_device(uuid, "/dev/nvidia7", *CAPS, "/dev/nvidia-caps/nvidia-cap11")],
    )
    node = Node(tmp_path / "a", hgx, toolkit_dir=tmp_path / "etc-cdi")
    devices = node.prepare(node.claims.add("mig", [{"request": "mig", "device": MIG_GI1}]))
    assert not any(i.startswith("nvidia.com/gpu=") for i in devices[0].cdi_device_ids)
    assert "/dev/nvidia-caps/nvidia-cap11" not in node.cdi().node_paths(kubelet_ids(devices))
    # exactly its nodes: the toolkit's id
    _toolkit(tmp_path / "etc-cdi", [_device(uuid, "/dev/nvidia7", *CAPS)])
    node = Node(tmp_path / "b", hgx, toolkit_dir=tmp_path / "etc-cdi")
    devices = node.prepare(node.claims.add("mig2", [{"request": "mig", "device": MIG_GI1}]))
    assert devices[0].cdi_device_ids[0] == f"nvidia.com/gpu={uuid}"


def test_a_gpu_found_by_uuid_with_another_gpus_node_is_not_used(tmp_path: Path, hgx: Host) -> None:
    uuid0 = json.loads(hgx.nvml_snapshot.read_text())[hgx.hgx.gpus[0]]["uuid"]
    toolkit = _toolkit(tmp_path / "etc-cdi", [_device(uuid0, "/dev/nvidia0", "/dev/nvidia1")])
    node = Node(tmp_path, hgx, toolkit_dir=toolkit)
    devices = node.prepare(node.claims.add("gpu", [{"request": "gpu", "device": GPU0}]))
    ids = kubelet_ids(devices)
    assert not any(i.startswith("nvidia.com/gpu=") for i in ids)
    assert "/dev/nvidia1" not in node.cdi().node_paths(ids)


# -- point 10: foreign CDI specs do not make GPU prepare re-read the toolkit's ------------------


def test_foreign_specs_rewritten_elsewhere_are_not_parsed(tmp_path: Path) -> None:
    folder = _toolkit(tmp_path / "cdi", [_device("0", "/dev/nvidia0")])
    foreign = [folder / f"other.example.com-net_{i}.json" for i in range(50)]
    for i, f in enumerate(foreign):
        f.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "other.example.com/net", "i": i}))
    specs = ToolkitSpecs((folder,))
    first = specs.devices()
    assert specs.gpu_id(None, 0) == "nvidia.com/gpu=0"
    # Another driver rewrites its specs (one half-written by a non-atomic writer): the
    # toolkit's table stays as it was, and no foreign file is parsed (a parse would warn).
    for i, f in enumerate(foreign):
        f.write_text('{"cdiVersion": "0.6.0", "kind": "other.exa' if i == 7 else f"{{ {i} }}")
    with structlog.testing.capture_logs() as logs:
        assert specs.devices() is first
    assert logs == []
    # A new toolkit device is seen at once.
    _toolkit(folder, [_device("0", "/dev/nvidia0"), _device("1", "/dev/nvidia1")])
    assert specs.gpu_id(None, 1) == "nvidia.com/gpu=1"


def test_a_file_that_becomes_a_toolkit_spec_is_picked_up(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    folder.mkdir()
    (folder / "x.json").write_text(json.dumps({"kind": "other.example.com/net", "devices": []}))
    specs = ToolkitSpecs((folder,))
    assert specs.gpu_id(None, 3) is None
    doc = {"kind": "nvidia.com/gpu", "devices": [_device("3", "/dev/nvidia3")]}
    (folder / "x.json").write_text(json.dumps(doc) + " ")  # another size: another stat
    assert specs.gpu_id(None, 3) == "nvidia.com/gpu=3"
    (folder / "x.json").unlink()
    assert specs.gpu_id(None, 3) is None


# -- KEP-5304: the devices' metadata in the container ---------------------------------------

META = "/var/run/kubernetes.io/dra-device-attributes"


def mounts(node: Node, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """containerPath -> mount, over the CDI devices `ids` resolve to."""
    return {m["containerPath"]: m for e in node.cdi().edits(ids) for m in e.get("mounts", [])}


def test_each_request_gets_its_devices_metadata_file(tmp_path: Path, hgx: Host) -> None:
    node = Node(tmp_path, hgx, metadata=True)
    claim = node.claims.add(
        "train", [{"request": "gpu", "device": GPU0}, {"request": "nic", "device": NIC0}]
    )
    devices = node.prepare(claim)
    gpu_path = f"{META}/resourceclaims/train/gpu/{DRIVER}-metadata.json"
    nic_path = f"{META}/resourceclaims/train/nic/{DRIVER}-metadata.json"
    # a container bound to one request sees only that request's file
    assert set(mounts(node, kubelet_ids(devices, "gpu"))) == {gpu_path}
    assert set(mounts(node, kubelet_ids(devices, "nic"))) == {nic_path}
    mount = mounts(node, kubelet_ids(devices))[gpu_path]
    assert mount["options"] == ["ro", "bind"]
    doc = json.loads(Path(mount["hostPath"]).read_text())
    assert (doc["apiVersion"], doc["kind"]) == (
        "metadata.resource.k8s.io/v1alpha1",
        "DeviceMetadata",
    )
    assert doc["metadata"] == {"name": "train", "namespace": NS, "uid": claim.uid, "generation": 1}
    assert "podClaimName" not in doc
    ((request,),) = [doc["requests"]]
    assert request["name"] == "gpu"
    (device,) = request["devices"]
    assert (device["driver"], device["pool"], device["name"]) == (DRIVER, "node-a", GPU0)
    # the attributes the ResourceSlice publishes, in their wire form
    assert device["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    assert device["attributes"]["type"] == {"string": "gpu"}
    # unprepare removes the files with the spec
    node.driver.unprepare(claim)
    assert not Path(mount["hostPath"]).exists()
    assert list((tmp_path / "plugin" / "metadata").iterdir()) == []


def test_a_template_claims_file_is_under_the_pods_claim_name(tmp_path: Path, hgx: Host) -> None:
    node = Node(tmp_path, hgx, metadata=True)
    claim = node.claims.add("trainer-0-gpu-x7k2p", [{"request": "gpu", "device": GPU0}])
    meta = node.claims.objs[(NS, claim.name)]["metadata"]
    meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    devices = node.prepare(claim)
    path = f"{META}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"
    (mount,) = mounts(node, kubelet_ids(devices)).values()
    assert mount["containerPath"] == path
    assert json.loads(Path(mount["hostPath"]).read_text())["podClaimName"] == "gpu"


def test_no_metadata_unless_asked(gpu_node: Node) -> None:
    devices = gpu_node.prepare(gpu_node.claims.add("plain", [{"request": "gpu", "device": GPU0}]))
    assert mounts(gpu_node, kubelet_ids(devices)) == {}


# -- NCCL_CROSS_NIC (issue 27 point 6) ---------------------------------------------------------


def test_nics_with_measured_rails_keep_nccl_on_its_rails(gpu_node: Node, hgx: Host) -> None:
    """The HGX node is rail-optimised (NIC i beside GPU i): a claim of two of its NICs gets
    NCCL_CROSS_NIC=0 beside NCCL_IB_HCA; a NIC-only node has no rails, so its claims do not
    (tests/unit/test_scaleout_node.py proves where the rails come from)."""
    by_rdma = {
        rdma.payload_of(d).endpoint.rdmaDevice: d.name
        for d in gpu_node.inventory
        if d.type == "rdma" and rdma.payload_of(d).endpoint.rdmaDevice
    }
    claim = gpu_node.claims.add(
        "railed",
        [
            {"request": "nic-a", "device": by_rdma["mlx5_0"]},
            {"request": "nic-b", "device": by_rdma["mlx5_1"]},
        ],
    )
    ids = kubelet_ids(gpu_node.prepare(claim))
    assert gpu_node.cdi().env_values(ids, "NCCL_CROSS_NIC") == {"0"}
    assert gpu_node.cdi().env_values(ids, "NCCL_IB_HCA") == {"=mlx5_0,mlx5_1"}


def test_nics_without_rails_leave_nccl_cross_nic_alone(nic_node: Node, dgx_nics: RdmaHost) -> None:
    claim = nic_node.claims.add(
        "unrailed", [{"request": "nic", "device": dgx_nics.device("mlx5_2")}]
    )
    ids = kubelet_ids(nic_node.prepare(claim))
    assert nic_node.cdi().env_values(ids, "NCCL_CROSS_NIC") == set()


# -- NCCL_TOPO_FILE (issue 27 point 6) ---------------------------------------------------------


@pytest.fixture(scope="module")
def dgx(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(tmp_path_factory.mktemp("dgxh100"), dgx=True)


DGX_NIC0, DGX_NIC1 = "rdma-0000-19-00-0", "rdma-0000-3b-00-0"  # mlx5_0, mlx5_1: rails 0, 1


def topo_files(node: Node, ids: Sequence[str]) -> dict[str, str]:
    """NCCL_TOPO_FILE value -> the content of the host file mounted there, for every value a
    container given `ids` can end with."""
    cdi = node.cdi()
    by_target = {m["containerPath"]: m["hostPath"] for m in mounts(node, ids).values()}
    return {v: Path(by_target[v]).read_text() for v in cdi.env_values(ids, "NCCL_TOPO_FILE")}


def described(text: str) -> set[str]:
    """The GPUs (bus ids) and nets (names) a topology file describes."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(text)
    gpus = {p.attrib["busid"] for p in root.iter("pci") if p.find("gpu") is not None}
    return gpus | {n.attrib["name"] for n in root.iter("net")}


def test_a_gpu_claim_gets_the_topology_of_exactly_its_devices(tmp_path: Path, dgx: Host) -> None:
    node = Node(tmp_path, dgx, nccl_topo=True)
    claim = node.claims.add(
        "pair",
        [
            {"request": "gpu", "device": GPU0},
            {"request": "gpu", "device": GPU1},
            {"request": "nic", "device": DGX_NIC0},
            {"request": "nic", "device": DGX_NIC1},
        ],
    )
    devices = node.prepare(claim)
    for request in ("", "gpu", "nic"):  # whole claim, or one request: the same one file
        files = topo_files(node, kubelet_ids(devices, request))
        assert list(files) == [f"/var/run/fabricdra/nccl-topo-{claim.uid}.xml"]
    (text,) = topo_files(node, kubelet_ids(devices)).values()
    assert described(text) == {"0000:18:00.0", "0000:3a:00.0", "mlx5_0", "mlx5_1"}
    assert '<net name="mlx5_0" rail="0"/>' in text
    (mount,) = [m for m in mounts(node, kubelet_ids(devices)).values() if "nccl" in m["hostPath"]]
    assert mount["options"] == ["ro", "bind"]
    node.driver.unprepare(claim)
    assert not Path(mount["hostPath"]).exists()


def test_a_nic_only_claim_gets_no_topology(tmp_path: Path, dgx: Host) -> None:
    """NCCL builds its graph from GPUs: a file without one would give it nothing to use."""
    node = Node(tmp_path, dgx, nccl_topo=True)
    devices = node.prepare(node.claims.add("nics", [{"request": "nic", "device": DGX_NIC0}]))
    assert node.cdi().env_values(kubelet_ids(devices), "NCCL_TOPO_FILE") == set()
    assert not (tmp_path / "plugin" / "nccl-topo").exists()


def test_claims_of_one_pod_describe_the_pods_devices_whatever_claim_wins(
    tmp_path: Path, dgx: Host
) -> None:
    """Like NCCL_IB_HCA: a container using several claims ends with one NCCL_TOPO_FILE (CDI
    environment is last-wins), so every claim's file describes the pod's GPUs and NICs; a claim
    of another pod keeps its own."""
    node = Node(tmp_path, dgx, nccl_topo=True)
    a = node.claims.add("a", [{"request": "gpu", "device": GPU0}], pods=["trainer"])
    b = node.claims.add("b", [{"request": "gpu", "device": GPU1}], pods=["trainer"])
    nics = node.claims.add(
        "n",
        [{"request": "nic", "device": DGX_NIC0}, {"request": "nic", "device": DGX_NIC1}],
        pods=["trainer"],
    )
    other = node.claims.add("o", [{"request": "gpu", "device": "gpu-0000-4b-00-0"}], pods=["web"])
    ids = [i for c in (a, b, nics) for i in kubelet_ids(node.prepare(c))]
    other_ids = kubelet_ids(node.prepare(other))
    files = topo_files(node, ids)
    assert len(files) == 2  # a's and b's paths: the NIC-only claim carries none
    pod = {"0000:18:00.0", "0000:3a:00.0", "mlx5_0", "mlx5_1"}
    assert {frozenset(described(t)) for t in files.values()} == {frozenset(pod)}
    (alone,) = topo_files(node, other_ids).values()
    assert described(alone) == {"0000:4b:00.0"}


def test_no_topology_file_unless_asked(tmp_path: Path, dgx: Host) -> None:
    node = Node(tmp_path, dgx)
    devices = node.prepare(node.claims.add("plain", [{"request": "gpu", "device": GPU0}]))
    assert node.cdi().env_values(kubelet_ids(devices), "NCCL_TOPO_FILE") == set()


def test_a_node_whose_switch_links_are_unreadable_gets_no_topology(
    tmp_path: Path, hgx: Host
) -> None:
    """The HGX tree has no link files on its bridges: NCCL could not use a file naming the
    NIC's switch without them, so none is written (and prepare succeeds)."""
    node = Node(tmp_path, hgx, nccl_topo=True)
    devices = node.prepare(
        node.claims.add(
            "g", [{"request": "gpu", "device": GPU0}, {"request": "nic", "device": NIC0}]
        )
    )
    assert node.cdi().env_values(kubelet_ids(devices), "NCCL_TOPO_FILE") == set()
