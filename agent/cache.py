"""On-disk cache of validated generated kernels, so a second `make_plan` on the same model needs no LLM call.

Key: the function and every call signature, the GPU (name and compute capability, or the CPU interpreter), the
torch version and the language's toolchain (`KernelLanguage.toolchain_key`: Triton's version, or CUDA's compiler,
version and arch), the model with its generation parameters, and the hash of the prompt templates in use.
Any change to one of those is a miss. Entries are JSON files written atomically.

Entries carry generated source that is imported on a hit, so they are signed (`forge.signing`, the user's key; one
is created in the key file, mode 0600, on the first `put` when none is configured). The signature covers the whole
entry (provider state with source, entry point, signatures and metadata, the info, and the cache key it was stored
under, so a validly signed entry copied to another key's file is refused too). `get` checks it before anything
is built: an unsigned, mis-signed or foreign entry is logged and treated as a miss, never screened or imported.
A signed entry is still screened again when it is built and again before import (`GeneratedKernelProvider`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from agent.languages import get_language
from agent.provider import GeneratedKernelProvider
from forge.atomic import write_json_atomic
from forge.signing import check_document, load_key, sign_document

__all__ = ["KernelCache", "cache_key"]

logger = logging.getLogger(__name__)


def cache_key(*, task_key: str, model_fingerprint: str, template_hash: str, language: str) -> str:
    """sha256 over everything that makes a cached kernel reusable (see the module docstring)."""
    payload = {
        "task": task_key,
        "model": model_fingerprint,
        "templates": template_hash,
        "language": language,
        "torch": torch.__version__,
        "toolchain": get_language(language).toolchain_key(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class KernelCache:
    """`get(key)` -> a ready `GeneratedKernelProvider` or None; `put(key, provider, info)` stores one."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory) / "validated"

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> tuple[GeneratedKernelProvider, dict[str, Any]] | None:
        """The entry stored under `key` when it is validly signed here and screens clean; None (a miss) otherwise."""
        path = self._path(key)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            check = check_document(data, load_key())
            if not check.valid:
                logger.warning("ignoring kernel cache entry %s (treated as a miss; nothing was imported): %s",
                               path, check.describe())
                return None
            if data.get("key") != key:
                logger.warning("ignoring kernel cache entry %s: it was stored under another key", path)
                return None
            provider = GeneratedKernelProvider.from_dict(data["provider"])  # screens the source; imports nothing
        except Exception as exc:
            logger.warning("ignoring unreadable kernel cache entry %s: %s", path, exc)
            return None
        return provider, dict(data.get("info") or {})

    def put(self, key: str, provider: GeneratedKernelProvider, info: dict[str, Any] | None = None) -> Path:
        """Store a signed entry (creating the signing key file when none is configured)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(key)
        document = sign_document({"key": key, "provider": provider.to_dict(), "info": info or {}},
                                 load_key(create=True))
        return write_json_atomic(path, document, indent=1)
