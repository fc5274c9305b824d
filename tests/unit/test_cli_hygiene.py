"""The `fabricdra` command as a whole (issue 21): each process imports only its subcommand,
every command answers --version, a bad environment variable is one line naming it (exit 2),
and every component logs JSON lines with a level and a timestamp, stdlib loggers included."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from fabricdra.cli import UsageError, build_parser, main

ROOT = Path(__file__).resolve().parents[2]

# What a short command must not pay for at start-up: other components, the Kubernetes client,
# gRPC, and structlog (its import pulls in asyncio) unless something is logged.
HEAVY = ("fabricdra.controller", "kubernetes", "grpc", "prometheus_client", "structlog")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (its stdout goes away)."""
    probe = (
        "import contextlib, io, json, sys\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY))


def test_importing_the_command_imports_no_subcommand() -> None:
    modules = _modules_after("import fabricdra.cli")
    assert _heavy(modules) == []
    assert not [m for m in modules if m.startswith("fabricdra.kubeletplugin")]


def test_inventory_process_imports_neither_controller_nor_clients() -> None:
    modules = _modules_after("from fabricdra.cli import main\nmain(['inventory', '--sample'])")
    assert "fabricdra.kubeletplugin.discovery.node" in modules  # it did run
    assert _heavy(modules) == []


def test_help_lists_every_command_without_importing_one() -> None:
    modules = _modules_after(
        "from fabricdra.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert _heavy(modules) == []
    assert not [m for m in modules if m.startswith("fabricdra.kubeletplugin")]


def test_commands_table_matches_what_the_modules_register() -> None:
    """`COMMANDS` repeats each subcommand's help so `--help` imports nothing: it must say
    what the module itself registers."""
    from fabricdra.cli import COMMANDS

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered == {name: help_text for name, (_, help_text) in COMMANDS.items()}


def test_version_is_answered_by_the_command_and_every_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fabricdra.cli import COMMANDS

    expected = f"fabricdra {version('fabricdra')}"
    for argv in (["--version"], *([name, "--version"] for name in COMMANDS)):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0, argv
        assert capsys.readouterr().out.strip() == expected, argv


def test_version_as_a_process() -> None:
    for argv in (["--version"], ["kubelet-plugin", "--version"]):
        result = subprocess.run(
            [sys.executable, "-m", "fabricdra.cli", *argv], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"fabricdra {version('fabricdra')}"


def _env_flags() -> list[tuple[str, str, argparse.Action]]:
    """Every (subcommand, variable, flag) whose default comes from a variable and whose value
    can be wrong: a number, a switch or one of a few words."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for name, subparser in sub.choices.items():
        for action in subparser._actions:
            help_text = action.help or ""
            if "[FABRICDRA_" not in help_text:
                continue
            var = help_text.split("[", 1)[1].split("]")[0].split("=")[0]
            typed = action.type in (int, float) or action.choices is not None
            if typed or isinstance(action, argparse._StoreTrueAction):
                found.append((name, var, action))
    return found


def test_every_typed_variable_is_checked() -> None:
    flags = _env_flags()
    assert len(flags) >= 20  # the scan found the flags (guards the test against itself)
    for command, var, action in flags:
        os.environ[var] = "not-valid"
        try:
            with pytest.raises(UsageError, match=f"^{var}='not-valid' is not "):
                build_parser([command]).parse_args([command])
            # The flag wins over the variable, which is then never looked at.
            if action.type in (int, float):
                args = build_parser([command]).parse_args([command, action.option_strings[0], "7"])
                assert getattr(args, action.dest) == 7
        finally:
            del os.environ[var]


@pytest.mark.parametrize(
    ("command", "var", "value"),
    [
        ("controller", "FABRICDRA_WORKERS", "four"),
        ("controller", "FABRICDRA_LEADER_ELECT", "maybe"),
        ("kubelet-plugin", "FABRICDRA_METRICS_PORT", "9478x"),
        ("kubelet-plugin", "FABRICDRA_RDMA_MODE", "both"),
        ("kubelet-plugin", "FABRICDRA_EFA", "sometimes"),
        ("compute-domain-plugin", "FABRICDRA_IMEX_WAIT_SECONDS", "soon"),
        ("imex-daemon", "FABRICDRA_IMEX_MAX_PEERS", "lots"),
        ("cleanup", "FABRICDRA_DOMAIN_TIMEOUT", "1m"),
    ],
)
def test_bad_variable_is_one_line_naming_it(command: str, var: str, value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fabricdra.cli", command],
        capture_output=True,
        text=True,
        env={**os.environ, var: value},
    )
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"fabricdra {command}: {var}={value!r} is not ")
    assert "Traceback" not in result.stderr


def test_another_commands_bad_variable_does_not_matter(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FABRICDRA_WORKERS", "four")  # the controller's
    assert main(["inventory", "--sample"]) == 0
    assert json.loads(capsys.readouterr().out)["sysfsRoot"] == "sample"


def test_empty_numeric_variable_keeps_its_meaning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blank chart value: the default, or 0 where 0 disables (the metrics port)."""
    monkeypatch.setenv("FABRICDRA_WORKERS", "")
    monkeypatch.setenv("FABRICDRA_METRICS_PORT", "")
    args = build_parser(["controller"]).parse_args(["controller"])
    assert (args.workers, args.metrics_port) == (4, 0)


def test_component_logs_are_json_lines_with_level_and_time(tmp_path: Path) -> None:
    """The IMEX daemon (standard-library loggers: its own, the informer's, urllib3's) against
    an API server that is not there: each line it writes is one JSON object."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricdra.cli",
            "imex-daemon",
            f"--kubeconfig={kubeconfig}",
            "--node-name=n",
            "--domain-name=d",
            "--domain-namespace=ns",
            "--domain-uid=u",
            f"--config-dir={tmp_path / 'imexd'}",
            "--imex-bin=/bin/true",
            "--imex-ctl=/bin/false",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        first = proc.stderr.readline()  # blocks until the daemon has logged something
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
    lines = [first, *rest.splitlines()]
    assert first
    loggers = set()
    for line in lines:
        record = json.loads(line)
        assert record["level"] in ("debug", "info", "warning", "error", "critical"), line
        assert record["timestamp"].endswith("Z"), line
        assert record["event"], line
        loggers.add(record.get("logger"))
    assert loggers & {"fabricdra.informer", "urllib3"}


def test_stdlib_exception_is_one_json_line(tmp_path: Path) -> None:
    code = (
        "import logging\n"
        "from fabricdra.cli import logs\n"
        "logs.configure('info')\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    logging.getLogger('fabricdra.controller').exception('reconcile %s failed', 'a/b')\n"
        "logging.getLogger('fabricdra.controller').debug('below the level')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    (line,) = result.stderr.splitlines()
    record = json.loads(line)
    assert record["event"] == "reconcile a/b failed"
    assert record["level"] == "error"
    assert record["logger"] == "fabricdra.controller"
    assert "ZeroDivisionError" in record["exception"]


STOP_IN_WAIT = """
import signal, threading
from fabricdra.cli.common import stop_event

stop = stop_event()
handler = signal.getsignal(signal.SIGINT)
# Where the signal can land: the main thread inside stop.wait(), holding the event's lock.
with stop._cond:
    handler(signal.SIGINT, None)
print("stopped" if stop.wait(10) else "not stopped")
"""


def test_a_stop_signal_during_the_wait_for_it_stops_the_command() -> None:
    """SIGINT/SIGTERM that arrives while the main thread waits on the stop event (it holds the
    event's lock there) must still stop the command, not deadlock it (`fabricdra fleet
    --watch` hung for good on the old handler, which set the event itself)."""
    done = subprocess.run(
        [sys.executable, "-c", STOP_IN_WAIT], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "stopped", done.stderr
