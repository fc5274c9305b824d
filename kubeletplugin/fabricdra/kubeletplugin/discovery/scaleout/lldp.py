"""LLDP (IEEE 802.1AB, https://standards.ieee.org/ieee/802.1AB/6047/): the switch port a RoCE /
Ethernet NIC is cabled to, from the LLDPDUs the switch sends on that link.

An LLDPDU is carried in an Ethernet frame of ethertype 0x88cc, sent to the nearest-bridge group
address 01:80:c2:00:00:0e. It is a sequence of TLVs, each with a 16-bit header (7-bit type,
9-bit length) and starting with the three mandatory ones, in order (802.1AB-2016 §8.4, §8.5):

    type 1  Chassis ID   subtype (1 octet) + id     4: MAC address, 5: network address,
                                                   1/2/3/6/7: a string
    type 2  Port ID      subtype (1 octet) + id     3: MAC address, 4: network address,
                                                   1/2/5/6/7: a string
    type 3  TTL          2 octets, seconds the information stays valid (0: withdrawn)
    type 5  System Name  (optional) a string
    type 0  End of LLDPDU

`parse_lldpdu` is pure; `LldpListener` is the reader: one raw AF_PACKET socket per interface
(CAP_NET_RAW, the host's network namespace), holding the last valid LLDPDU until its TTL runs
out. A link that has not been heard from, a socket that could not be opened and a TTL that ran
out are errors on the NIC, never "no neighbour".
"""

from __future__ import annotations

import ipaddress
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fabricdra.api.inventory import Neighbour

ETH_P_LLDP = 0x88CC
NEAREST_BRIDGE = bytes.fromhex("0180c200000e")
TLV_END, TLV_CHASSIS, TLV_PORT, TLV_TTL, TLV_SYSTEM_NAME = 0, 1, 2, 3, 5
_CHASSIS_MAC, _CHASSIS_NET = 4, 5
_PORT_MAC, _PORT_NET = 3, 4
# <linux/if_packet.h>
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_MULTICAST = 263, 1, 0


class LldpError(ValueError):
    """Not a well-formed LLDPDU; the message says which TLV was at fault."""


@dataclass(frozen=True, slots=True)
class Lldpdu:
    chassis_id: str
    port_id: str
    ttl: int
    system_name: str | None = None

    def neighbour(self, via: str = "lldp") -> Neighbour:
        return Neighbour(
            switch=self.chassis_id,
            port=self.port_id,
            name=self.system_name,
            source="measured",
            via=via,
        )


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\x00")


def _network_address(raw: bytes) -> str:
    # One octet of IANA address family (1: IPv4, 2: IPv6), then the address.
    if len(raw) == 5 and raw[0] == 1:
        return str(ipaddress.IPv4Address(raw[1:]))
    if len(raw) == 17 and raw[0] == 2:
        return str(ipaddress.IPv6Address(raw[1:]))
    return raw.hex()


def _id(raw: bytes, mac_subtype: int, net_subtype: int, what: str) -> str:
    if len(raw) < 2:
        raise LldpError(f"{what} TLV is {len(raw)} octets (needs a subtype and an id)")
    subtype, value = raw[0], raw[1:]
    if subtype == mac_subtype:
        if len(value) != 6:
            raise LldpError(f"{what} TLV: a MAC address of {len(value)} octets")
        return _mac(value)
    if subtype == net_subtype:
        return _network_address(value)
    return _text(value)


def parse_lldpdu(payload: bytes) -> Lldpdu:
    """The LLDPDU after the Ethernet header (ethertype already checked)."""
    tlvs: list[tuple[int, bytes]] = []
    offset = 0
    while offset + 2 <= len(payload):
        (header,) = struct.unpack_from("!H", payload, offset)
        kind, length = header >> 9, header & 0x1FF
        offset += 2
        if offset + length > len(payload):
            raise LldpError(f"TLV type {kind} runs past the frame ({length} octets)")
        tlvs.append((kind, payload[offset : offset + length]))
        offset += length
        if kind == TLV_END:
            break
    order = [k for k, _ in tlvs[:3]]
    if order != [TLV_CHASSIS, TLV_PORT, TLV_TTL]:
        raise LldpError(f"LLDPDU must start Chassis ID, Port ID, TTL; starts with types {order}")
    chassis = _id(tlvs[0][1], _CHASSIS_MAC, _CHASSIS_NET, "Chassis ID")
    port = _id(tlvs[1][1], _PORT_MAC, _PORT_NET, "Port ID")
    if len(tlvs[2][1]) != 2:
        raise LldpError(f"TTL TLV is {len(tlvs[2][1])} octets, not 2")
    (ttl,) = struct.unpack("!H", tlvs[2][1])
    name = next((_text(v) for k, v in tlvs[3:] if k == TLV_SYSTEM_NAME), None)
    return Lldpdu(chassis_id=chassis, port_id=port, ttl=ttl, system_name=name or None)


def parse_frame(frame: bytes) -> Lldpdu:
    """A whole Ethernet frame (as an AF_PACKET SOCK_RAW socket returns it)."""
    if len(frame) < 14:
        raise LldpError(f"frame of {len(frame)} octets is shorter than an Ethernet header")
    (ethertype,) = struct.unpack_from("!H", frame, 12)
    offset = 14
    if ethertype == 0x8100 and len(frame) >= 18:  # one 802.1Q tag
        (ethertype,) = struct.unpack_from("!H", frame, 16)
        offset = 18
    if ethertype != ETH_P_LLDP:
        raise LldpError(f"ethertype 0x{ethertype:04x} is not LLDP (0x88cc)")
    return parse_lldpdu(frame[offset:])


Clock = Callable[[], float]


class LldpListener:
    """The last LLDPDU heard on one interface, read from a raw socket by a daemon thread."""

    def __init__(self, interface: str, clock: Clock = time.monotonic) -> None:
        self.interface = interface
        self._clock = clock
        self._lock = threading.Lock()
        self._heard: Lldpdu | None = None
        self._expires = 0.0
        self._problem: str | None = None
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        try:
            self._sock = _open(interface)
        except OSError as e:
            self._problem = f"cannot listen for LLDP on {interface}: {e.strerror or e}"
            return
        self._thread = threading.Thread(target=self._run, name=f"lldp-{interface}", daemon=True)
        self._thread.start()

    def reading(self) -> Neighbour | str:
        """The neighbour, or why there is none to report (an error, not an absence)."""
        with self._lock:
            if self._heard is None:
                return self._problem or f"no LLDPDU heard on {self.interface} yet"
            if self._heard.ttl == 0:
                return f"the neighbour on {self.interface} withdrew (LLDPDU with TTL 0)"
            if self._clock() > self._expires:
                return f"the last LLDPDU on {self.interface} expired (TTL {self._heard.ttl}s)"
            return self._heard.neighbour()

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([sock], [], [], 0.5)
            if not ready:
                continue
            try:
                frame = sock.recv(9216)
            except OSError as e:
                with self._lock:
                    self._problem = f"reading LLDP on {self.interface} failed: {e.strerror or e}"
                return
            try:
                pdu = parse_frame(frame)
            except LldpError as e:
                with self._lock:
                    if self._heard is None:  # a good LLDPDU beats a later malformed one
                        self._problem = f"malformed LLDPDU on {self.interface}: {e}"
                continue
            with self._lock:
                self._heard, self._expires = pdu, self._clock() + pdu.ttl

    def close(self) -> None:
        self._stop.set()
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _open(interface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_LLDP))
    try:
        sock.bind((interface, ETH_P_LLDP))
        # The nearest-bridge address is a multicast group the NIC filters out unless joined
        # (what lldpd does too); struct packet_mreq {int ifindex; u16 type, alen; u8 addr[8]}.
        index = socket.if_nametoindex(interface)
        mreq = struct.pack("iHH8s", index, PACKET_MR_MULTICAST, 6, NEAREST_BRIDGE)
        sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
    except OSError:
        sock.close()
        raise
    return sock
