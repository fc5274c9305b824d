"""Every published interface is documented (the developers' guide): each CLI flag of every
subcommand appears in docs/, and each node label key fabricdra writes or reads in
docs/labels.md."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from fabricdra.api import labels, scaleout
from fabricdra.cli import COMMANDS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _docs() -> str:
    return "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.md")))


def _flags() -> list[tuple[str, str]]:
    found = []
    for module in sorted({m for m, _ in COMMANDS.values()}):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"fabricdra.cli.{module}").register(sub)
        for command, p in sub.choices.items():
            for action in p._actions:
                found += [(command, o) for o in action.option_strings if o.startswith("--")]
    return [f for f in found if f[1] != "--help"]


def test_every_flag_of_every_command_is_in_the_docs() -> None:
    docs = _docs()
    flags = _flags()
    assert len(flags) > 100  # the walk found the commands' flags at all
    missing = [
        f"{command} {flag}"
        for command, flag in flags
        if not any(f"{flag}{end}" in docs for end in ("`", " ", "=", "]"))
    ]
    assert not missing, f"flags not documented in docs/: {missing}"


def test_every_label_key_is_in_the_labels_doc() -> None:
    text = (DOCS / "labels.md").read_text()
    keys = [
        v
        for v in vars(labels).values()
        if isinstance(v, str) and v.startswith(labels.PREFIX) and v != labels.PREFIX
    ]
    keys += list(scaleout.TIER_LABELS)
    assert len(keys) > 8
    missing = [k for k in keys if k not in text]
    assert not missing, f"label keys not in docs/labels.md: {missing}"
