"""The LLDP neighbours lldpd heard, for hosts that run lldpd: `lldpcli -f json0 show neighbors`.

json0 is the format whose shape does not change with the number of interfaces or neighbours
(lldpcli(8), https://manpages.debian.org/lldpd/lldpcli.8): every value is a list of objects,

    {"lldp": [{"interface": [{"name": "enp24s0np0", "via": "LLDP",
        "chassis": [{"id": [{"type": "mac", "value": "0c:42:a1:00:00:01"}],
                     "name": [{"value": "leaf-r0"}]}],
        "port": [{"id": [{"type": "ifname", "value": "Ethernet1/1"}],
                  "ttl": [{"value": "120"}]}]}]}]}

An interface lldpd lists with no neighbour is simply not in the output: when lldpd is the
source, an interface it does not list is reported as "lldpd heard no neighbour", an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fabricdra.api.inventory import Neighbour

COMMAND = ("lldpcli", "-f", "json0", "show", "neighbors")


class LldpdError(ValueError):
    """lldpcli could not be run or printed something that is not its json0."""


def _first(node: Any, key: str) -> Any:
    items = node.get(key) if isinstance(node, dict) else None
    return items[0] if isinstance(items, list) and items else None


def _value(node: Any, key: str) -> str | None:
    item = _first(node, key)
    value = item.get("value") if isinstance(item, dict) else None
    return str(value) if value not in (None, "") else None


def parse_neighbors(text: str) -> dict[str, Neighbour]:
    """interface name -> its neighbour (the first, where lldpd heard several)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise LldpdError(f"lldpcli output is not JSON: {e}") from None
    top = doc.get("lldp") if isinstance(doc, dict) else None
    if not isinstance(top, list):
        raise LldpdError("lldpcli output has no 'lldp' list (not -f json0?)")
    if not top:
        return {}  # lldpd runs and heard nobody
    lldp = top[0]
    if not isinstance(lldp, dict):
        raise LldpdError("lldpcli output: 'lldp' holds no object (not -f json0?)")
    out: dict[str, Neighbour] = {}
    for iface in lldp.get("interface", []) or []:
        name = iface.get("name") if isinstance(iface, dict) else None
        if not name or name in out:
            continue
        chassis, port = _first(iface, "chassis"), _first(iface, "port")
        switch = _value(chassis, "id")
        if switch is None:
            raise LldpdError(f"lldpcli: interface {name} has a neighbour without a chassis id")
        out[name] = Neighbour(
            switch=switch,
            port=_value(port, "id"),
            name=_value(chassis, "name"),
            source="measured",
            via="lldpd",
        )
    return out


def run_lldpcli(timeout: float = 5.0) -> str:
    import subprocess  # here: only the agent asks lldpd; `fabricdra inventory` reads a file

    try:
        done = subprocess.run(list(COMMAND), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise LldpdError("lldpcli not found (is lldpd installed on the host?)") from None
    except subprocess.TimeoutExpired:
        raise LldpdError(f"lldpcli timed out after {timeout:g}s") from None
    except OSError as e:
        raise LldpdError(f"lldpcli: {e.strerror or e}") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise LldpdError(f"lldpcli exited {done.returncode}: {lines[-1] if lines else ''}")
    return done.stdout


def reading_for(neighbours: Mapping[str, Neighbour] | str, interface: str) -> Neighbour | str:
    if isinstance(neighbours, str):
        return neighbours
    found = neighbours.get(interface)
    return found if found is not None else f"lldpd heard no neighbour on {interface}"
