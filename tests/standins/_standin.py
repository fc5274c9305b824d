"""Shared by the stand-in tools (tests/standins): they print the real tools' output formats
and take their behaviour from the environment, so a test can make one slow, hung or weak.

    STANDIN_DIR        a folder for the call log (`calls`), start/end events (`events`),
                       `running.<name>` markers and the loopback's unix sockets
    STANDIN_HANG       tool names (or `ib_write_bw:<device>`) that hang until killed
    STANDIN_AWAIT      `<name>`: wait (up to 60 s) until that tool is running, else fail —
                       passes only when the two run at the same time (a tool started after
                       it ended logs `after <name> ended` and goes on)
    STANDIN_VALUE      `<name>=<number>,...`: the figure a tool reports (default: healthy)
    STANDIN_END_AFTER  `<event prefix>=<count>,...`: a hung tool told to stop (timeout's TERM)
                       ends only once `events` holds that many distinct lines starting with
                       each prefix (up to 60 s; timeout's KILL comes first): what a test
                       asserts happened before the first kill is awaited, not raced against
                       a short timeout
    STANDIN_HOLD       `<name>:<event prefix>=<count>,...`: that tool keeps running until
                       `events` holds those lines (up to 60 s), then does its work
    STANDIN_LATE_SERVER  seconds the loopback server waits before it listens, or `refused`:
                       it listens once its client's first connect was refused
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn


def folder() -> Path | None:
    d = os.environ.get("STANDIN_DIR")
    return Path(d) if d else None


def log(kind: str, text: str) -> None:
    d = folder()
    if d is not None:
        with open(d / kind, "a") as f:
            f.write(text + "\n")


def listed(var: str, name: str) -> bool:
    return name in [v.strip() for v in os.environ.get(var, "").split(",") if v.strip()]


def value(name: str, default: float) -> float:
    for item in os.environ.get("STANDIN_VALUE", "").split(","):
        key, _, v = item.partition("=")
        if key.strip() == name and v:
            return float(v)
    return default


def wait_for_events(wanted: str) -> None:
    """Until `events` holds, for each `<prefix>=<count>` in `wanted`, that many distinct lines
    starting with the prefix (up to 60 s)."""
    conditions = [c.rpartition("=") for c in wanted.split(",") if "=" in c]
    d = folder()
    if not conditions or d is None:
        return
    for _ in range(600):
        events = d / "events"
        lines = set(events.read_text().splitlines()) if events.exists() else set()
        if all(len([e for e in lines if e.startswith(p)]) >= int(n) for p, _, n in conditions):
            return
        time.sleep(0.1)


class Running:
    """The tool's `running.<name>` marker and its start/end events, removed on TERM (what
    coreutils' timeout sends first)."""

    def __init__(self, name: str) -> None:
        self.name = name
        d = folder()
        self.marker = d / f"running.{name}" if d else None
        self.hanging = False
        log("events", f"start {name}")
        if self.marker is not None:
            self.marker.touch()
        signal.signal(signal.SIGTERM, lambda *_: self.stop())

    def stop(self) -> NoReturn:
        """TERM: end; a hung tool once what STANDIN_END_AFTER names has happened."""
        if self.hanging:
            wait_for_events(os.environ.get("STANDIN_END_AFTER", ""))
        self.end(143)

    def end(self, code: int = 0, *, event: bool = True) -> NoReturn:
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)
        if event:
            log("events", f"end {self.name}")
        sys.stdout.flush()
        os._exit(code)

    def hang_if_asked(self) -> None:
        tool, _, held = os.environ.get("STANDIN_HOLD", "").partition(":")
        if tool and tool == self.name.split(":")[0]:
            wait_for_events(held)
        if listed("STANDIN_HANG", self.name) or listed("STANDIN_HANG", self.name.split(":")[0]):
            self.hanging = True
            while True:
                time.sleep(1)

    def await_other(self) -> None:
        other = os.environ.get("STANDIN_AWAIT")
        d = folder()
        if not other or d is None or other == self.name.split(":")[0]:
            return
        for _ in range(600):
            if (d / f"running.{other}").exists():
                log("events", f"saw {other} running: {self.name}")
                return
            events = d / "events"
            if f"end {other}" in (events.read_text() if events.exists() else ""):
                # Over before this one started (the tool after it in its lane): nothing to
                # wait for; a test counts the `saw` events it expects.
                log("events", f"after {other} ended: {self.name}")
                return
            time.sleep(0.1)
        print(f"stand-in {self.name}: {other} was not running alongside", file=sys.stderr)
        self.end(9)
