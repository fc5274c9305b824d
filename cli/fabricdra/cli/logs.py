"""JSON logs on stderr through structlog, the same shape for every component.

structlog loggers render straight to stderr. Standard-library loggers (the controller, the
compute-domain plugin and IMEX daemon, the kubernetes client, urllib3) go through one root
handler whose structlog `ProcessorFormatter` gives their records the same JSON shape: `event`,
`level`, `timestamp`, `logger`, and `exception` when there is one.

Importing structlog costs more start-up time than anything else a short command such as
`fabricdra inventory` needs (it pulls in asyncio), so it is imported only once something logs
or imports it; the standard library's `logging` likewise (with traceback and threading, ~5 ms
of `fabricdra inventory`, which logs nothing on a healthy node). `configure` sets each up at
once if it is already imported, else when it is first imported (by `get_logger`'s loggers, or
by any module that imports it), before it is used.
"""

from __future__ import annotations

import sys
from typing import Any

# logging's own numbers for its level names (logging.getLevelName), without importing it.
_LEVELS = {"CRITICAL": 50, "FATAL": 50, "ERROR": 40, "WARN": 30, "WARNING": 30, "INFO": 20}
_LEVELS |= {"DEBUG": 10, "NOTSET": 0}
_level = _LEVELS["INFO"]


def configure(level: str = "info") -> None:
    global _level
    _level = _LEVELS.get(level.upper(), _LEVELS["INFO"])
    pending = {name for name in ("logging", "structlog") if name not in sys.modules}
    if "logging" not in pending:
        _configure_logging()
    if "structlog" not in pending:
        _configure_structlog()
    for hook in [f for f in sys.meta_path if isinstance(f, _ConfigureOnImport)]:
        sys.meta_path.remove(hook)
    if pending:
        sys.meta_path.insert(0, _ConfigureOnImport(pending))


def _configure_logging() -> None:
    import logging

    root = logging.getLogger()
    # Replace only our own handler (configure runs again for a subcommand's own level);
    # another's, such as a test runner's capture, stays.
    for handler in [h for h in root.handlers if getattr(h, "_fabricdra", False)]:
        root.removeHandler(handler)
    root.addHandler(_stderr_handler())
    root.setLevel(_level)


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
    """A meta path finder that only watches for `import logging` and `import structlog`: it
    lets the normal finders load each, then configures it before the importer gets it back."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.names:
            return None
        self.names.discard(name)
        if not self.names:
            sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenConfigure(spec.loader, name)  # type: ignore[assignment]
        return spec


class _ThenConfigure:
    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        if self.name == "logging":
            _configure_logging()
        else:
            _configure_structlog()

    def __getattr__(self, name: str) -> Any:  # is_package, get_code, ... for importlib
        return getattr(self.loader, name)


class _LazyLogger:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, method: str) -> Any:
        import structlog

        return getattr(structlog.get_logger(self._name), method)


def _stderr_handler() -> Any:
    """Our root handler: JSON lines through structlog's ProcessorFormatter (built on the first
    record), to whatever sys.stderr is when a record comes."""
    import logging

    class _JsonFormatter(logging.Formatter):
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
        _fabricdra = True

        def emit(self, record: logging.LogRecord) -> None:
            # Whoever replaced sys.stderr since (a test's capture, a daemon's redirect) gets
            # the lines, as with structlog's loggers below.
            self.stream = sys.stderr
            super().emit(record)

    handler = _StderrHandler()
    handler.setFormatter(_JsonFormatter())
    return handler


def _stderr_logger(*_args: object) -> Any:
    # Looked up per logger, not once: whoever replaced sys.stderr since (a test's capture, a
    # daemon's redirect) gets the lines, and a closed earlier stream is never written to.
    import structlog

    return structlog.PrintLogger(sys.stderr)
