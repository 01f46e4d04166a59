"""Package exports imported on first use (PEP 562), for packages whose names pull in heavy modules.

Why: every sandbox child imports `forge` (and a Triton candidate's child `agent.languages`) on its way to its own
module; eager exports cost it the optimizer, pandas and the LLM client stack on every start (0.4 s of a 2.2 s start
on the CPU, `python -X importtime`).

    __getattr__, __dir__ = lazy_exports(__name__, {"KernelOptimizer": "forge.optimizer", ...})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package` for `exports` (name -> module that defines it):
    a name is imported from its module when first read, then kept in the package's namespace."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
