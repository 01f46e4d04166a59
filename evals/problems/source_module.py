"""Execute Python source text as a fresh module backed by a real file.

Each call writes the source to its own file in a per-process temporary folder and imports it under a new module
name, so module-level state never leaks between loads, and decorators that read their function's source
(`@triton.jit` calls `inspect.getsource`) work. The folder is removed when the process exits.
"""

from __future__ import annotations

import atexit
import itertools
import re
import shutil
import tempfile
import threading
import types
from pathlib import Path

from forge.source_files import import_source_file

__all__ = ["load_source_module"]

_lock = threading.Lock()
_counter = itertools.count()
_folder: Path | None = None


def _source_folder() -> Path:
    global _folder
    with _lock:
        if _folder is None:
            _folder = Path(tempfile.mkdtemp(prefix="kforge-evals-src-"))
            atexit.register(shutil.rmtree, _folder, ignore_errors=True)
        return _folder


def load_source_module(source: str, *, name: str = "problem") -> types.ModuleType:
    """Run `source` as a new module and return it; exceptions raised by the source propagate unchanged.

    `name` only makes the file and module names readable in tracebacks (`<name>_<n>.py`).
    """
    safe = re.sub(r"\W", "_", name).strip("_") or "problem"
    module_name = f"_kforge_eval_{safe}_{next(_counter)}"
    path = _source_folder() / f"{module_name}.py"
    path.write_text(source, encoding="utf-8")
    return import_source_file(path, module_name)
