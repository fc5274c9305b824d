"""A small fleet in wire form, with every number of its fleet view counted by hand.

Domain A (`<A>`): nodes a1, a2, a3, each 4 GPUs (gb200-186gb-nvl72) + 2 RDMA NICs.
  a1  everything free: a whole node.
  a2  gpu-0 and nic-0 allocated (claim c1), gpu-3 unhealthy: 2 free GPUs on a partial node.
  a3  held by ComputeDomain cd1; gpu-0, gpu-1, both NICs allocated (c2): 2 free GPUs
      stranded by the ComputeDomain.
Domain B (`<B>`): nodes b1, b2, each 4 GPUs + 1 NIC.
  b1  its only NIC failed (linkVerdict Failed + unhealthy taint): 4 free GPUs stranded for
      want of a NIC; still a whole node for an NVLink-only domain.
  b2  unverified: every device tainted fabricdra.io/unverified, nothing free.
No fabric ("none"), only with `no_fabric=True`:
  c1  2 GPUs h100-80gb-sxm + one shared NIC (current model, 4 holders); gpu-0 and one holder
      of the NIC taken (c3): 1 free GPU on a partial node, the NIC still has holders.
  c2  1 GPU + one shared NIC published as 2 holder devices (basic model), both taken (c4,
      c5): its GPU is stranded for want of a NIC; a whole node.
Also: a claim allocated by another driver and an unallocated claim, both ignored.
"""

from __future__ import annotations

from typing import Any

DRIVER = "devices.fabricdra.io"
GB200 = "gb200-186gb-nvl72"
H100 = "h100-80gb-sxm"


def _gpu(i: int, cls: str, domain: str | None, taints: list[dict[str, Any]],
         extra: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    attrs: dict[str, Any] = {"type": {"string": "gpu"}, "deviceClass": {"string": cls}}
    if domain:
        attrs["fabricDomain"] = {"string": domain}
    attrs.update(extra or {})
    d: dict[str, Any] = {"name": f"gpu-{i}", "attributes": attrs}
    if taints:
        d["taints"] = taints
    return d


def _nic(name: str, verdict: str = "OK", taints: list[dict[str, Any]] | None = None,
         mode: str = "exclusive",
         extra: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    d: dict[str, Any] = {
        "name": name,
        "attributes": {
            "type": {"string": "rdma"},
            "linkVerdict": {"string": verdict},
            "rdmaMode": {"string": mode},
            **(extra or {}),
        },
    }
    if taints:
        d["taints"] = taints
    return d


UNHEALTHY = {"key": "fabricdra.io/unhealthy", "value": "gpu", "effect": "NoSchedule"}
LINK_DOWN = {"key": "fabricdra.io/unhealthy", "value": "rdma-link", "effect": "NoSchedule"}
UNVERIFIED = {"key": "fabricdra.io/unverified", "value": "unverified", "effect": "NoSchedule"}


def _slice(node: str, devices: list[dict[str, Any]], generation: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-{generation}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def node_object(name: str, *, ready: str = "True", cordoned: bool = False,
                taints: list[dict[str, Any]] | None = None,
                labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A Node as the API returns it (wire form), Ready unless told otherwise."""
    spec: dict[str, Any] = {}
    if cordoned:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def _claim(
    name: str, ns: str, results: list[tuple[str, str]], driver: str = DRIVER
) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {
                            "deviceClassName": "gpu.fabricdra.io",
                            "count": max(1, len(results)),
                        },
                    }
                ]
            }
        },
    }
    if results:
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": driver, "pool": pool, "device": dev}
                        for pool, dev in results
                    ]
                }
            }
        }
    return claim


def _node_devices(node: str, state: str) -> dict[str, Any]:
    return {
        "apiVersion": "fabricdra.io/v1alpha1",
        "kind": "NodeDevices",
        "metadata": {"name": node},
        "spec": {"interfaces": [], "groups": []},
        "status": {"verification": {"state": state, "reason": "test"}},
    }


def scenario(suffix: str, ns: str, *, no_fabric: bool = True) -> dict[str, Any]:
    """{slices, claims, nodeDevices, computeDomains, names, expected} for this suffix."""
    A, B = f"nvlink-a{suffix}-1", f"nvlink-b{suffix}-1"
    n = {k: f"{k}-{suffix}" for k in ("a1", "a2", "a3", "b1", "b2", "c1", "c2")}
    slices = [
        _slice(n["a1"], [_gpu(i, GB200, A, []) for i in range(4)] + [_nic("nic-0"), _nic("nic-1")]),
        _slice(n["a2"], [_gpu(i, GB200, A, [UNHEALTHY] if i == 3 else []) for i in range(4)]
               + [_nic("nic-0"), _nic("nic-1")]),
        _slice(n["a3"], [_gpu(i, GB200, A, []) for i in range(4)] + [_nic("nic-0"), _nic("nic-1")]),
        _slice(n["b1"], [_gpu(i, GB200, B, []) for i in range(4)]
               + [_nic("nic-0", "Failed", [LINK_DOWN])]),
        _slice(n["b2"], [_gpu(i, GB200, B, [UNVERIFIED]) for i in range(4)]
               + [_nic("nic-0", taints=[UNVERIFIED])]),
    ]  # fmt: skip
    claims = [
        _claim("c1", ns, [(n["a2"], "gpu-0"), (n["a2"], "nic-0")]),
        _claim("c2", ns, [(n["a3"], "gpu-0"), (n["a3"], "gpu-1"), (n["a3"], "nic-0"),
                          (n["a3"], "nic-1")]),
        _claim("other-driver", ns, [(n["a1"], "gpu-0")], driver="gpu.example.com"),
        _claim("pending", ns, []),
    ]  # fmt: skip
    if no_fabric:
        shared = _nic("nic-0", mode="shared")
        shared["allowMultipleAllocations"] = True
        shared["capacity"] = {"holders": {"value": "4"}}
        slices += [
            _slice(n["c1"], [_gpu(0, H100, None, []), _gpu(1, H100, None, []), shared]),
            _slice(n["c2"], [_gpu(0, H100, None, []), _nic("nic-0-s0", mode="shared"),
                             _nic("nic-0-s1", mode="shared")]),
        ]  # fmt: skip
        claims += [
            _claim("c3", ns, [(n["c1"], "gpu-0"), (n["c1"], "nic-0")]),
            _claim("c4", ns, [(n["c2"], "nic-0-s0")]),
            _claim("c5", ns, [(n["c2"], "nic-0-s1")]),
        ]
    node_devices = [
        _node_devices(n["a1"], "Verified"),
        _node_devices(n["a2"], "Verified"),
        _node_devices(n["a3"], "Overridden"),
        _node_devices(n["b1"], "Verified"),
        _node_devices(n["b2"], "Unverified"),
    ]
    compute_domains = [
        {
            "apiVersion": "fabricdra.io/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": "cd1", "namespace": ns},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "cd1-channel"}}},
            "status": {
                "fabricDomain": A,
                "nodes": [{"name": n["a3"], "fabricDomain": A, "index": 0, "ready": True}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            },
        }
    ]  # fmt: skip

    def counts(total: int, healthy: int, verified: int, allocated: int, free: int,
               cd: int = 0, nic: int = 0) -> dict[str, Any]:  # fmt: skip
        return {
            "total": total, "healthy": healthy, "verified": verified, "allocated": allocated,
            "free": free, "stranded": {"computeDomain": cd, "nicsUnavailable": nic,
                                       "total": cd + nic},
        }  # fmt: skip

    expected = {
        A: {
            "fabricDomain": A, "nodes": 3, "verifiedNodes": 3, "largestFit": 1,
            "freeGpusOnPartialNodes": 2,
            "classes": {GB200: counts(12, 11, 12, 3, 8, cd=2), "rdma": counts(6, 6, 6, 3, 3)},
        },
        B: {
            "fabricDomain": B, "nodes": 2, "verifiedNodes": 1, "largestFit": 1,
            "freeGpusOnPartialNodes": 0,
            "classes": {GB200: counts(8, 8, 4, 0, 4, nic=4), "rdma": counts(2, 1, 1, 0, 0)},
        },
    }  # fmt: skip
    if no_fabric:
        expected["none"] = {
            "fabricDomain": "none", "nodes": 2, "verifiedNodes": 2, "largestFit": 1,
            "freeGpusOnPartialNodes": 1,
            "classes": {H100: counts(3, 3, 3, 1, 2, nic=1), "rdma": counts(2, 2, 2, 2, 0)},
        }  # fmt: skip
    cd_view = {
        "namespace": ns, "name": "cd1", "fabricDomain": A, "numNodes": 1, "ready": "True",
        "nodes": [n["a3"]],
    }  # fmt: skip
    return {
        "slices": slices,
        "claims": claims,
        "nodeDevices": node_devices,
        "computeDomains": compute_domains,
        "nodes": n,
        "nodeObjects": [node_object(name) for name in n.values()],
        "expected": expected,
        "computeDomainView": cd_view,
    }
