"""The verification gate as the agent runs it (docs/verification.md): when a run is due
(`verification.runner.Schedule`), where it runs (inside the pass, or on its own thread while
the active probes take minutes), the reverify annotation it answers, and the gate each publish
of a pass carries.

The first pass runs it, so a new node is never offered on trust; a run that did not pass is
retried with a backoff; the Node annotation `fabricdra.io/reverify` (as last read, apifacts.py)
asks for a run and is removed once it is recorded. With the active probes on, the run goes on
its own thread — in the verification pod with `verify_image` — and a later pass records it
(the thread's end wakes one); the tools run only while no claim is prepared on the node."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from .apifacts import ApiFacts
from .discovery.node import Discovery
from .discovery.sysfs import SysfsTree
from .kubelet.checkpoint import Checkpoint
from .verification import GateInput, Tools, VerificationRun, fingerprint
from .verification.runner import CHANGED, FIRST_RUN, Schedule, run_once

if TYPE_CHECKING:
    from .agent import AgentConfig

log = structlog.get_logger("fabricdra.agent")


def _verify_tools(config: AgentConfig, api: Any) -> Tools:
    """The verification tools, run in a pod of `verify_image` where one is set."""
    if not config.verify_image:
        return config.verify_tools
    from fabricdra.kube.rest import Rest

    from .verification.podrun import PodExecutor

    pod = PodExecutor(
        Rest(api),
        config.verify_namespace,
        config.node_name,
        config.verify_image,
        runtime_class=config.verify_runtime_class,
    )
    # In the pod the image's own PATH finds the tools.
    return replace(config.verify_tools, executor=pod, path=None)


class VerificationGate:
    def __init__(
        self,
        config: AgentConfig,
        api: Any,
        publisher: Any,
        facts: ApiFacts,
        checkpoint: Checkpoint,
        wake: Callable[[], None],
    ) -> None:
        self.config = config
        self.publisher = publisher
        self.facts = facts
        self.checkpoint = checkpoint
        self.wake = wake  # starts a pass
        self.schedule = Schedule(interval=config.verify_interval)
        self.tools = _verify_tools(config, api)
        self._restored = False
        self._reverify: str | None = None  # the reverify annotation this pass answers
        # A run with active probes goes on off the pass thread (tools take minutes): the
        # thread, the reverify request it answers, and its result once done.
        self._verifying: threading.Thread | None = None
        self._verifying_answers: str | None = None
        self._verified: VerificationRun | None = None
        self._verified_lock = threading.Lock()
        self._verifying_done = False
        self._fingerprint = ""

    def run_in_pass(
        self, tree: SysfsTree, discovery: Discovery, publish: Callable[[GateInput], None]
    ) -> None:
        """The pass's part: record a finished run, start or run a due one, and publish the
        pass with the gate (`publish`), first unverified where the hardware is new."""
        answered = self._collect_verification()
        why = self._verification_due(tree, discovery)
        if why is not None and self._verifying is not None:
            why = None  # a run is under way: its result decides, at a later pass
        if why in (FIRST_RUN, CHANGED):
            # Published unverified while the run goes on (bandwidth tools take minutes):
            # an old result never speaks for new hardware, a new node is never offered.
            publish(self.gate())
        background = why is not None and self.tools.run_bandwidth
        if why is not None and background:
            self._start_verification(discovery, why)
        elif why is not None:
            self._run_verification(tree, discovery, why)
        publish(self.gate())
        if why is not None and not background and self._reverify is not None:
            self._answered_reverify(self._reverify)
        if answered is not None:
            self._answered_reverify(answered)

    def gate(self) -> GateInput:
        return GateInput(self.schedule.last_run, self._fingerprint)

    def _verification_due(self, tree: SysfsTree, discovery: Discovery) -> str | None:
        if not self._restored and self.schedule.last_run is None:
            recorded = getattr(self.publisher, "recorded_verification", None)
            try:
                if recorded is not None:
                    self.schedule.restore(recorded())
                self._restored = True
            except Exception as e:  # the API may be down: this pass verifies afresh
                log.warning("recorded verification unreadable", error=str(e))
        if discovery.interfaces is None or discovery.accelerators is None:
            return None  # only a complete enumeration says what the node has: keep the last
        self._reverify = self._reverify_request()
        if self._reverify is not None:
            self.schedule.request()
        self._fingerprint = fingerprint(tree, discovery.interfaces, discovery.accelerators)
        why = self.schedule.due(self._fingerprint)
        if why == CHANGED:
            self.schedule.baseline.clear()  # a repair: its own link flaps do not count
        return why

    def _reverify_request(self) -> str | None:
        """The reverify annotation as last read (apifacts.py): never read on the pass."""
        entries = self.checkpoint.entries()
        return self.facts.current(e.uid for e in entries).reverify

    def _answered_reverify(self, value: str) -> None:
        clear = getattr(self.publisher, "clear_reverify", None)
        try:
            if clear is not None:
                clear(value)
        except Exception as e:  # a newer request, or the API is down: the next pass sees it
            log.warning("reverify annotation not removed", error=str(e))
        else:
            self.facts.forget_reverify(value)
            log.info("reverification done; annotation removed")

    def _run_verification(self, tree: SysfsTree, discovery: Discovery, why: str) -> None:
        log.info("verification run starting", reason=why)
        self.schedule.ran(
            run_once(
                tree,
                discovery.interfaces or [],
                discovery.accelerators or [],
                discovery.nvml,
                self._fingerprint,
                tools=self.tools,
                expect=self.config.verify_expect,
                baseline=self.schedule.baseline,
            )
        )

    def _busy(self) -> str | None:
        """Why the node is not idle for the active probes: claims prepared on its devices
        (the checkpoint), which the tools would disturb and be disturbed by."""
        entries = self.checkpoint.entries()
        if not entries:
            return None
        return f"node busy: {len(entries)} claim(s) prepared on it"

    def _start_verification(self, discovery: Discovery, why: str) -> None:
        """Run verification (with the active probes) on its own thread; the pass goes on and
        publishes the gate as it is, and the thread's end starts a pass that records it."""
        log.info("verification run starting", reason=why, background=True)
        interfaces, accelerators = discovery.interfaces or [], discovery.accelerators or []
        nvml, fp, busy = discovery.nvml, self._fingerprint, self._busy()
        previous = self.schedule.last_run
        self._verifying_answers = self._reverify
        if busy is not None:
            log.info("active probes not run: the node is busy", reason=busy)

        def work() -> None:
            tree = SysfsTree(self.config.sysfs_root)
            try:
                run = run_once(
                    tree,
                    interfaces,
                    accelerators,
                    nvml,
                    fp,
                    tools=self.tools,
                    expect=self.config.verify_expect,
                    baseline=self.schedule.baseline,
                    busy=busy,
                    previous=previous,
                )
            except Exception:
                log.exception("verification run failed to complete; retried later")
                run = None
            finally:
                tree.close()
            with self._verified_lock:
                self._verified = run
                self._verifying_done = True
            self.wake()

        self._verifying_done = False
        self._verifying = threading.Thread(target=work, name="verification", daemon=True)
        self._verifying.start()

    def _collect_verification(self) -> str | None:
        """Take a finished background run into the schedule; returns the reverify request it
        answered (to be removed once published)."""
        if self._verifying is None:
            return None
        with self._verified_lock:
            if not self._verifying_done:
                return None
            run, self._verified = self._verified, None
        self._verifying.join()
        self._verifying = None
        answered, self._verifying_answers = self._verifying_answers, None
        if run is None:
            return None
        self.schedule.ran(run)
        return answered

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a background run to end (tests, shutdown); True when none is under way."""
        thread = self._verifying
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def request(self) -> None:
        """Run verification in the next pass, and start that pass now."""
        self.schedule.request()
        self.wake()
