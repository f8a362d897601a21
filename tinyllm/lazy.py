"""Names a package exports but imports only on first use (PEP 562), so importing the package, or a
light module of it, loads no torch: the terminal app imports parts of tinyllm and must not."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The package's module-level ``__getattr__``: ``exports`` maps each name to its module."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
