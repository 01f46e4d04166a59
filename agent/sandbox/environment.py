"""The allow-listed environment of a sandbox child: what a kernel needs to run, and never a credential.

Passed through from the parent when set: `PATH`, locale (`LANG`, `LANGUAGE`, `LC_*`, `TZ`), device selection
(`CUDA_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER`, `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`), toolchain locations
(`CUDA_HOME`, `CUDA_PATH`, `LD_LIBRARY_PATH`, `CC`, `CXX`, `TRITON_PTXAS_PATH`, `TRITON_LIBCUDA_PATH`,
`TRITON_LIBDEVICE_PATH`) and `TRITON_INTERPRET`. Set: `HOME` and `TMPDIR` inside the run folder, `PYTHONPATH` =
the repository root then the parent's `PYTHONPATH`, `PYTHONHASHSEED=0`, `PYTHONDONTWRITEBYTECODE=1`,
`PYTHONUNBUFFERED=1`, `USER`/`LOGNAME`, one BLAS/OpenMP thread, and the kernel language's own variables
(`KernelLanguage.child_environment`: Triton's interpreter switch on CPU; CUDA's build cache and pinned toolchain).

Caches (`sandbox_caches`): each language keeps its compiled kernels in a persistent folder only sandbox children
use (`KernelLanguage.sandbox_cache_dir()`: `isolation.sandbox_cache_dir() / "triton"`, `/ "cuda"`), writable inside
the boundary, so builds are reused between children (and CUDA children load the cubins the parent's build pool
compiled) but a child can never plant a compiled kernel in a cache the parent loads from. Every child gets the
Triton one as `TRITON_CACHE_DIR`, whatever its language, since torch may import Triton in any child (the parent's
`TRITON_CACHE_DIR`, `TRITON_HOME` and `TORCHINDUCTOR_CACHE_DIR` are not passed).
Any name that looks like a secret (`KEY`, `TOKEN`, `SECRET`, `PASSWORD`, `CREDENTIAL`, `AUTH`) is never passed.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["PASS_THROUGH", "child_environment", "looks_secret", "repository_root", "sandbox_caches"]

PASS_THROUGH: tuple[str, ...] = (
    "PATH", "LANG", "LANGUAGE", "LC_*", "TZ",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CC", "CXX",
    "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TRITON_LIBDEVICE_PATH",
    "TRITON_INTERPRET",
)

_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    """Whether an environment variable name suggests a credential."""
    return bool(_SECRET.search(name))


def repository_root() -> Path:
    """The folder that holds the `agent` and `forge` packages (the child's `PYTHONPATH`)."""
    return Path(__file__).resolve().parents[2]


def _python_path(parent_env: Mapping[str, str] | None) -> list[str]:
    """The repository root first, then the parent's own `PYTHONPATH` entries (where its packages may live)."""
    source = parent_env if parent_env is not None else os.environ
    entries = [str(repository_root())]
    for entry in source.get("PYTHONPATH", "").split(os.pathsep):
        if entry and entry not in entries:
            entries.append(entry)
    return entries


def sandbox_caches(language: Any = None) -> list[Path]:
    """The persistent cache folders a sandbox child of `language` (a `KernelLanguage`, or None) writes, created: the
    Triton cache first (every child's `TRITON_CACHE_DIR`), then the language's own when it has another."""
    from agent.sandbox.isolation import sandbox_cache_dir

    folders = [sandbox_cache_dir() / "triton"]
    own = language.sandbox_cache_dir() if language is not None else None
    if own is not None and Path(own) not in folders:
        folders.append(Path(own))
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def child_environment(
    home: Path,
    tmp: Path,
    *,
    language_env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    parent_env: Mapping[str, str] | None = None,
    triton_cache: Path | None = None,
) -> dict[str, str]:
    """The child's complete environment (see the module docstring). `extra_env` must not name secrets."""
    parent = dict(os.environ if parent_env is None else parent_env)
    env: dict[str, str] = {}
    for name, value in parent.items():
        if looks_secret(name):
            continue
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in PASS_THROUGH):
            env[name] = value
    if triton_cache is None:
        from agent.sandbox.isolation import sandbox_cache_dir

        triton_cache = sandbox_cache_dir() / "triton"
    env.setdefault("PATH", os.defpath)
    env.update(
        TRITON_CACHE_DIR=str(triton_cache),
        USER="kforge-sandbox",
        LOGNAME="kforge-sandbox",
        HOME=str(home),
        TMPDIR=str(tmp),
        PYTHONPATH=os.pathsep.join(_python_path(parent_env)),
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        PYTHONNOUSERSITE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    env.update(language_env or {})
    for name, value in (extra_env or {}).items():
        if looks_secret(name):
            raise ValueError(f"extra_env may not pass {name!r} to a sandbox child: it looks like a credential")
        env[name] = str(value)
    return env
