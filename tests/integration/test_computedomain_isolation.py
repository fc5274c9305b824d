"""Issue 29 point 2, the scenario of the issue against a real kube-apiserver: the controller
and the compute-domain kubelet driver (behind the shared plugin server, over real gRPC on a
unix socket, real files and device nodes under tmp roots). Tenant A's pod keeps running while
A strips its claim's domain label, deletes its domain, and at last force-deletes the claim;
tenant B's new domain must never get A's channel or A's node while A's claim is prepared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIM_TEMPLATES, CLAIMS, COMPUTE_DOMAINS, Rest
from fabricdra.kubeletplugin.computedomain.driver import ComputeDomainDriver, NodeConfig
from fabricdra.kubeletplugin.kubelet import ClaimRef, PluginPaths, PluginServer
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc

from .computedomain_helpers import (
    allocate_claim,
    create_plugin_node,
    domain_body,
    install_crd,
    running_controller,
    unique,
    wait_gone,
)
from .test_computedomain_node import roots

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]
__all__ = ["roots"]  # the fixture: proc (with the IMEX channel major), dev, cdi, plugin roots


def _answer(rest: Rest, ref: ClaimRef, type_: str) -> dict[str, Any] | None:
    """The controller's answer of `type_` (Admitted / Conflict) on the claim, if given."""
    obj = rest.get_or_none(CLAIMS, ref.name, ref.namespace) or {}
    for device in (obj.get("status") or {}).get("devices") or []:
        for c in device.get("conditions") or []:
            if c["type"] == type_ and c["status"] == "True":
                return dict(c)
    return None


def _channel(rest: Rest, ns: str, name: str) -> int:
    obj = wait_for(
        lambda: (rest.get(COMPUTE_DOMAINS, name, ns).get("status") or {}).get("channels"),
        what=f"{ns}/{name}'s channel",
    )
    return int(obj[0])


def test_a_tenant_cannot_free_its_node_or_channel_under_a_running_pod(
    control_plane: ControlPlane, roots: dict[str, Path], tmp_path: Path
) -> None:
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns_a, ns_b, driver_ns = unique("iso-a"), unique("iso-b"), unique("iso-system")
    control_plane.create_namespace(ns_a)
    control_plane.create_namespace(ns_b)
    node = unique("nvl")
    create_plugin_node(control_plane, node)  # no NVLink fabric label: no IMEX READY gate
    driver = ComputeDomainDriver(
        rest,
        NodeConfig(
            node_name=node,
            cdi_dir=roots["cdi"],
            plugin_dir=roots["plugin"],
            proc_root=roots["proc"],
            dev_root=roots["dev"],
            daemon_namespace=driver_ns,
        ),
    )
    paths = PluginPaths.for_driver(
        cd.DRIVER, registry_dir=tmp_path / "reg", plugin_dir=tmp_path / "sock"
    )
    with (
        running_controller(control_plane, driver_ns),
        PluginServer(driver, paths),
        grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch,
    ):
        stub = v1_grpc.DRAPluginStub(ch)

        def claims(ref: ClaimRef) -> list[Any]:
            return [v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)]

        def prepare(ref: ClaimRef) -> str:
            msg = v1_pb2.NodePrepareResourcesRequest(claims=claims(ref))
            return str(stub.NodePrepareResources(msg, timeout=45).claims[ref.uid].error)

        # Tenant A's job runs on the node.
        rest.create(COMPUTE_DOMAINS, domain_body("a", rct="a-imex"), ns_a)
        channel_a = _channel(rest, ns_a, "a")
        template_a = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "a-imex", ns_a), what="a")
        a0 = allocate_claim(rest, ns_a, template_a, node, "a-0", binding_conditions=True)
        wait_for(lambda: _answer(rest, a0, cd.ADMITTED_CONDITION), what="a-0 admitted")
        assert prepare(a0) == ""

        # A strips the claim's domain label and deletes its domain; its pod keeps running.
        rest.patch(CLAIMS, "a-0", {"metadata": {"labels": {cd.DOMAIN_LABEL: None}}}, ns_a)
        rest.delete(COMPUTE_DOMAINS, "a", ns_a)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "a", ns_a), "a deleted")

        # Tenant B's new domain gets another channel, and its claim on the node is refused:
        # A's claim still holds both.
        rest.create(COMPUTE_DOMAINS, domain_body("b", rct="b-imex"), ns_b)
        assert _channel(rest, ns_b, "b") != channel_a
        template_b = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "b-imex", ns_b), what="b")
        b0 = allocate_claim(rest, ns_b, template_b, node, "b-0", binding_conditions=True)
        refused = wait_for(lambda: _answer(rest, b0, cd.CONFLICT_CONDITION), what="b-0 refused")
        assert "which is deleted" in refused["message"], refused
        assert _answer(rest, b0, cd.ADMITTED_CONDITION) is None

        # A force-deletes its claim, the pod still running: the API no longer shows what holds
        # the node, so the controller admits B's next claim; the node's checkpoint refuses it.
        rest.delete(CLAIMS, "a-0", ns_a)
        wait_gone(lambda: rest.get_or_none(CLAIMS, "a-0", ns_a), "a-0 deleted")
        b1 = allocate_claim(rest, ns_b, template_b, node, "b-1", binding_conditions=True)
        wait_for(lambda: _answer(rest, b1, cd.ADMITTED_CONDITION), what="b-1 admitted")
        error = prepare(b1)
        assert "one ComputeDomain per node" in error, error
        assert f"{ns_a}/a-0" in error, error
        assert not (roots["cdi"] / f"fabricdra.io-compute-domain_{b1.uid}.json").exists()

        # A's pod ends: kubelet unprepares A's claim from its own record; now B's is prepared.
        msg = v1_pb2.NodeUnprepareResourcesRequest(claims=claims(a0))
        assert stub.NodeUnprepareResources(msg, timeout=45).claims[a0.uid].error == ""
        assert prepare(b1) == ""

        for name in ("b-0", "b-1"):
            rest.delete(CLAIMS, name, ns_b)
        rest.delete(COMPUTE_DOMAINS, "b", ns_b)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "b", ns_b), "b deleted")
