"""ComputeDomain controller speed against a real kube-apiserver (started here, stopped at exit).

18 simulated nodes (Node objects carrying the plugin label and one fabric domain; the
controller publishes their ResourceSlices). Prints, as JSON:

- create_to_objects_s: ComputeDomain created -> channel recorded, workload + daemon claim
  templates and the DaemonSet all exist (managed mode, numNodes 18);
- join_to_rows_s: 18 workload claims allocated on the 18 nodes (as the scheduler would) ->
  all 18 admitted and listed in status.nodes;
- daemons_ready_to_ready_s: the 18th daemon reports ready -> Ready=True;
- throughput_domains_per_s: 200 domains created at once -> all have channel, claim template
  and a written Ready condition;
- api_writes_per_domain: the controller's writes (from the audit log) per throughput domain.

    python -m bench.controller [--domains 200] [--nodes 18]

Goals: under 2 s end to end per domain, at least 20 domains/s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import ControlPlane
from fabricdra.api import computedomain as cd
from fabricdra.controller.manager import USER_AGENT, Controller, ControllerConfig
from fabricdra.controller.objects import DaemonSettings
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    STRATEGIC_PATCH,
    Rest,
)
from fabricdra.kubeletplugin.computedomain.report import write_report
from tests.integration.computedomain_helpers import (
    condition,
    domain_body,
    give_addresses,
    install_crd,
)


def _until(check: Callable[[], Any], timeout: float = 120.0, step: float = 0.005) -> float:
    """Seconds until check() is truthy (polling every `step`)."""
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(step)
    return time.perf_counter() - start


def _allocate(rest: Rest, ns: str, uid: str, node: str) -> None:
    """What kube-scheduler does for a workload pod on `node`: a claim with an allocation."""
    name = f"w-{node}"
    rest.create(
        CLAIMS,
        {
            "metadata": {"name": name, "labels": {cd.DOMAIN_LABEL: uid}},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_CLASS}}
                    ]
                }
            },
        },
        ns,
    )
    allocation = {
        "devices": {
            "results": [
                {
                    "request": "channel",
                    "driver": cd.DRIVER,
                    "pool": node,
                    "device": cd.CHANNEL_DEVICE,
                    "shareID": str(uuid.uuid4()),
                    "bindingConditions": [cd.ADMITTED_CONDITION],
                    "bindingFailureConditions": [cd.CONFLICT_CONDITION],
                }
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
        "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rest.patch(
        CLAIMS,
        name,
        {"status": {"allocation": allocation}},
        ns,
        sub="status",
        content_type=STRATEGIC_PATCH,
    )


def run(domains: int, nodes: int, verbose: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fabricdra-bench-") as tmp:
        cp = ControlPlane(Path(tmp) / "cp")
        cp.start()
        try:
            return _measure(cp, domains, nodes, verbose)
        finally:
            cp.stop()


def _measure(cp: ControlPlane, domains: int, nodes: int, verbose: bool) -> dict[str, Any]:
    rest = Rest(cp.api_client())
    install_crd(rest)
    system = "fabricdra-system"
    names = [f"gb300-{i:02d}" for i in range(nodes)]
    for i, n in enumerate(names):
        cp.create_node(n, {cd.PLUGIN_NODE_LABEL: "true", "fabricdra.io/fabric.domain": "rack-1"})
        give_addresses(cp, n, f"192.0.2.{i + 1}")  # a report's IP must be its Node's own
    cp.create_namespace("bench")
    cfg = ControllerConfig(
        namespace=system, daemon=DaemonSettings(namespace=system), leader_election=False
    )
    controller = Controller(cp.api_client(), cfg)
    controller.start()
    out: dict[str, Any] = {"nodes": nodes, "domains": domains}
    try:
        _until(lambda: len(controller.slices.items()) == nodes, timeout=60)

        # 1. One 18-node managed domain: create -> every object exists.
        rest.create(
            COMPUTE_DOMAINS, domain_body("train", rct="train-imex", num_nodes=nodes), "bench"
        )

        def objects_ready() -> bool:
            obj = rest.get(COMPUTE_DOMAINS, "train", "bench")
            uid = obj["metadata"]["uid"]
            sel = f"{cd.DOMAIN_LABEL}={uid}"
            return bool(
                obj.get("status", {}).get("channels")
                and rest.list(CLAIM_TEMPLATES, "bench", label_selector=sel)["items"]
                and rest.list(CLAIM_TEMPLATES, system, label_selector=sel)["items"]
                and rest.list(DAEMON_SETS, system, label_selector=sel)["items"]
            )

        out["create_to_objects_s"] = round(_until(objects_ready), 3)
        uid = rest.get(COMPUTE_DOMAINS, "train", "bench")["metadata"]["uid"]

        # 2. Its 18 workload claims are allocated: all nodes admitted and listed.
        start = time.perf_counter()
        for n in names:
            _allocate(rest, "bench", uid, n)
        _until(
            lambda: (
                len(rest.get(COMPUTE_DOMAINS, "train", "bench")["status"].get("nodes", [])) == nodes
            )
        )
        out["join_to_rows_s"] = round(time.perf_counter() - start, 3)

        # 3. The daemons report ready, the last one starts the clock.
        for i, n in enumerate(names[:-1]):
            write_report(rest, system, uid, n, ready=True, ip=f"192.0.2.{i + 1}")
        time.sleep(0.5)  # let the first 17 settle so only the 18th is measured
        start = time.perf_counter()
        write_report(rest, system, uid, names[-1], ready=True, ip=f"192.0.2.{nodes}")
        _until(
            lambda: (
                (condition(rest.get(COMPUTE_DOMAINS, "train", "bench"), cd.READY) or {}).get(
                    "status"
                )
                == "True"
            )
        )
        out["daemons_ready_to_ready_s"] = round(time.perf_counter() - start, 3)

        # 4. Throughput: many domains at once.
        cp.create_namespace("burst")
        before_all = len(cp.audit_events(user_agent=USER_AGENT))
        before = len(
            cp.audit_events(user_agent=USER_AGENT, verbs=("create", "patch", "update", "delete"))
        )
        start = time.perf_counter()
        for i in range(domains):
            rest.create(COMPUTE_DOMAINS, domain_body(f"d{i:03d}"), "burst")

        def all_done() -> bool:
            items = rest.list(COMPUTE_DOMAINS, "burst")["items"]
            done = [
                o
                for o in items
                if o.get("status", {}).get("channels") and condition(o, cd.READY) is not None
            ]
            templates = rest.list(CLAIM_TEMPLATES, "burst")["items"]
            return len(done) == domains and len(templates) == domains

        _until(all_done, timeout=600, step=0.05)
        elapsed = time.perf_counter() - start
        out["throughput_elapsed_s"] = round(elapsed, 3)
        out["throughput_domains_per_s"] = round(domains / elapsed, 1)
        time.sleep(1.0)  # let trailing writes land in the audit log
        writes = len(
            cp.audit_events(user_agent=USER_AGENT, verbs=("create", "patch", "update", "delete"))
        )
        out["api_writes_per_domain"] = round((writes - before) / domains, 1)
        if verbose:
            from collections import Counter

            seen = Counter(
                (e["verb"], e["objectRef"].get("resource", ""))
                for e in cp.audit_events(user_agent=USER_AGENT)[before_all:]
            )
            out["requests_by_verb_resource"] = {f"{v} {r}": n for (v, r), n in seen.items()}
        channels = [o["status"]["channels"][0] for o in rest.list(COMPUTE_DOMAINS)["items"]]
        out["channels_unique"] = len(channels) == len(set(channels))
    finally:
        controller.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domains", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=18)
    parser.add_argument("--verbose", action="store_true", help="also count requests by kind")
    args = parser.parse_args()
    print(json.dumps(run(args.domains, args.nodes, args.verbose), indent=2))


if __name__ == "__main__":
    main()
