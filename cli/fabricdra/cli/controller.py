"""`fabricdra controller`: the ComputeDomain controller."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add this module's subcommands to the `fabricdra` parser (filled in by its owner)."""
