"""What a discovery pass needs from the API server, read off the pass's path.

A pass tells kubelet about device health (the DRA health stream) and hands the devices and
their taints to the publisher from local facts only; what it takes from the API is read here,
and the pass uses the last-known values (`ApiFacts.current()`):

- the node's RDMA mode, from the Node's `fabricdra.io/rdma-mode` label (absent: the flag's
  mode; invalid: the flag's mode, an error log and one Warning event on the NodeDevices record
  per value; unreadable: the last mode read);
- the Node's `fabricdra.io/reverify` annotation;
- the device plugins advertising on this node, from the Node's `status.capacity`
  (coexistence.py, `device_plugin_conflicts`; unreadable: the last answer; never read: unknown,
  `None`, which the pass never takes for "no device plugin") — one read of the Node gives
  these three, and the Node's reference for events about it;
- which checkpointed claims whose hold keeps a NIC in its old mode (`agent.pins_mode`) are gone
  from the API (a claim found gone is not read again; one that cannot be read counts as
  there).

Once the agent runs, the reads happen on this module's thread: each pass asks for a refresh
(`request`), and a refresh that changed anything wakes a pass to apply it. With the API server
hung, a pass still reaches kubelet and the publisher at once; the reads give up after their
own timeouts on their own thread. A lone pass (the first, before the sockets open, when nothing
has been read yet; or a test's) reads them itself with `refresh_node` / `refresh_holds`, after
it has published health.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from fabricdra.api import labels as label_keys
from fabricdra.kube import events
from fabricdra.kube.events import ObjectRef, Reporter
from fabricdra.kube.rest import EVENTS, NODE_DEVICES, NODES

from .coexistence import BUILTIN_RULES, Conflict, Rule, device_plugin_conflicts
from .devices import RdmaMode, parse_rdma_mode
from .kubelet.checkpoint import ClaimEntry
from .kubelet.claims import ClaimReader, is_gone
from .verification.gate import REVERIFY_ANNOTATION

log = structlog.get_logger("fabricdra.agent")

NODE_READ_SECONDS = 10.0  # one read of this node's Node (labels, annotations)
HOLD_READ_SECONDS = 5.0  # one read of a claim whose hold keeps a NIC in its old mode


@dataclass(frozen=True)
class Facts:
    mode: RdmaMode
    reverify: str | None  # the reverify request to answer (None: none)
    gone: frozenset[str]  # UIDs of checkpointed claims found gone from the API
    node_read_at: float | None  # time.monotonic() of the last good read of the Node
    # The groups a device plugin advertises on the Node's capacity (coexistence.py), as last
    # read; None: the Node was never read, so unknown (never "no device plugin").
    plugins: tuple[Conflict, ...] | None = None
    # The Node as last read, reduced to what an event about it names (None: not read yet, or
    # it does not exist).
    node: Mapping[str, Any] | None = None

    def age(self) -> float | None:
        """Seconds since the Node was last read (None: never read)."""
        return None if self.node_read_at is None else time.monotonic() - self.node_read_at


class ApiFacts:
    def __init__(
        self,
        rest: Any,
        node_name: str,
        default_mode: RdmaMode,
        claims: ClaimReader,
        wake: Callable[[], None],
        *,
        rules: Sequence[Rule] = BUILTIN_RULES,
        offline: bool = False,
    ) -> None:
        self.rest = rest
        self.node_name = node_name
        self.default_mode = default_mode
        self.claims = claims
        self.wake = wake
        self.rules = tuple(rules)
        # No API server (offline, unit tests): no Node to read, so no device plugin to see.
        self.offline = offline
        self._lock = threading.Lock()
        self._mode: RdmaMode = default_mode
        self._mode_known = False
        self._reverify: str | None = None
        self._forgotten = 0  # bumped when a reverify request is answered
        self._gone: set[str] = set()
        self._read_at: float | None = None
        self._plugins: tuple[Conflict, ...] | None = () if offline else None
        self._node: dict[str, Any] | None = None
        self._warned_label: str | None = None  # the invalid value an event was sent for
        self._pinning: list[ClaimEntry] = []
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0  # refreshes done on the thread

    @property
    def running(self) -> bool:
        return self._thread is not None

    def current(self, uids: Iterable[str]) -> Facts:
        """The last-known facts; `uids` are the checkpoint's claims now (a gone claim that was
        unprepared is forgotten)."""
        with self._lock:
            self._gone &= set(uids)
            return Facts(
                self._mode,
                self._reverify,
                frozenset(self._gone),
                self._read_at,
                self._plugins,
                self._node,
            )

    # -- the reads ---------------------------------------------------------------------------

    def refresh_node(self) -> bool:
        """Read the Node (RDMA mode label, reverify annotation, device plugins on its
        capacity); whether anything a pass uses changed. Unreadable: the last values are
        kept."""
        if self.offline:
            return False
        with self._lock:
            forgotten = self._forgotten
        try:
            node = self.rest.get(NODES, self.node_name, timeout=NODE_READ_SECONDS)
        except Exception as e:
            not_found = getattr(e, "not_found", False)
            if not not_found:
                with self._lock:
                    mode = self._mode
                log.warning(
                    "node unreadable; its RDMA mode and device plugins kept",
                    mode=mode,
                    error=str(e),
                )
                return False
            node = None
        meta = (node or {}).get("metadata") or {}
        mode = self._mode_of((meta.get("labels") or {}).get(label_keys.RDMA_MODE))
        request = (meta.get("annotations") or {}).get(REVERIFY_ANNOTATION)
        request = request if isinstance(request, str) else None
        plugins = tuple(device_plugin_conflicts(node or {}, self.rules))
        ref = None
        if node is not None:
            ref = {
                "apiVersion": node.get("apiVersion", "v1"),
                "kind": node.get("kind", "Node"),
                "metadata": {"name": meta.get("name", self.node_name), "uid": meta.get("uid")},
            }
        with self._lock:
            changed = mode != self._mode or not self._mode_known
            if changed:
                log.info("RDMA mode of this node", mode=mode)
            changed |= plugins != self._plugins
            self._plugins, self._node = plugins, ref
            if self._forgotten == forgotten:  # not a request answered while we read
                changed |= request is not None and request != self._reverify
                self._reverify = request
            self._mode, self._mode_known = mode, True
            self._read_at = time.monotonic()
        return changed

    def _mode_of(self, value: Any) -> RdmaMode:
        default = self.default_mode
        if value is None:
            self._warned_label = None  # a later invalid value is reported afresh
            return default
        try:
            mode = parse_rdma_mode(value)
        except ValueError as e:
            log.error(
                "invalid node label; using the default RDMA mode",
                label=label_keys.RDMA_MODE,
                value=value,
                default=default,
                error=str(e),
            )
            if self._warned_label != value and self._warn_invalid_label(value, default):
                self._warned_label = value
            return default
        self._warned_label = None
        return mode

    def _warn_invalid_label(self, value: str, default: RdmaMode) -> bool:
        """A Warning event on this node's NodeDevices record (once per invalid value; False:
        not sent, e.g. no record yet, so the next read tries again)."""
        try:
            record = self.rest.get_or_none(NODE_DEVICES, self.node_name)
        except Exception as e:
            log.warning("cannot record event", reason="InvalidRdmaMode", error=str(e))
            return False
        if record is None:
            return False
        message = (
            f"node label {label_keys.RDMA_MODE}={value!r} is not exclusive, "
            f"shared or off; RDMA endpoints are offered in the default mode {default!r}"
        )
        return self.event(record, "InvalidRdmaMode", message)

    def event(self, about: Mapping[str, Any], reason: str, message: str) -> bool:
        """A Warning event on `about` (this node's Node or NodeDevices) in `default`, where
        cluster-scoped objects' events go; False: not recorded."""
        try:
            body = events.event(
                ObjectRef.of(about, api_version="v1", kind="Node"),
                Reporter("fabricdra-kubelet-plugin", host=self.node_name),
                type="Warning",
                reason=reason,
                message=message,
                namespace="default",
            )
            self.rest.create(EVENTS, body, "default", timeout=10.0, retries=False)
        except Exception as e:  # an event is advice: the log line already says it
            log.warning("cannot record event", reason=reason, error=str(e))
            return False
        return True

    def refresh_holds(self, pinning: Sequence[ClaimEntry]) -> bool:
        """Read the claims of `pinning` not known gone; whether one was found gone."""
        with self._lock:
            todo = [e for e in pinning if e.uid not in self._gone]
        found = False
        for entry in todo:
            try:
                gone = is_gone(self.claims, entry, HOLD_READ_SECONDS)
            except Exception as e:
                log.warning(
                    "claim unreadable; its NIC keeps the mode it is held in",
                    claim=f"{entry.namespace}/{entry.name}",
                    error=str(e),
                )
                continue
            if gone:
                log.warning(
                    "claim gone from the API is still prepared here: its NIC is offered "
                    "in no mode until kubelet unprepares it",
                    claim=f"{entry.namespace}/{entry.name}",
                    uid=entry.uid,
                )
                with self._lock:
                    self._gone.add(entry.uid)
                found = True
        return found

    def forget_reverify(self, value: str) -> None:
        """The request `value` was answered (its annotation removed): no pass answers it
        again, even if a read that began before the removal still saw it."""
        with self._lock:
            if self._reverify == value:
                self._reverify = None
            self._forgotten += 1

    # -- the thread --------------------------------------------------------------------------

    def request(self, pinning: Sequence[ClaimEntry]) -> bool:
        """Ask the thread for a refresh (the Node, and the claims of `pinning`); False when the
        thread does not run (the caller reads them itself)."""
        if self._thread is None:
            return False
        with self._lock:
            self._pinning = list(pinning)
        self._kick.set()
        return True

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="api-facts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the loop; a read in progress ends within its own timeout (a daemon thread)."""
        self._stop.set()
        self._kick.set()
        self._thread = None

    def _run(self) -> None:
        while True:
            self._kick.wait()
            self._kick.clear()
            if self._stop.is_set():
                return
            with self._lock:
                pinning = self._pinning
            try:
                changed = self.refresh_node()
                changed |= self.refresh_holds(pinning)
            except Exception:
                log.exception("reading the node's API facts failed; retried next pass")
                changed = False
            self.refreshes += 1
            if changed and not self._stop.is_set():
                self.wake()  # a pass applies what changed
