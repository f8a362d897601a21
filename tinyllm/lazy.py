"""Names a package exports but imports only on first use (PEP 562), so importing the package, or a
light module of it, loads no torch: the terminal app imports parts of tinyllm and must not."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(
    package: str, modules: dict[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__all__``, ``__getattr__`` and ``__dir__`` for ``modules``: each module
    and the names it exports, imported when one of them is first asked for."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return sorted(where), __getattr__, __dir__
