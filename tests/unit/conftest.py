"""The unit tier's one fixture: stand-in tools run by this interpreter.

The stand-ins (tests/standins, tests/imex, tests/gpu) start with `#!/usr/bin/env python3`, as
they must inside the images that carry them. On a developer machine the first `python3` on
PATH is often a version manager's shim (pyenv's is a bash script that runs `pyenv exec`):
about 10 times the CPU of the interpreter itself for each start, and a unit test starts dozens
of stand-ins. The directory of the interpreter running the tests goes first on PATH instead
(a venv's bin/ holds `python3`), for every test and the processes it starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _stand_ins_run_by_this_interpreter() -> Iterator[None]:
    here = str(Path(sys.executable).parent)
    before = os.environ.get("PATH", "")
    if (Path(here) / "python3").exists():
        os.environ["PATH"] = os.pathsep.join([here, before]) if before else here
    try:
        yield
    finally:
        os.environ["PATH"] = before
