"""On-disk cache of validated generated kernels, so a second `make_plan` on the same model needs no LLM call.

Key: the function and every call signature, the GPU (name and compute capability, or the CPU interpreter), the
torch and triton versions, the model with its generation parameters, and the hash of the prompt templates in use.
Any change to one of those is a miss. Entries are JSON files written atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from agent.provider import GeneratedKernelProvider
from forge.atomic import write_json_atomic

__all__ = ["KernelCache", "cache_key"]

logger = logging.getLogger(__name__)


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:  # pragma: no cover - triton is a dependency
        return None


def cache_key(*, task_key: str, model_fingerprint: str, template_hash: str, language: str) -> str:
    """sha256 over everything that makes a cached kernel reusable (see the module docstring)."""
    payload = {
        "task": task_key,
        "model": model_fingerprint,
        "templates": template_hash,
        "language": language,
        "torch": torch.__version__,
        "triton": _triton_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class KernelCache:
    """`get(key)` -> a ready `GeneratedKernelProvider` or None; `put(key, provider, info)` stores one."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory) / "validated"

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> tuple[GeneratedKernelProvider, dict[str, Any]] | None:
        path = self._path(key)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            provider = GeneratedKernelProvider.from_dict(data["provider"])
        except Exception as exc:
            logger.warning("ignoring unreadable kernel cache entry %s: %s", path, exc)
            return None
        return provider, dict(data.get("info") or {})

    def put(self, key: str, provider: GeneratedKernelProvider, info: dict[str, Any] | None = None) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(key)
        return write_json_atomic(path, {"provider": provider.to_dict(), "info": info or {}}, indent=1)
