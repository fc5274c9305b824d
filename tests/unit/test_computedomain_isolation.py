"""Issue 29, points 1 and 2 at prepare: tenants cannot reach each other's domains through the
compute-domain kubelet driver, over real gRPC on a unix socket (the driver behind the shared
plugin server, kubelet's v1 stub) with the HTTP API server of test_computedomain_driver.

- a daemon claim is prepared only in the driver's namespace (where the controller makes the
  IMEX daemons' claims): from any other namespace, even the domain's own, it would hand a
  tenant the domain's IMEX folder, the IMEX management device and the driver's binaries;
- the node's checkpoint backs the controller's one-domain-per-node and channel holds: a claim
  of another domain, or for a channel another claim's prepared CDI spec holds, is refused
  until that claim is unprepared (the API may no longer show the holder: force-deleted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIMS, COMPUTE_DOMAINS
from fabricdra.kubeletplugin.kubelet import ClaimRef

from .test_computedomain_driver import NODE, NS, FakeApi, Kubelet, api, make_driver, specs

__all__ = ["api"]  # the fixture, shared

DRIVER_NS = "fd-system"


def _claim(
    api: FakeApi,
    ns: str,
    name: str,
    device: str,
    domain: str,
    domain_uid: str,
    channel: int = 0,
) -> ClaimRef:
    """A claim in `ns`, allocated `device` on this node, whose configuration names the
    ComputeDomain NS/`domain` (what the controller's templates write)."""
    if device == cd.CHANNEL_DEVICE:
        params: dict[str, Any] = {"kind": cd.OPAQUE_KIND, "channel": channel}
    else:
        params = {"kind": cd.DAEMON_OPAQUE_KIND}
    params |= {"namespace": NS, "domainName": domain, "domainUID": domain_uid}
    uid = f"uid-{ns}-{name}"
    api.docs[CLAIMS.path(ns, name)] = {
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": cd.DRIVER, "pool": NODE, "device": device, "request": "r"}
                    ],
                    "config": [{"opaque": {"driver": cd.DRIVER, "parameters": params}}],
                }
            }
        },
    }
    return ClaimRef(ns, name, uid)


def _channels(api: FakeApi, domain: str, *channels: int) -> None:
    api.docs[COMPUTE_DOMAINS.path(NS, domain)]["status"]["channels"] = list(channels)


def test_a_daemon_claim_outside_the_drivers_namespace_is_refused(
    tmp_path: Path, api: FakeApi
) -> None:
    api.domain("victim", "uid-victim")
    driver = make_driver(
        tmp_path, api, daemon_namespace=DRIVER_NS, driver_root=tmp_path / "driver-root"
    )
    folder = tmp_path / "plugin" / "domains" / "uid-victim"
    kubelet = Kubelet(tmp_path, driver)
    try:
        # Another tenant's claim naming the victim's domain; and one in the domain's own
        # namespace (its tenant may not run an IMEX daemon either).
        for ns in ("tenant-b", NS):
            stolen = _claim(api, ns, "imex", cd.DAEMON_DEVICE, "victim", "uid-victim")
            answer = kubelet.prepare(stolen)
            assert f"namespace {ns}" in answer.error, answer.error
            assert DRIVER_NS in answer.error, answer.error
            assert specs(tmp_path) == []
            assert not folder.exists()
            assert driver.checkpoint.get(stolen.uid) is None
        # The controller's own daemon claim, in the driver's namespace, is prepared.
        mine = _claim(api, DRIVER_NS, "imex", cd.DAEMON_DEVICE, "victim", "uid-victim")
        assert kubelet.prepare(mine).error == ""
        assert folder.is_dir()
    finally:
        kubelet.close()


def test_a_channel_another_claims_spec_holds_is_refused_until_it_is_unprepared(
    tmp_path: Path, api: FakeApi
) -> None:
    """Tenant A's claim was force-deleted while its pod runs: the API no longer shows it, and
    the controller handed its channel 0 to tenant B's new domain on the same node."""
    api.domain("a", "uid-a")
    api.domain("b", "uid-b")
    a0 = _claim(api, NS, "a-0", cd.CHANNEL_DEVICE, "a", "uid-a")
    b0 = _claim(api, NS, "b-0", cd.CHANNEL_DEVICE, "b", "uid-b")
    driver = make_driver(tmp_path, api)
    kubelet = Kubelet(tmp_path, driver)
    try:
        assert kubelet.prepare(a0).error == ""
        del api.docs[CLAIMS.path(NS, "a-0")]  # force-deleted: only the checkpoint knows it
        answer = kubelet.prepare(b0)
        assert "IMEX channel 0" in answer.error, answer.error
        assert f"{NS}/a-0" in answer.error, answer.error
        assert specs(tmp_path) == [f"fabricdra.io-compute-domain_{a0.uid}.json"]
        assert driver.checkpoint.get(b0.uid) is None
        # A second claim of A's own domain shares its channel, as a domain's pods do.
        a1 = _claim(api, NS, "a-1", cd.CHANNEL_DEVICE, "a", "uid-a")
        assert kubelet.prepare(a1).error == ""
        # Once A's pods are gone (kubelet unprepares from its own record), B gets the channel.
        assert kubelet.unprepare(a0).error == ""
        assert "IMEX channel 0" in kubelet.prepare(b0).error
        assert kubelet.unprepare(a1).error == ""
        assert kubelet.prepare(b0).error == ""
        spec_file = tmp_path / "cdi" / f"fabricdra.io-compute-domain_{b0.uid}.json"
        spec = json.loads(spec_file.read_text())
        assert "FABRICDRA_IMEX_CHANNEL=0" in spec["devices"][0]["containerEdits"]["env"]
    finally:
        kubelet.close()


def test_a_second_domain_on_the_node_is_refused_while_another_holds_it(
    tmp_path: Path, api: FakeApi
) -> None:
    """Tenant A stripped its claim's domain label and deleted its domain: the controller saw
    the node free and admitted tenant B's domain (another channel) while A's pod runs."""
    api.domain("a", "uid-a")
    api.domain("b", "uid-b")
    _channels(api, "b", 1)
    a0 = _claim(api, NS, "a-0", cd.CHANNEL_DEVICE, "a", "uid-a")
    b0 = _claim(api, NS, "b-0", cd.CHANNEL_DEVICE, "b", "uid-b", channel=1)
    b_daemon = _claim(api, DRIVER_NS, "imex-b", cd.DAEMON_DEVICE, "b", "uid-b")
    driver = make_driver(
        tmp_path, api, daemon_namespace=DRIVER_NS, driver_root=tmp_path / "driver-root"
    )
    kubelet = Kubelet(tmp_path, driver)
    try:
        assert kubelet.prepare(a0).error == ""
        for claim in (b0, b_daemon):
            answer = kubelet.prepare(claim)
            assert "uid-a" in answer.error, answer.error
            assert f"{NS}/a-0" in answer.error, answer.error
            assert "one ComputeDomain per node" in answer.error, answer.error
            assert driver.checkpoint.get(claim.uid) is None
        assert not (tmp_path / "plugin" / "domains" / "uid-b").exists()
        assert kubelet.unprepare(a0).error == ""
        assert kubelet.prepare(b0).error == ""
        assert kubelet.prepare(b_daemon).error == ""
    finally:
        kubelet.close()


def test_a_spec_that_cannot_be_read_is_not_taken_for_a_free_node(
    tmp_path: Path, api: FakeApi
) -> None:
    """Honesty: what another claim's spec holds is unknown when the file cannot be parsed, so
    the node is not taken for free; the error names the file."""
    api.domain("a", "uid-a")
    api.domain("b", "uid-b")
    a0 = _claim(api, NS, "a-0", cd.CHANNEL_DEVICE, "a", "uid-a")
    b0 = _claim(api, NS, "b-0", cd.CHANNEL_DEVICE, "b", "uid-b")
    kubelet = Kubelet(tmp_path, make_driver(tmp_path, api))
    try:
        assert kubelet.prepare(a0).error == ""
        spec = tmp_path / "cdi" / f"fabricdra.io-compute-domain_{a0.uid}.json"
        spec.write_text("{torn")
        answer = kubelet.prepare(b0)
        assert str(spec) in answer.error, answer.error
        assert driver_specs_without(tmp_path, a0.uid) == []
    finally:
        kubelet.close()


def driver_specs_without(base: Path, uid: str) -> list[str]:
    return [s for s in specs(base) if uid not in s]
