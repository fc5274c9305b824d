"""The compute-domain node side against a real kube-apiserver: the kubelet driver's prepare /
unprepare (real files, real device nodes under tmp roots) and the IMEX daemon with the
stand-in IMEX executables, reporting through the controller into the domain's status."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

import grpc
import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    LEASES,
    NODES,
    Rest,
)
from fabricdra.kubeletplugin.computedomain.daemon import DaemonIdentity, ImexDaemon
from fabricdra.kubeletplugin.computedomain.driver import ComputeDomainDriver, NodeConfig
from fabricdra.kubeletplugin.computedomain.imex import ImexSettings, ImexSupervisor
from fabricdra.kubeletplugin.computedomain.plugin import ComputeDomainPlugin, PluginConfig
from fabricdra.kubeletplugin.computedomain.report import write_host_report
from fabricdra.kubeletplugin.kubelet import PluginPaths, PluginServer, PrepareError
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from tests.imex import driver_tree

from .computedomain_helpers import (
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    give_addresses,
    install_crd,
    report_daemon,
    running_controller,
    unique,
    wait_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]
STAND_INS = Path(__file__).resolve().parents[1] / "imex"
MAJOR = 234


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    proc.mkdir()
    (proc / "devices").write_text(
        f"Character devices:\n195 nvidia\n{MAJOR} nvidia-caps-imex-channels\n\nBlock devices:\n"
    )
    return {"proc": proc, "dev": dev, "cdi": tmp_path / "cdi", "plugin": tmp_path / "plugin"}


def test_prepare_injects_exactly_the_domains_channel(
    control_plane: ControlPlane, roots: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, other_ns, driver_ns = unique("cd-node"), unique("cd-other"), unique("cd-system")
    control_plane.create_namespace(ns)
    control_plane.create_namespace(other_ns)
    node = unique("gb300")
    create_plugin_node(control_plane, node, fabric="rack-7")
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("other", mode="host"), ns)
        rest.create(COMPUTE_DOMAINS, domain_body("train", rct="train-imex"), ns)
        domain = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "train", ns)).get("status", {}).get("channels")
                and o
            ),
            what="channel",
        )
        channel = domain["status"]["channels"][0]
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "train-imex", ns), what="template"
        )
        driver = ComputeDomainDriver(
            rest,
            NodeConfig(
                node_name=node,
                cdi_dir=roots["cdi"],
                plugin_dir=roots["plugin"],
                proc_root=roots["proc"],
                dev_root=roots["dev"],
                fabric_domain="rack-7",
                imex_wait_seconds=1.0,
            ),
        )

        ref = allocate_claim(rest, ns, template, node, "train-0")
        # IMEX is not READY on this node yet: refused after the bounded wait, nothing written.
        with pytest.raises(PrepareError, match=r"IMEX .* is not ready on node"):
            driver.prepare(ref)
        assert driver.checkpoint.get(ref.uid) is None
        assert not (roots["cdi"] / f"fabricdra.io-compute-domain_{ref.uid}.json").exists()
        uid = domain["metadata"]["uid"]
        report_daemon(rest, driver_ns, uid, node, ready=True, message="READY", ip="10.0.0.7")
        wait_for(
            lambda: any(
                r["name"] == node and r["ready"]
                for r in rest.get(COMPUTE_DOMAINS, "train", ns)["status"].get("nodes", [])
            ),
            what="the node's IMEX reported READY",
        )
        prepared = driver.prepare(ref)
        assert [(p.pool_name, p.device_name) for p in prepared] == [(node, cd.CHANNEL_DEVICE)]
        spec_file = roots["cdi"] / f"fabricdra.io-compute-domain_{ref.uid}.json"
        spec = json.loads(spec_file.read_text())
        edits = spec["devices"][0]["containerEdits"]
        assert edits["deviceNodes"] == [
            {
                "path": f"/dev/nvidia-caps-imex-channels/channel{channel}",
                "type": "c",
                "major": MAJOR,
                "minor": channel,
                "permissions": "rw",
            }
        ]
        assert f"FABRICDRA_IMEX_CHANNEL={channel}" in edits["env"]
        assert prepared[0].cdi_device_ids == (f"fabricdra.io/compute-domain={ref.uid}-channel",)
        host = roots["dev"] / "nvidia-caps-imex-channels" / f"channel{channel}"
        assert stat.S_ISCHR(host.lstat().st_mode)
        assert host.lstat().st_rdev == os.makedev(MAJOR, channel)

        # Idempotent; a second pod of the domain gets its own claim with the same channel.
        assert driver.prepare(ref) == prepared
        second = driver.prepare(allocate_claim(rest, ns, template, node, "train-1"))
        assert second[0].device_name == cd.CHANNEL_DEVICE

        # The claim's configuration used from another namespace is refused, and nothing is
        # written for it.
        stolen = allocate_claim(rest, other_ns, template, node, "stolen")
        with pytest.raises(PrepareError, match="namespace"):
            driver.prepare(stolen)
        assert not (roots["cdi"] / f"fabricdra.io-compute-domain_{stolen.uid}.json").exists()
        assert driver.checkpoint.get(stolen.uid) is None

        # A channel the domain does not hold is refused (e.g. a hand-written claim).
        forged = json.loads(json.dumps(template))
        forged["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["channel"] = 2047
        bad = allocate_claim(rest, ns, forged, node, "forged")
        with pytest.raises(PrepareError, match="holds"):
            driver.prepare(bad)
        # One outside the host's range does not even validate (fabricdra.api.opaque): the
        # message names the field, as the controller's would have.
        forged["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["channel"] = 2048
        worse = allocate_claim(rest, ns, forged, node, "forged-range")
        with pytest.raises(PrepareError, match="invalid ComputeDomainChannelConfig: channel: "):
            driver.prepare(worse)
        assert driver.checkpoint.get(worse.uid) is None

        # The same driver behind the shared kubelet plugin server, over its real socket.
        paths = PluginPaths.for_driver(
            cd.DRIVER,
            registry_dir=tmp_path_factory.mktemp("reg"),
            plugin_dir=tmp_path_factory.mktemp("cdp"),
        )
        with PluginServer(driver, paths), grpc.insecure_channel(f"unix://{paths.dra_socket}") as ch:
            claim = v1_pb2.Claim(namespace=ns, name="train-1", uid=_uid(rest, ns, "train-1"))
            resp = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=30
            )
        answer = resp.claims[claim.uid]
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == [cd.CHANNEL_DEVICE]
        assert answer.devices[0].cdi_device_ids == [
            f"fabricdra.io/compute-domain={claim.uid}-channel"
        ]

        # Unprepare removes exactly what prepare wrote; twice is fine.
        driver.unprepare(ref)
        assert not spec_file.exists()
        assert driver.checkpoint.get(ref.uid) is None
        driver.unprepare(ref)
        # A restarted driver still knows the other claim (checkpoint on disk).
        again = ComputeDomainDriver(rest, driver.config)
        assert again.checkpoint.get(_uid(rest, ns, "train-1")) is not None

        for name in ("train", "other"):
            rest.delete(COMPUTE_DOMAINS, name, ns)
        for name in ("train", "other"):
            wait_gone(lambda name=name: rest.get_or_none(COMPUTE_DOMAINS, name, ns), name)


def _plugin(
    cp: ControlPlane, node: str, roots: dict[str, Path], tmp_path: Path
) -> ComputeDomainPlugin:
    """The compute-domain plugin of `node` (not serving: prepare is called directly), with a
    short IMEX wait and no host report."""
    return ComputeDomainPlugin(
        PluginConfig(
            node_name=node,
            cdi_dir=roots["cdi"],
            plugin_dir=roots["plugin"],
            registry_dir=tmp_path / "registry",
            proc_root=roots["proc"],
            dev_root=roots["dev"],
            imex_wait_seconds=1.0,
            host_imex_interval=0,
        ),
        cp.api_client(),
    )


def test_the_plugin_follows_its_nodes_fabric_label_for_the_imex_gate(
    control_plane: ControlPlane, roots: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 22 point 4. On a fresh node the compute-domain plugin starts before the
    devices agent's first pass labels the node's fabric domain. A plugin that read the label
    once, at start, kept "no fabric" and skipped the managed-mode IMEX READY gate in prepare
    for good (workloads started before IMEX was ready). It follows the label: once the node
    is labelled, prepare waits for the node's IMEX row to be ready, and refuses until then."""
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-follow"), unique("cd-system")
    control_plane.create_namespace(ns)
    node = unique("fresh")
    create_plugin_node(control_plane, node)  # no fabric label yet: the agent has not run
    plugin = _plugin(control_plane, node, roots, tmp_path)
    # The devices agent's first pass: the node's NVLink fabric domain.
    rest.patch(NODES, node, {"metadata": {"labels": {labels.FABRIC_DOMAIN: unique("rack")}}})
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("fresh", rct="fresh-imex"), ns)
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "fresh-imex", ns), what="template"
        )
        ref = allocate_claim(rest, ns, template, node, "fresh-0")
        with pytest.raises(PrepareError, match=r"IMEX .* is not ready on node"):
            plugin.driver.prepare(ref)
        assert plugin.driver.checkpoint.get(ref.uid) is None
        rest.delete(COMPUTE_DOMAINS, "fresh", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "fresh", ns), "fresh")


def test_the_imex_gate_follows_the_domains_row_when_the_fabric_label_drops(
    control_plane: ControlPlane, roots: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 29, point 8. The gate followed the node's fabric label: when discovery dropped
    the label (one GPU lost its fabric registration), prepare saw "no fabric" and let the
    workload start though the node's row in the domain (the clique its IMEX ensemble was
    formed in, kept while held) said IMEX was not ready. It gates on the row: with the label
    gone, prepare still refuses until the row is ready, then prepares."""
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-row"), unique("cd-system")
    control_plane.create_namespace(ns)
    node, rack = unique("tray"), unique("rack")
    create_plugin_node(control_plane, node, fabric=rack)
    plugin = _plugin(control_plane, node, roots, tmp_path)
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("row", rct="row-imex"), ns)
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "row-imex", ns), what="template"
        )
        ref = allocate_claim(rest, ns, template, node, "row-0")

        def row() -> dict[str, object] | None:
            rows = rest.get(COMPUTE_DOMAINS, "row", ns).get("status", {}).get("nodes") or []
            return next((r for r in rows if r["name"] == node), None)

        wait_for(lambda: (r := row()) is not None and r["fabricDomain"] == rack, what="row")
        # Discovery drops the label; the held node keeps its row (and clique), not ready.
        rest.patch(NODES, node, {"metadata": {"labels": {labels.FABRIC_DOMAIN: None}}})
        wait_for(
            lambda: labels.FABRIC_DOMAIN not in rest.get(NODES, node)["metadata"].get("labels", {}),
            what="label gone",
        )
        held = row()
        assert held is not None
        assert held["fabricDomain"] == rack
        assert not held["ready"]
        with pytest.raises(PrepareError, match=r"IMEX .* is not ready on node"):
            plugin.driver.prepare(ref)
        assert plugin.driver.checkpoint.get(ref.uid) is None
        uid = rest.get(COMPUTE_DOMAINS, "row", ns)["metadata"]["uid"]
        report_daemon(rest, driver_ns, uid, node, ready=True, message="READY")
        wait_for(lambda: (r := row()) is not None and r["ready"], what="row ready")
        prepared = plugin.driver.prepare(ref)
        assert [(p.pool_name, p.device_name) for p in prepared] == [(node, cd.CHANNEL_DEVICE)]
        plugin.driver.unprepare(ref)
        rest.delete(COMPUTE_DOMAINS, "row", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "row", ns), "row")


def _uid(rest: Rest, ns: str, name: str) -> str:
    return str(rest.get(CLAIMS, name, ns)["metadata"]["uid"])


def test_host_mode_prepare_checks_the_host_imex_service(
    control_plane: ControlPlane, roots: dict[str, Path]
) -> None:
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-hostnode"), unique("cd-system")
    control_plane.create_namespace(ns)
    node = unique("hgx")
    create_plugin_node(control_plane, node)
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("h", rct="h-imex", mode="host"), ns)
        wait_for(
            lambda: rest.get(COMPUTE_DOMAINS, "h", ns).get("status", {}).get("channels"),
            what="channel",
        )
        template = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "h-imex", ns), what="rct")
        config = NodeConfig(
            node_name=node,
            cdi_dir=roots["cdi"],
            plugin_dir=roots["plugin"],
            proc_root=roots["proc"],
            dev_root=roots["dev"],
            imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
            imex_ctl_args=("-c", str(roots["plugin"] / "host.cfg"), "-q"),
            imex_wait_seconds=1.0,
        )
        port = _free_port()
        roots["plugin"].mkdir(parents=True, exist_ok=True)
        (roots["plugin"] / "host.cfg").write_text(f"IMEX_CMD_ENABLED=1\nIMEX_CMD_PORT={port}\n")
        driver = ComputeDomainDriver(rest, config)
        ref = allocate_claim(rest, ns, template, node, "h-0")
        with pytest.raises(PrepareError, match=r"not ready.*UNAVAILABLE"):
            driver.prepare(ref)
        assert driver.checkpoint.get(ref.uid) is None
        # The node plugin's host report makes the host's state visible on the domain.
        write_host_report(rest, driver_ns, node, ready=False, message=driver.host_imex()[1])
        wait_for(
            lambda: (
                (condition(rest.get(COMPUTE_DOMAINS, "h", ns), cd.DEGRADED) or {}).get("status")
                == "True"
            ),
            what="host IMEX down shows as Degraded",
        )
        # The host service comes up: the same claim now prepares.
        sup = ImexSupervisor(
            ImexSettings(
                config_dir=roots["plugin"] / "hostimex",
                imex_bin=str(STAND_INS / "nvidia-imex"),
                imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
                cmd_port=port,
            )
        )
        try:
            wait_for(lambda: sup.step(["10.1.1.1"]).ready, what="host IMEX up")
            assert driver.prepare(ref)[0].device_name == cd.CHANNEL_DEVICE
            write_host_report(rest, driver_ns, node, ready=True, message=driver.host_imex()[1])
            wait_for(
                lambda: (
                    (condition(rest.get(COMPUTE_DOMAINS, "h", ns), cd.READY) or {}).get("status")
                    == "True"
                ),
                what="Ready again",
            )
        finally:
            sup.stop()
        rest.delete(COMPUTE_DOMAINS, "h", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "h", ns), "h deleted")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_imex_daemon_reports_through_the_controller(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-daemon"), unique("cd-system")
    control_plane.create_namespace(ns)
    node = unique("gb200")
    create_plugin_node(control_plane, node, fabric="rack-9")
    give_addresses(control_plane, node, "127.0.0.1")  # the daemon reports its Node's own IP
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("sim", rct="sim-imex", num_nodes=1), ns)
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "sim-imex", ns), what="template"
        )
        uid = template["metadata"]["labels"][cd.DOMAIN_LABEL]
        allocate_claim(rest, ns, template, node, "sim-0")  # the node joins
        wait_for(
            lambda: rest.get(COMPUTE_DOMAINS, "sim", ns).get("status", {}).get("nodes"),
            what="node row",
        )

        who = DaemonIdentity(node, "127.0.0.1", ns, "sim", uid, driver_ns)

        def daemon(imex_bin: str) -> ImexDaemon:
            return ImexDaemon(
                rest,
                who,
                ImexSupervisor(
                    ImexSettings(
                        config_dir=tmp_path / "imexd",
                        imex_bin=imex_bin,
                        imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
                        cmd_port=_free_port(),
                    )
                ),
            )

        # No IMEX binary on this host: said clearly, as Degraded with the reason.
        missing = daemon("/nonexistent/nvidia-imex")
        missing.run_once()
        degraded = wait_for(
            lambda: (
                (c := condition(rest.get(COMPUTE_DOMAINS, "sim", ns), cd.DEGRADED))
                and c["status"] == "True"
                and c
            ),
            what="Degraded",
        )
        assert "not found" in degraded["message"]

        # With IMEX: the daemon's IP reaches status, IMEX starts with it, the domain is Ready.
        good = daemon(str(STAND_INS / "nvidia-imex"))
        try:

            def ready() -> bool:
                good.run_once()
                obj = rest.get(COMPUTE_DOMAINS, "sim", ns)
                return (condition(obj, cd.READY) or {}).get("status") == "True"

            wait_for(ready, what="Ready=True", timeout=30)
            obj = rest.get(COMPUTE_DOMAINS, "sim", ns)
            assert obj["status"]["nodes"][0]["ipAddress"] == "127.0.0.1"
            names = (tmp_path / "imexd" / "nodes.cfg").read_text().splitlines()
            assert names[0] == "fabricdra-imex-0"
            assert "127.0.0.1\tfabricdra-imex-0" in (tmp_path / "imexd" / "hosts").read_text()
            assert condition(obj, cd.DEGRADED)["status"] == "False"  # type: ignore[index]
        finally:
            good.supervisor.stop()
        rest.delete(COMPUTE_DOMAINS, "sim", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "sim", ns), "sim deleted")


def test_daemon_claim_gets_what_nvidia_imex_needs_and_an_old_driver_is_refused(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Issue 22 point 8: the daemon's claim carries what the real nvidia-imex needs (the
    control device, the loaded driver's libraries, the driver version), and on a driver older
    than 570.158.01 the daemon does not start IMEX and the domain says why."""
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-needs"), unique("cd-system")
    control_plane.create_namespace(ns)
    node = unique("gb200")
    create_plugin_node(control_plane, node, fabric="rack-8")
    root, proc, dev = driver_tree(tmp_path, version="570.86.16")
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("needs", rct="needs-imex", num_nodes=1), ns)
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "needs-imex", ns), what="template"
        )
        uid = template["metadata"]["labels"][cd.DOMAIN_LABEL]
        allocate_claim(rest, ns, template, node, "needs-0")  # the node joins
        daemon_template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, f"imex-{uid}", driver_ns),
            what="the daemon's claim template",
        )
        driver = ComputeDomainDriver(
            rest,
            NodeConfig(
                node_name=node,
                cdi_dir=tmp_path / "cdi",
                plugin_dir=tmp_path / "plugin",
                proc_root=proc,
                dev_root=dev,
                fabric_domain="rack-8",
                driver_root=Path("/run/nvidia/driver"),
                driver_root_view=root,
                daemon_namespace=driver_ns,
            ),
        )
        ref = allocate_claim(rest, driver_ns, daemon_template, node, "imex-daemon-0")
        driver.prepare(ref)
        spec = json.loads(
            (tmp_path / "cdi" / f"fabricdra.io-compute-domain_{ref.uid}.json").read_text()
        )
        edits = spec["devices"][0]["containerEdits"]
        ctl = next(n for n in edits["deviceNodes"] if n["path"] == "/dev/nvidiactl")
        assert (ctl["major"], ctl["minor"]) == (195, 255)
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        lib = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.16"
        assert mounts["/usr/lib/fabricdra-driver/libnvidia-ml.so.1"] == lib
        assert mounts["/usr/bin/nvidia-imex"] == "/run/nvidia/driver/usr/bin/nvidia-imex"
        env = dict(e.split("=", 1) for e in edits["env"])
        assert env["FABRICDRA_DRIVER_VERSION"] == "570.86.16"
        assert env["FABRICDRA_IMEX_LIBRARY_PATH"] == "/usr/lib/fabricdra-driver"

        # The daemon, given what the claim gave it: IMEX is not started, the domain says why.
        daemon = ImexDaemon(
            rest,
            DaemonIdentity(node, "127.0.0.1", ns, "needs", uid, driver_ns),
            ImexSupervisor(
                ImexSettings(
                    config_dir=tmp_path / "imexd",
                    imex_bin=str(STAND_INS / "nvidia-imex"),
                    imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
                    cmd_port=_free_port(),
                    driver_version=env["FABRICDRA_DRIVER_VERSION"],
                    library_path=env["FABRICDRA_IMEX_LIBRARY_PATH"],
                )
            ),
        )
        daemon.run_once()
        assert daemon.supervisor.pid() is None
        degraded = wait_for(
            lambda: (
                (c := condition(rest.get(COMPUTE_DOMAINS, "needs", ns), cd.DEGRADED))
                and c["status"] == "True"
                and c
            ),
            what="Degraded",
        )
        assert "older than 570.158.01" in degraded["message"]
        rest.delete(COMPUTE_DOMAINS, "needs", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "needs", ns), "needs deleted")


def test_a_domain_on_nodes_without_fabric_is_ready_without_imex(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Issue 22 point 7: a managed domain on nodes without a multi-node NVLink fabric (HGX,
    PCIe; no fabricdra.io/fabric.domain label) is Ready on a host with no IMEX binary: the
    daemon runs no IMEX there, and DaemonsReady says so."""
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-hgx"), unique("cd-system")
    control_plane.create_namespace(ns)
    node = unique("hgx")
    create_plugin_node(control_plane, node)  # no fabric label
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("hgx", rct="hgx-imex", num_nodes=1), ns)
        template = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "hgx-imex", ns), what="rct")
        uid = template["metadata"]["labels"][cd.DOMAIN_LABEL]
        allocate_claim(rest, ns, template, node, "hgx-0")
        wait_for(
            lambda: rest.get(COMPUTE_DOMAINS, "hgx", ns).get("status", {}).get("nodes"),
            what="node row",
        )
        daemon = ImexDaemon(
            rest,
            DaemonIdentity(node, "127.0.0.1", ns, "hgx", uid, driver_ns),
            ImexSupervisor(
                ImexSettings(config_dir=tmp_path / "imexd", imex_bin="/nonexistent/nvidia-imex")
            ),
        )
        assert daemon.run_once().ready
        assert (tmp_path / "imexd" / "ready").exists()  # the pod's readiness probe
        obj = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "hgx", ns))
                and (condition(o, cd.READY) or {}).get("status") == "True"
                and o
            ),
            what="Ready=True without IMEX",
        )
        daemons = condition(obj, cd.DAEMONS_READY) or {}
        assert (daemons.get("status"), daemons.get("reason")) == ("True", "NoFabric")
        assert obj["status"]["nodes"][0]["fabricDomain"] == ""
        assert "IMEX is not run" in obj["status"]["nodes"][0]["message"]
        rest.delete(COMPUTE_DOMAINS, "hgx", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "hgx", ns), "hgx deleted")


def test_plugin_process_reports_the_host_imex_service(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """`fabricdra compute-domain-plugin` itself keeps the host report Lease that host-mode
    domains read: what the host's IMEX control tool answers, updated when it changes."""
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile

    rest = Rest(control_plane.api_client())
    report_ns = unique("cd-report")
    control_plane.create_namespace(report_ns)
    node = unique("hostimex")
    create_plugin_node(control_plane, node)
    answer = tmp_path / "answer"
    answer.write_text("UNAVAILABLE\n")
    ctl = tmp_path / "imex-ctl"
    ctl.write_text(f"#!/bin/sh\ncat {answer}\n")
    ctl.chmod(0o755)
    # Unix socket paths hold 107 bytes: pytest's tmp paths are too deep for the sockets.
    sockets = Path(tempfile.mkdtemp(prefix="cdp-"))
    plugin_dir, registry = sockets / "plugin", sockets / "registry"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricdra.cli",
            "compute-domain-plugin",
            "--node-name",
            node,
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--plugin-dir",
            str(plugin_dir),
            "--registry-dir",
            str(registry),
            "--cdi-dir",
            str(tmp_path / "cdi"),
            "--imex-ctl",
            str(ctl),
            "--report-namespace",
            report_ns,
            "--host-imex-interval",
            "0.3",
        ],
        stderr=subprocess.PIPE,
    )
    lease = f"imex-host-{node}"

    def reported(value: str) -> bool:
        obj = rest.get_or_none(LEASES, lease, report_ns)
        annotations = (obj or {}).get("metadata", {}).get("annotations", {})
        return annotations.get(cd.REPORT_READY) == value

    try:
        wait_for(
            lambda: reported("false") or proc.poll() is not None,
            timeout=60,
            what="a not-ready host report",
        )
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        answer.write_text("READY\n")
        wait_for(lambda: reported("true"), timeout=60, what="the report to turn ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        shutil.rmtree(sockets, ignore_errors=True)
    assert proc.returncode == 0, err.decode()


def test_imex_daemon_watches_its_domain_instead_of_polling(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Point 14: one LIST+WATCH (field selector on the name), no GET per interval; and the
    readiness file the DaemonSet's probe checks follows IMEX's READY."""
    import threading
    import uuid

    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-watch"), unique("cd-system")
    control_plane.create_namespace(ns)
    node = unique("watcher")
    create_plugin_node(control_plane, node, fabric="rack-w")
    give_addresses(control_plane, node, "127.0.0.1")  # the daemon reports its Node's own IP
    with running_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("w", rct="w-imex", num_nodes=1), ns)
        template = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "w-imex", ns), what="rct")
        uid = template["metadata"]["labels"][cd.DOMAIN_LABEL]
        allocate_claim(rest, ns, template, node, "w-0")
        agent = f"imex-daemon-test-{uuid.uuid4().hex[:8]}"
        api = control_plane.api_client()
        api.user_agent = agent
        settings = ImexSettings(
            config_dir=tmp_path / "imexd",
            imex_bin=str(STAND_INS / "nvidia-imex"),
            imex_ctl=str(STAND_INS / "nvidia-imex-ctl"),
            cmd_port=_free_port(),
        )
        daemon = ImexDaemon(
            Rest(api),
            DaemonIdentity(node, "127.0.0.1", ns, "w", uid, driver_ns),
            ImexSupervisor(settings),
        )
        stop = threading.Event()
        runner = threading.Thread(target=daemon.run, args=(stop, 0.2), daemon=True)
        runner.start()
        try:
            wait_for(
                lambda: (
                    (condition(rest.get(COMPUTE_DOMAINS, "w", ns), cd.READY) or {}).get("status")
                    == "True"
                ),
                what="Ready through the watching daemon",
                timeout=30,
            )
            assert (settings.config_dir / "ready").exists()
            # The startup and liveness probes' file (issue 29, point 11): touched at every
            # turn of the loop, so its modification time moves on.
            alive = settings.config_dir / "alive"
            first = alive.stat().st_mtime_ns
            wait_for(lambda: alive.stat().st_mtime_ns > first, what="the loop's heartbeat")
            time.sleep(1.0)  # five more intervals: none may read the domain again
        finally:
            stop.set()
            runner.join(timeout=20)
        assert not (settings.config_dir / "ready").exists()

        def domain_verbs() -> list[str]:
            return [
                e["verb"]
                for e in control_plane.audit_events(user_agent=agent)
                if (e.get("objectRef") or {}).get("resource") == "computedomains"
            ]

        # A watch is audited when it ends, and the server may notice the closed connection
        # after the daemon stopped: wait for its record rather than read the log once.
        verbs = wait_for(
            lambda: (v := domain_verbs()) and "watch" in v and v, what="the watch audited"
        )
        assert "get" not in verbs
        rest.delete(COMPUTE_DOMAINS, "w", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "w", ns), "w deleted")


def test_the_plugin_checkpoints_the_boot_and_drops_another_boots_claims(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The compute-domain plugin gives its checkpoint the kernel's boot id: after a reboot
    the claims of the earlier boot are dropped with their specs (their containers are gone),
    as in the devices plugin."""
    from fabricdra.kubeletplugin.computedomain.plugin import ComputeDomainPlugin, PluginConfig
    from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint, ClaimEntry

    node = unique("cdboot")
    create_plugin_node(control_plane, node)
    boot = tmp_path / "boot_id"
    boot.write_text("boot-2\n")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    old_spec = cdi / "fabricdra.io-compute-domain_old-uid.json"
    old_spec.write_text("{}")
    plugin_dir = tmp_path / "plugin"
    Checkpoint(plugin_dir / "checkpoint.json", boot_id="boot-1").put(
        ClaimEntry("old-uid", "ns", "old", (str(old_spec),))
    )
    plugin = ComputeDomainPlugin(
        PluginConfig(
            node_name=node,
            cdi_dir=cdi,
            plugin_dir=plugin_dir,
            registry_dir=tmp_path / "registry",
            boot_id_file=boot,
        ),
        control_plane.api_client(),
    )
    assert plugin.driver.checkpoint.boot_id == "boot-2"
    assert plugin.driver.checkpoint.entries() == []
    assert not old_spec.exists()
    plugin.driver.checkpoint.put(ClaimEntry("new-uid", "ns", "new", ()))
    assert json.loads((plugin_dir / "checkpoint.json").read_text())["bootId"] == "boot-2"
