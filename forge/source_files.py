"""Import a Python source file (or source text) as a named module (generated kernels, benchmark problem files).

Triton's `@triton.jit` needs a real file to read the kernel's source from, and dataclasses, pickling and JIT caches
look modules up by name, so the module is registered in `sys.modules` (and removed again if its import fails).
"""

from __future__ import annotations

import atexit
import importlib.util
import itertools
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

__all__ = ["import_source_file", "load_source_text"]


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


_text_lock = threading.Lock()
_text_counter = itertools.count()
_text_folder: Path | None = None


def _source_text_folder() -> Path:
    global _text_folder
    with _text_lock:
        if _text_folder is None:
            _text_folder = Path(tempfile.mkdtemp(prefix="kforge-src-"))
            atexit.register(shutil.rmtree, _text_folder, ignore_errors=True)
        return _text_folder


def load_source_text(source: str, *, name: str = "problem") -> ModuleType:
    """Run `source` as a new module backed by its own file and return it; exceptions propagate unchanged.

    Each call writes the text to its own file in a per-process temporary folder (removed at exit) and imports it
    under a new module name, so module-level state never leaks between loads and decorators that read their
    function's source (`@triton.jit` calls `inspect.getsource`) work. `name` only makes file and module names
    readable in tracebacks (`<name>_<n>.py`)."""
    safe = re.sub(r"\W", "_", name).strip("_") or "problem"
    module_name = f"_kforge_src_{safe}_{next(_text_counter)}"
    path = _source_text_folder() / f"{module_name}.py"
    path.write_text(source, encoding="utf-8")
    return import_source_file(path, module_name)
