"""The repository's Python sources, each parsed once per test process: several unit tests check
a rule over the whole tree (status codes, imports, attributes), and parsing the tree was most of
their time. The trees are shared: callers only read them."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parsed(path: Path) -> ast.Module:
    """`path` parsed (its file name in the errors); the same object for every caller."""
    return ast.parse(path.read_text(), str(path))
