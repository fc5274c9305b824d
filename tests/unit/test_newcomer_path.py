"""The newcomer path: README's set-up commands, the Makefile's venv rule, up.sh without a venv.

Each test runs the real script or Makefile rule; the only stand-ins are the slow steps around
the rule under test (package installs, the cluster itself), replaced by files in a tmp copy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _readme_setup_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    setup = text.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```$", setup, re.S | re.M)
    assert block is not None, "README's Set up section has no ```sh block"
    lines = [line.strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_ci_runs_exactly_readmes_setup_commands_in_order() -> None:
    printed = subprocess.run(
        [str(REPO / ".ci" / "run"), "--print"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    commands = _readme_setup_commands()
    assert printed == commands
    assert len(commands) == 2
    assert commands[1] == "make test"


def test_make_venv_installs_dev_tools_into_a_venv_made_by_readme_command_1(
    tmp_path: Path,
) -> None:
    # README command 1 leaves .venv/bin/fabricdra (package only, no ruff/mypy/pytest), newer
    # than pyproject.toml. `make test` must still install the dev extra into it.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "fabricdra").write_text("#!/bin/sh\n")
    future = (REPO / "pyproject.toml").stat().st_mtime + 3600
    os.utime(venv / "bin" / "fabricdra", (future, future))
    plan = subprocess.run(
        ["make", "-n", "-C", str(REPO), "venv", f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "install --quiet -e '.[dev]'" in plan


def test_make_venv_is_a_no_op_once_the_dev_tools_are_in(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp = venv / ".fabricdra-dev"
    stamp.touch()
    future = (REPO / "pyproject.toml").stat().st_mtime + 3600
    os.utime(stamp, (future, future))
    plan = subprocess.run(
        ["make", "-n", "-C", str(REPO), "venv", f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "pip install" not in plan


def test_up_sh_without_a_venv_makes_one_before_starting_the_harness(tmp_path: Path) -> None:
    # A copy of the repo's layout: the real up.sh; install-deps/build stand-ins (they need root
    # and the network); a Makefile whose venv rule records that it ran and makes the venv.
    repo = tmp_path / "repo"
    cluster = repo / "e2e" / "cluster"
    cluster.mkdir(parents=True)
    shutil.copy2(REPO / "e2e" / "cluster" / "up.sh", cluster / "up.sh")
    for stub in ("install-deps.sh", "build.sh"):
        (cluster / stub).write_text("#!/bin/sh\nexit 0\n")
        (cluster / stub).chmod(0o755)
    (repo / "Makefile").write_text(
        "venv:\n"
        "\tmkdir -p .venv/bin\n"
        "\tprintf '#!/bin/sh\\necho harness \"$$@\"\\n' > .venv/bin/python\n"
        "\tchmod +x .venv/bin/python\n"
    )
    result = subprocess.run(
        [str(cluster / "up.sh"), "--base", "/x"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "harness -m e2e.harness.nodecluster up --base /x"
