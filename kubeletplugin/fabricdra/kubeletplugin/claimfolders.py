"""Per-claim folders under one directory (`<dir>/<claim uid>/`): the files prepare writes for
a claim beside its CDI spec (device metadata, the NCCL topology) live in one each, and go with
the claim at unprepare or, for claims the checkpoint no longer names, at start-up."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import structlog

log = structlog.get_logger("fabricdra.claimfolders")


def safe_uid(claim_uid: str) -> bool:
    """A uid that names a folder inside the directory, never a path outside it."""
    return bool(claim_uid) and "/" not in claim_uid and claim_uid not in (".", "..")


def remove(directory: Path, claim_uid: str) -> None:
    if safe_uid(claim_uid):
        shutil.rmtree(directory / claim_uid, ignore_errors=True)


def keep_only(directory: Path, claim_uids: Iterable[str], what: str) -> None:
    """Remove the folders of claims not in `claim_uids` (another boot's); `what` names their
    files in the log line."""
    keep = set(claim_uids)
    try:
        found = list(directory.iterdir())
    except FileNotFoundError:
        return
    for entry in found:
        if entry.name not in keep and entry.is_dir() and not entry.is_symlink():
            log.info(f"removing {what} of a claim no longer prepared", uid=entry.name)
            shutil.rmtree(entry, ignore_errors=True)
