"""JSON logs on stderr through structlog, the same shape for every component.

structlog loggers render straight to stderr. Standard-library loggers (the controller, the
compute-domain plugin and IMEX daemon, the kubernetes client, urllib3) go through one root
handler whose structlog `ProcessorFormatter` gives their records the same JSON shape: `event`,
`level`, `timestamp`, `logger`, and `exception` when there is one.

Importing structlog costs more start-up time than anything else a short command such as
`fabricdra inventory` needs (it pulls in asyncio), so it is imported only once something logs
or imports it: `configure` sets up the standard library at once and structlog when it is first
imported (by `get_logger`'s loggers, or by any module that imports it), before it is used.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

_level = logging.INFO


def configure(level: str = "info") -> None:
    global _level
    numeric = logging.getLevelName(level.upper())
    _level = numeric if isinstance(numeric, int) else logging.INFO
    root = logging.getLogger()
    # Replace only our own handler (configure runs again for a subcommand's own level);
    # another's, such as a test runner's capture, stays.
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_JsonFormatter())
    root.addHandler(handler)
    root.setLevel(_level)
    if "structlog" in sys.modules:
        _configure_structlog()
    elif not any(isinstance(f, _ConfigureOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ConfigureOnImport())


def get_logger(name: str) -> Any:
    """A structlog logger that imports structlog only when it first logs."""
    return _LazyLogger(name)


def _configure_structlog() -> None:
    import structlog

    structlog.configure(
        processors=[
            *_shared(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_level),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _shared() -> list[Any]:
    """What every line gets, whichever logging API wrote it."""
    import structlog

    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


class _ConfigureOnImport:
    """A meta path finder that only watches for `import structlog`: it lets the normal
    finders load it, then configures it before the importer gets it back."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "structlog":
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec

        spec = find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenConfigure(spec.loader)  # type: ignore[assignment]
        return spec


class _ThenConfigure:
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _configure_structlog()

    def __getattr__(self, name: str) -> Any:  # is_package, get_code, ... for importlib
        return getattr(self.loader, name)


class _LazyLogger:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, method: str) -> Any:
        import structlog

        return getattr(structlog.get_logger(self._name), method)


class _JsonFormatter(logging.Formatter):
    """structlog's ProcessorFormatter, built on the first record (see the module's doc)."""

    def __init__(self) -> None:
        super().__init__()
        self._formatter: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._formatter is None:
            import structlog

            self._formatter = structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=[*_shared(), structlog.stdlib.add_logger_name],
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer(sort_keys=True),
                ],
            )
        return self._formatter.format(record)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def emit(self, record: logging.LogRecord) -> None:
        # Whoever replaced sys.stderr since (a test's capture, a daemon's redirect) gets the
        # lines, as with structlog's loggers below.
        self.stream = sys.stderr
        super().emit(record)


def _stderr_logger(*_args: object) -> Any:
    # Looked up per logger, not once: whoever replaced sys.stderr since (a test's capture, a
    # daemon's redirect) gets the lines, and a closed earlier stream is never written to.
    import structlog

    return structlog.PrintLogger(sys.stderr)
