"""The allow-listed environment of a sandbox child: what a kernel needs to run, and never a credential.

Passed through from the parent when set: `PATH`, locale (`LANG`, `LANGUAGE`, `LC_*`, `TZ`), device selection
(`CUDA_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER`, `HIP_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`), toolchain locations
(`CUDA_HOME`, `CUDA_PATH`, `LD_LIBRARY_PATH`, `CC`, `CXX`, `TRITON_PTXAS_PATH`, `TRITON_LIBCUDA_PATH`,
`TRITON_LIBDEVICE_PATH`) and `TRITON_INTERPRET`. Set: `HOME` and `TMPDIR` in the child's private scratch, `PYTHONPATH` =
the repository root then the parent's `PYTHONPATH`, `PYTHONHASHSEED=0`, `PYTHONDONTWRITEBYTECODE=1`,
`PYTHONUNBUFFERED=1`, `USER`/`LOGNAME`, one BLAS/OpenMP thread, and the kernel language's own variables
(`KernelLanguage.child_environment`: Triton's interpreter switch on CPU; CUDA's build cache and pinned toolchain).

Caches: nothing a child writes outlives it or reaches another candidate. Its compiled kernels go to its private
scratch (`scratch_folder`: a bounded tmpfs inside the boundary), so a hostile candidate cannot plant a compiled
artefact for the next candidate's verdict, as it could when children shared a writable `~/.cache/kforge-sandbox`
(Triton recompiles each candidate's kernels: they are new code anyway). What children share is only what this
process wrote and they see read-only (`KernelLanguage.shared_caches()`: CUDA binaries the parent's build pool
compiled, addressed by the hash of source and toolchain). Every child gets a Triton cache in its scratch as
`TRITON_CACHE_DIR`, whatever its language, since torch may import Triton in any child (the parent's
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

__all__ = ["PASS_THROUGH", "SCRATCH_MOUNT", "child_environment", "looks_secret", "repository_root", "scratch_folder"]

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


SCRATCH_MOUNT = Path("/kforge-scratch")  # the child's private writable tmpfs inside the boundary


def scratch_folder(isolation: Any, folder: Path) -> Path:
    """The child's private writable folder: a bounded tmpfs mounted at `SCRATCH_MOUNT` inside the boundary (nothing
    of it survives the child); without the boundary, `scratch` in the run folder (created here)."""
    from forge.sandbox.isolation import IsolationLevel

    if isolation.level is IsolationLevel.BOUNDARY:
        return SCRATCH_MOUNT
    scratch = folder / "scratch"
    scratch.mkdir(exist_ok=True)
    return scratch


def child_environment(
    scratch: Path,
    *,
    language_env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    parent_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The child's complete environment (see the module docstring). `extra_env` must not name secrets."""
    parent = dict(os.environ if parent_env is None else parent_env)
    env: dict[str, str] = {}
    for name, value in parent.items():
        if looks_secret(name):
            continue
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in PASS_THROUGH):
            env[name] = value
    env.setdefault("PATH", os.defpath)
    env.update(
        TRITON_CACHE_DIR=str(scratch / "triton"),
        USER="kforge-sandbox",
        LOGNAME="kforge-sandbox",
        HOME=str(scratch / "home"),
        TMPDIR=str(scratch / "tmp"),
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
