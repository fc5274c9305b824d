"""A thin JSON layer over `kubernetes.client.ApiClient`: plain dicts in, plain dicts out.

Every part of fabricdra that talks to the API server goes through it (the node agent's
publisher, the controller, the compute-domain node side). The parts handle a few kinds
(CRDs, claims and their templates, slices, DaemonSets, Leases, Nodes, Events) the same way;
going through the client's connection pool directly keeps one code path for all of them (with
the client's auth, TLS and user agent), skips the typed models' (de)serialisation cost on every
watch event, keeps fields newer than the client library, and sends exactly the documents we build.

Every call is one attempt (urllib3 retries off, explicitly, on each request): a call's
`timeout` is the most it can take, never a multiple of it.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import urllib3

from fabricdra.api.jsontypes import JSON

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply (a JSON body is valid YAML)


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST tree."""

    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
        return base


# fabricdra's own Kinds, whose models are in fabricdra.api.computedomain and .nodedevices (not
# imported here: this module stays free of pydantic); tests/unit/test_opaque_config.py fails if
# these drift from the models' group, version and plural.
COMPUTE_DOMAINS = Kind("fabricdra.io", "v1beta1", "computedomains", True)
NODE_DEVICES = Kind("fabricdra.io", "v1alpha1", "nodedevices", False)
CLAIM_TEMPLATES = Kind("resource.k8s.io", "v1", "resourceclaimtemplates", True)
CLAIMS = Kind("resource.k8s.io", "v1", "resourceclaims", True)
SLICES = Kind("resource.k8s.io", "v1", "resourceslices", False)
DAEMON_SETS = Kind("apps", "v1", "daemonsets", True)
LEASES = Kind("coordination.k8s.io", "v1", "leases", True)
NODES = Kind("", "v1", "nodes", False)
EVENTS = Kind("", "v1", "events", True)
PODS = Kind("", "v1", "pods", True)
SERVICES = Kind("", "v1", "services", True)
SECRETS = Kind("", "v1", "secrets", True)
CONFIG_MAPS = Kind("", "v1", "configmaps", True)
NAMESPACES = Kind("", "v1", "namespaces", False)
DEVICE_CLASSES = Kind("resource.k8s.io", "v1", "deviceclasses", False)


class ApiError(Exception):
    """A failed API call, with the HTTP status (0 = no response) and the server's message.

    Typed by what a caller does with it: `NotFound` (treat as absent), `Conflict` (someone
    else wrote first, or it already exists: re-read or let its event requeue), `Gone` (the
    resource version expired: re-list), `Invalid` (the server refused the body), `Forbidden`
    (RBAC says no: retrying will not help) and `Throttled` (429: back off). Anything else is
    this base class. `ApiError(status, message)` always builds the subclass for `status`, so a
    404 is a `NotFound` wherever it was made (the REST layer, a watch's ERROR event, a fake).
    """

    def __new__(cls, status: int, message: str) -> ApiError:
        typed = _BY_STATUS.get(status, cls) if cls is ApiError else cls
        return Exception.__new__(typed, status, message)

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NotFound(ApiError):
    """404: the object (or the kind) does not exist."""


class Conflict(ApiError):
    """409: a stale resourceVersion, or a create of a name that exists."""


class Gone(ApiError):
    """410: the resource version is too old (after etcd compaction); re-list."""


class Invalid(ApiError):
    """422: the server refused the body (a validation error)."""


class Forbidden(ApiError):
    """403: RBAC does not allow the call; another attempt will not change that."""


class Throttled(ApiError):
    """429: the server (API priority and fairness) asks the client to back off."""


# https://kubernetes.io/docs/reference/using-api/api-concepts/#http-status-codes
_BY_STATUS: dict[int, type[ApiError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: Throttled,
}


class Rest:
    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: Any,
        retries: bool = False,
    ) -> Any:
        q = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, _, _ = self.api.param_serialize(
            method,
            path,
            query_params=q or None,
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        # Compact JSON with sorted keys, sent as bytes: opaque parameters inside a claim are
        # stored verbatim, and a later status patch (which re-encodes them compactly and
        # sorted) must reproduce them byte for byte or the allocation counts as changed.
        data = None if body is None else json.dumps(body, separators=(",", ":"), sort_keys=True)
        if isinstance(timeout, tuple):
            limit = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        else:
            limit = urllib3.Timeout(total=timeout)
        # Exactly one attempt, always, so `timeout` bounds the whole call: the pool's default
        # (urllib3's Retry(3), which the kubernetes client keeps) would retry a timed-out GET,
        # turning 30 s into 120 s, and hold a kubelet call or a lock for all of it. A caller
        # that wants another attempt makes it itself, with its own budget.
        try:
            resp = self.api.rest_client.pool_manager.request(
                method,
                url,
                body=data,
                headers=headers,
                preload_content=False,
                timeout=limit,
                retries=retries,
            )
        except (urllib3.exceptions.HTTPError, OSError) as e:  # refused, reset, timeouts
            raise ApiError(0, str(e)) from None
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, _message(resp.data))
        return resp

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = 30.0,
        retries: bool = False,
    ) -> JSON:
        resp = self._send(method, path, query, body, content_type, timeout, retries)
        raw = resp.data
        doc: JSON = json.loads(raw) if raw else {}
        return doc

    def text(
        self, path: str, *, query: Mapping[str, Any] | None = None, timeout: float = 30.0
    ) -> str:
        """A GET whose answer is text, not JSON (a pod's log)."""
        resp = self._send("GET", path, query, None, "application/json", timeout)
        data: bytes = resp.data or b""
        return data.decode(errors="replace")

    # -- verbs ---------------------------------------------------------------------------
    def get(
        self, kind: Kind, name: str, namespace: str | None = None, *, timeout: float = 30.0
    ) -> JSON:
        return self.call("GET", kind.path(namespace, name), timeout=timeout)

    def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> JSON | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(kind, name, namespace)
        except NotFound:
            return None

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> JSON:
        """One LIST; with `limit`, one page of it (its `metadata.continue` names the next)."""
        query = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit,
            "continue": continue_token,
        }
        return self.call("GET", kind.path(namespace), query=query)

    def pages(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
    ) -> Iterator[JSON]:
        """Every page of one LIST, `limit` objects each (all pages one snapshot): a fleet's
        objects never all in memory at once. The last page carries the list's version."""
        token: str | None = None
        while True:
            page = self.list(
                kind,
                namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=limit,
                continue_token=token,
            )
            yield page
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return

    def create(
        self,
        kind: Kind,
        body: JSON,
        namespace: str | None = None,
        *,
        timeout: float = 30.0,
        retries: bool = False,
    ) -> JSON:
        out = self.call("POST", kind.path(namespace), body=body, timeout=timeout, retries=retries)
        self._accepted(kind, "create")
        return out

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        sub: str = "",
        content_type: str = MERGE_PATCH,
        timeout: float = 30.0,
    ) -> JSON:
        out = self.call(
            "PATCH",
            kind.path(namespace, name, sub),
            body=patch,
            content_type=content_type,
            timeout=timeout,
        )
        self._accepted(kind, "patch")
        return out

    def apply(
        self,
        kind: Kind,
        name: str,
        body: JSON,
        namespace: str | None = None,
        *,
        field_manager: str,
        sub: str = "",
        force: bool = True,
        timeout: float | None = 30.0,
        retries: bool = False,
    ) -> JSON:
        """Server-side apply: `body` states exactly the fields `field_manager` owns; fields of
        other managers (other drivers' entries of a list-map) are left alone."""
        query = {"fieldManager": field_manager, "force": "true" if force else None}
        out = self.call(
            "PATCH",
            kind.path(namespace, name, sub),
            query=query,
            body=body,
            content_type=APPLY_PATCH,
            timeout=timeout,
            retries=retries,
        )
        self._accepted(kind, "apply")
        return out

    def replace(self, kind: Kind, name: str, body: JSON, namespace: str | None = None) -> JSON:
        out = self.call("PUT", kind.path(namespace, name), body=body)
        self._accepted(kind, "update")
        return out

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> bool:
        """Delete; False if it was already gone."""
        try:
            self.call(
                "DELETE", kind.path(namespace, name), body={"propagationPolicy": "Background"}
            )
        except NotFound:
            return False
        self._accepted(kind, "delete")
        return True

    def _accepted(self, kind: Kind, verb: str) -> None:
        """Called after each write the server accepted (CountingRest counts them here)."""

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        opened: Callable[[urllib3.BaseHTTPResponse], None] | None = None,
    ) -> Iterator[JSON]:
        """Events after `resource_version` until the server closes the stream. `opened` gets
        the open response, so another thread can end the watch (`shutdown()`) at once."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
        }
        resp = self._send(
            "GET", kind.path(namespace), query, None, "application/json", (10, timeout_seconds + 30)
        )
        if opened is not None:
            opened(resp)
        buffer = b""
        try:
            for chunk in resp.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        except (urllib3.exceptions.HTTPError, OSError) as e:  # the server went away
            raise ApiError(0, str(e)) from None
        finally:
            resp.release_conn()


WriteHook = Callable[[Kind, str], None]  # (kind, verb) after a write the server accepted


class CountingRest(Rest):
    """The REST layer that counts every write the server accepted, by (resource, verb), in
    one place: the controller and the node side use it, so "API writes per domain / per
    node-minute" (bench/scale.py) and the Prometheus counter read the same numbers. A 409 or
    404 answer changed nothing and is not counted; nor is a delete of something already gone."""

    def __init__(self, api_client: Any, on_write: WriteHook | None = None) -> None:
        super().__init__(api_client)
        self._on_write = on_write
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def writes(self) -> dict[tuple[str, str], int]:
        """(plural, verb) -> writes so far."""
        with self._lock:
            return dict(self._counts)

    def total_writes(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def _accepted(self, kind: Kind, verb: str) -> None:
        with self._lock:
            self._counts[(kind.plural, verb)] += 1
        if self._on_write is not None:
            self._on_write(kind, verb)


def _message(body: Any) -> str:
    if not body:
        return ""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return str(body)[:500]
    return str(doc.get("message", doc))[:1000]
