"""Import a Python source file as a named module (generated kernels, benchmark problem files).

Triton's `@triton.jit` needs a real file to read the kernel's source from, and dataclasses, pickling and JIT caches
look modules up by name, so the module is registered in `sys.modules` (and removed again if its import fails).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["import_source_file"]


def import_source_file(path: str | os.PathLike[str], module_name: str) -> ModuleType:
    """Execute the file at `path` as module `module_name` and return it; whatever the import raises propagates."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot create an import spec for {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module
