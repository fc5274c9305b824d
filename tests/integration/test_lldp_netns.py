"""LLDP with real frames (issue 27 point 8): a veth pair, one end in a network namespace of
the test's own playing the switch, which writes LLDPDUs (IEEE 802.1AB, ethertype 0x88cc, to
01:80:c2:00:00:0e) with a raw socket; the agent's reader (LldpListener behind
NeighbourSources, `--lldp raw`) receives them on the other end, and discovery publishes the
neighbour on the RoCE NIC whose netdev is that interface. Needs root and `ip` (netns, veth)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.inventory import Interface, Neighbour
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.scaleout.annotate import ScaleOutInputs
from fabricdra.kubeletplugin.discovery.scaleout.lldp import LldpListener
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.resourceslices import build_slices
from fabricdra.kubeletplugin.scaleoutsources import NeighbourSources, ScaleOutConfig
from tests.sysfs.builder import Port, SysfsBuilder

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]

DEADLINE = 20.0  # seconds to wait for a frame to arrive (they are sent every 0.2 s)

# The peer: writes one frame (hex) every 0.2 s on its interface until killed.
SENDER = """
import socket, sys, time
iface, frame = sys.argv[1], bytes.fromhex(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
print("sending", flush=True)
while True:
    s.send(frame)
    time.sleep(0.2)
"""


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


def lldp_frame(chassis_mac: str, port: str, name: str | None, ttl: int = 120) -> bytes:
    """An Ethernet frame carrying an LLDPDU: Chassis ID (MAC subtype 4), Port ID (interface
    name subtype 5), TTL, System Name, End (802.1AB-2016 §8.4-8.5)."""
    body = tlv(1, b"\x04" + bytes.fromhex(chassis_mac.replace(":", "")))
    body += tlv(2, b"\x05" + port.encode()) + tlv(3, struct.pack("!H", ttl))
    if name is not None:
        body += tlv(5, name.encode())
    body += tlv(0, b"")
    header = bytes.fromhex("0180c200000e") + bytes.fromhex("0c42a15e1001") + b"\x88\xcc"
    return header + body


@dataclass
class Link:
    """`host` stays in this namespace (the agent's side); `peer` is the switch's, in `netns`."""

    host: str
    peer: str
    netns: str
    senders: list[subprocess.Popen[str]]

    def send(self, frame: bytes) -> None:
        self.stop()
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.netns,
                sys.executable,
                "-c",
                SENDER,
                self.peer,
                frame.hex(),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "sending":
            proc.kill()
            raise RuntimeError(f"LLDP sender did not start: {proc.communicate()[1]}")
        self.senders.append(proc)

    def stop(self) -> None:
        for proc in self.senders:
            proc.kill()
            proc.communicate()
        self.senders.clear()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def link() -> Iterator[Link]:
    tag = f"{os.getpid() % 100000}"
    host, peer, netns = f"fdl{tag}a", f"fdl{tag}b", f"fdra-lldp-{tag}"
    _ip("netns", "add", netns)
    try:
        _ip("link", "add", host, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", netns)
        _ip("link", "set", host, "up")
        _ip("-n", netns, "link", "set", peer, "up")
        ln = Link(host, peer, netns, [])
        yield ln
        ln.stop()
    finally:
        subprocess.run(["ip", "link", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def _until(read: Callable[[], Any], want: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + DEADLINE
    value = read()
    while not want(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return value


def test_the_listener_reads_the_neighbour_from_real_lldpdus(link: Link) -> None:
    listener = LldpListener(link.host)
    try:
        # Before any frame: an error naming the link, not "no neighbour".
        assert listener.reading() == f"no LLDPDU heard on {link.host} yet"
        link.send(b"\x01\x80\xc2\x00\x00\x0e" + bytes(6) + b"\x88\xcc" + tlv(2, b"\x05p"))
        malformed = _until(listener.reading, lambda r: "malformed" in str(r))
        assert malformed.startswith(f"malformed LLDPDU on {link.host}: LLDPDU must start")

        link.send(lldp_frame("0c:42:a1:5e:10:03", "swp17", "leaf-rail3-su1"))
        heard = _until(listener.reading, lambda r: isinstance(r, Neighbour))
        assert heard == Neighbour(
            switch="0c:42:a1:5e:10:03",
            port="swp17",
            name="leaf-rail3-su1",
            source="measured",
            via="lldp",
        )

        # The switch is re-cabled: the newest LLDPDU wins.
        link.send(lldp_frame("0c:42:a1:5e:10:04", "swp9", None))
        moved = _until(listener.reading, lambda r: isinstance(r, Neighbour) and r.port == "swp9")
        assert moved == Neighbour(
            switch="0c:42:a1:5e:10:04", port="swp9", source="measured", via="lldp"
        )

        # A shutdown LLDPDU (TTL 0) withdraws it: reported as such, never as "no neighbour".
        link.send(lldp_frame("0c:42:a1:5e:10:04", "swp9", None, ttl=0))
        gone = _until(listener.reading, lambda r: isinstance(r, str))
        assert gone == f"the neighbour on {link.host} withdrew (LLDPDU with TTL 0)"
    finally:
        listener.close()


def test_a_listener_that_cannot_open_its_socket_says_why() -> None:
    listener = LldpListener("fdl-no-such0")
    try:
        reading = listener.reading()
        assert isinstance(reading, str)
        assert reading.startswith("cannot listen for LLDP on fdl-no-such0: ")
    finally:
        listener.close()


def test_discovery_publishes_the_neighbour_heard_on_the_nics_netdev(
    link: Link, tmp_path: Path
) -> None:
    """A kernel-shaped RoCE node whose NIC's netdev is the veth end: the agent's sources
    (`--lldp raw`) hear the frames and the RDMA device publishes its railSwitch."""
    b = SysfsBuilder(tmp_path / "sys")
    rp = b.bridge(b.root_bus("pci0000:10"), "0000:10:01.0", 0)
    down = b.switch(rp, "0000:11:00.0", ["0000:12:00.0", "0000:12:01.0"])
    b.gpu(down[0], "0000:20:00.0", numa=0)
    pf = b.nic(down[1], "0000:30:00.0", link.host, numa=0)  # the veth's name is the netdev's
    b.rdma(pf, "mlx5_0", [Port(netdev=link.host)])
    sources = NeighbourSources(ScaleOutConfig(lldp="raw", ib="off"))
    link.send(lldp_frame("0c:42:a1:5e:10:00", "swp1", "tor-1"))

    def nic() -> Interface:
        tree = SysfsTree(str(b.root))
        try:
            d = discover(tree, scaleout=ScaleOutInputs("n", None, sources))
        finally:
            tree.close()
        assert d.interfaces is not None
        (found,) = [i for i in d.interfaces if i.rdmaDevice == "mlx5_0"]
        return found

    try:
        first = nic()  # the listener opens here; its first answer may be "not heard yet"
        assert first.scaleOut is not None
        found = _until(nic, lambda i: i.scaleOut is not None and i.scaleOut.neighbour is not None)
        assert found.scaleOut is not None
        assert found.scaleOut.neighbour == Neighbour(
            switch="0c:42:a1:5e:10:00", port="swp1", name="tor-1", source="measured", via="lldp"
        )
        assert found.scaleOut.error is None
        slices = build_slices(build_devices([found], []), "n").slices
        (device,) = [d for s in slices for d in s["spec"].get("devices", [])]
        assert device["attributes"]["railSwitch"] == {"string": "0c:42:a1:5e:10:00"}
    finally:
        sources.close()
