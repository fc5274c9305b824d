"""Dynamic MIG in the node agent, for real but for NVML: the agent (`--dynamic-mig`) publishes
to a real API server, kubelet's calls arrive over gRPC on its unix socket, claims are real
ResourceClaims with their allocation, and the MIG instances are made by a fake NVML keeping
the H100's placement rules (tests/nvmlfake/mig.py; the live creator's NVML calls are tested
against a C stand-in in tests/unit/test_mig_nvml.py).

At start-up the agent destroys an instance a crash left half-recorded before it serves
kubelet; a prepare creates the placement's instance and hands over its capability nodes; the
next pass publishes it under the placement's name (what the claim was allocated), not as an
adopted static instance; unprepare destroys it."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import pytest

from e2e.harness.controlplane import ControlPlane
from e2e.harness.poll import wait_for
from fabricdra.kubeletplugin.agent import Agent
from fabricdra.kubeletplugin.devices import DeviceConfig
from fabricdra.kubeletplugin.kinds.nvidia.dynamicmig import DynamicMig
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from tests.integration.kubelethost import build_host, create_claim
from tests.integration.test_kubelet_agent import agent_config, crds, node, slice_devices
from tests.nvmlfake.mig import Crash, FakeMigGpu, FakeNvml
from tests.unit.test_dynamic_mig_prepare import mig_of

pytestmark = pytest.mark.integration

__all__ = ["crds", "node"]  # the fixtures, shared with test_kubelet_agent

MIG_GPU = 7


def _stem(bus: str) -> str:
    return bus.replace(":", "-").replace(".", "-")


def _call(socket: Path, method: str, ns: str, name: str, uid: str) -> v1_pb2.Claim:
    request = getattr(v1_pb2, f"{method}Request")(
        claims=[v1_pb2.Claim(namespace=ns, name=name, uid=uid)]
    )
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        return getattr(v1_grpc.DRAPluginStub(ch), method)(request, timeout=45).claims[uid]


def test_agent_recovers_prepares_publishes_and_unprepares_a_placement(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, crds: None, node: str
) -> None:
    base = tmp_path_factory.mktemp("dynmig")
    host = build_host(base / "host", vf_nics=(), mig_gpu=MIG_GPU)
    bus = host.hgx.gpus[MIG_GPU]
    snapshot = json.loads(host.nvml_snapshot.read_text())
    snapshot[bus]["migDevices"] = []  # MIG mode on, no instance yet
    host.nvml_snapshot.write_text(json.dumps(snapshot))
    config = agent_config(
        base, host, node, discovery_interval=3600, devices=DeviceConfig(dynamic_mig=True)
    )
    nvml = FakeNvml({bus: FakeMigGpu.h100_80gb()})
    # A crash of an earlier agent: NVML made the instance, its ids were never recorded.
    nvml.crash_after_create = True
    with pytest.raises(Crash):
        DynamicMig(nvml, config.mig_journal_path).create(
            "old-claim", f"mig-{_stem(bus)}-1g-10gb-m6", bus, "1g.10gb", 6
        )
    assert len(nvml.gpus[bus].instances) == 1

    placement = f"mig-{_stem(bus)}-3g-40gb-m4"
    with control_plane.api_client() as api:
        agent = Agent(config, api, mig_nvml=nvml)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,))
        thread.start()
        try:
            wait_for(agent.server.paths.registration_socket.exists, what="the registration socket")
            # recovered before kubelet could call: the leftover is gone, and its record
            assert nvml.gpus[bus].instances == {}
            assert mig_of(agent.driver) is not None
            assert mig_of(agent.driver).records() == []
            assert placement in wait_for(
                lambda: [d for d in slice_devices(api, node) if d == placement],
                what="the placement published",
            )

            uid = create_claim(
                api, node, "mig", [{"request": "mig", "device": placement, "pool": node}]
            )
            socket = agent.server.paths.dra_socket
            prepared = _call(socket, "NodePrepareResources", node, "mig", uid)
            assert prepared.error == ""
            assert [d.device_name for d in prepared.devices] == [placement]
            (gi,) = nvml.gpus[bus].instances.values()
            assert (gi.profile, gi.start) == ("3g.40gb", 4)
            spec = json.loads(next(config.cdi_dir.glob(f"*{uid}*")).read_text())
            nodes = {
                n["path"]
                for d in spec["devices"]
                for n in d["containerEdits"].get("deviceNodes", [])
            }
            # the new instance's own capability nodes (build_host: gi1 cap1/2, gi2 cap11/12)
            caps = {1: (1, 2), 2: (11, 12)}[gi.id]
            assert {f"/dev/nvidia-caps/nvidia-cap{m}" for m in caps} <= nodes

            # NVML now lists the instance: published under the placement, not adopted
            snapshot[bus]["migDevices"] = [
                {
                    "uuid": gi.uuid,
                    "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                    "gpuInstanceId": gi.id,
                    "computeInstanceId": 0,
                    "placementStart": 4,
                }
            ]
            host.nvml_snapshot.write_text(json.dumps(snapshot))
            inventory = agent.pass_once()
            mig = [d.name for d in inventory if d.name.startswith(f"mig-{_stem(bus)}")]
            assert placement in mig
            assert f"mig-{_stem(bus)}-gi{gi.id}-ci0" not in mig

            unprepared = _call(socket, "NodeUnprepareResources", node, "mig", uid)
            assert unprepared.error == ""
            assert nvml.gpus[bus].instances == {}
            assert mig_of(agent.driver).records() == []
        finally:
            agent.stop_event_wakes(stop)
            thread.join(timeout=20)
        assert not thread.is_alive()
