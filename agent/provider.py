"""`GeneratedKernelProvider`: a kernel written by the agent, as a serialisable `forge.KernelProvider`.

It carries the kernel's source, language and entry point, the call signatures it was validated on and the
generation metadata (model, attempts, tokens, cost). `to_dict` includes the source, so a saved plan runs at deploy
time with no LLM: loading writes the source into the cache folder (content-addressed) and imports it. The source
is screened again before it is imported, so a hand-edited plan cannot smuggle in forbidden constructs.

The class declares `carries_code`: a plan or cache entry holding one must be signed (`forge.signing`), and
`candidate_code` hands its source to the judge (`forge.judging.Judge.judge_source`), so `kforge plan verify` runs it
in the sandbox before any process outside the sandbox imports it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.languages import get_language
from agent.languages.triton.launch import LaunchCacheStats, cached_launchers
from agent.screening import format_violations
from forge.atomic import write_text_atomic
from forge.env import cache_root
from forge.functional import original_function
from forge.judging.language import CandidateCode
from forge.provider import KernelProvider
from forge.samples import Sample, sample_from_json, sample_to_json, spec_sample

__all__ = ["GeneratedKernelProvider", "cached_source_file", "default_cache_dir"]

logger = logging.getLogger(__name__)

# Plans and cache entries saved before kernels named their language hold Triton kernels.
_LEGACY_LANGUAGE = "triton"


def default_cache_dir() -> Path:
    """`$KFORGE_CACHE_DIR`, else `~/.cache/kforge` (`forge.env.cache_root`)."""
    return cache_root()


def cached_source_file(source: str, language: Any, cache_dir: str | os.PathLike | None, kind: str, stem: str) -> Path:
    """`<cache>/<kind>/<stem><suffix>` holding `source` (written atomically unless it already does): the file a
    generated kernel or module is imported from, named by its content hash."""
    folder = Path(cache_dir or default_cache_dir()) / kind
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}{language.file_suffix}"
    if not path.exists() or path.read_text() != source:
        write_text_atomic(path, source)
    return path


class GeneratedKernelProvider(KernelProvider, type_name="generated_kernel"):
    """A generated kernel for one function, imported from its source on first use."""

    carries_code = True

    def __init__(
        self,
        function: str,
        source: str,
        *,
        language: str,
        entry_point: str = "kernel_function",
        signatures: list[Sample] | tuple[Sample, ...] = (),
        metadata: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        original_function(function)
        self.function = function
        self.source = source
        self.language = get_language(language).name
        self.entry_point = entry_point
        self.signatures = tuple(spec_sample(s, with_stats=False) for s in signatures)
        self.metadata = dict(metadata or {})
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._entry: Callable | None = None
        self._module_name: str | None = None
        self._lock = threading.Lock()

    @property
    def supported_function(self) -> str:
        return self.function

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def name(self) -> str:
        model = self.metadata.get("model")
        return f"generated {self.language} {self.function} [{self.source_hash[:8]}{', ' + model if model else ''}]"

    # -- loading ------------------------------------------------------------------------------------------
    def _load(self) -> Callable:
        with self._lock:
            if self._entry is not None:
                return self._entry
            language = get_language(self.language)
            violations = language.screen(self.source, self.function)
            if violations:
                raise ValueError(
                    f"generated kernel for {self.function} fails screening and will not be imported:\n"
                    + format_violations(violations)
                )
            path = cached_source_file(self.source, language, self.cache_dir, "kernels",
                                      f"{self.function}_{self.source_hash[:16]}")
            module_name = f"kforge_generated_{self.function}_{self.source_hash[:16]}"
            entry = language.load(path, module_name)
            if self.entry_point != language.entry_point:
                entry = getattr(sys.modules[module_name], self.entry_point)
            self._module_name = module_name
            self._entry = entry
            return entry

    def launch_stats(self) -> dict[str, LaunchCacheStats]:
        """Per Triton kernel of the loaded source, its cached launcher's counters (empty before loading, and under
        the Triton interpreter, where launches are not cached)."""
        module = sys.modules.get(self._module_name) if self._module_name else None
        return {name: launcher.stats() for name, launcher in cached_launchers(module).items()} if module else {}

    def load_runtime_dependencies(self) -> None:
        self._load()

    def _prepare(self, samples: list[Sample]) -> bool:
        try:
            self._load()
        except Exception as exc:
            logger.warning("generated kernel for %s cannot be loaded: %s", self.function, exc)
            return False
        if samples and not self.signatures:
            self.signatures = tuple(spec_sample(s, with_stats=False) for s in samples)
        return True

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        entry = self._entry if self._entry is not None else self._load()
        return entry(*args, **kwargs)

    def candidate_code(self) -> CandidateCode | None:
        """The source and its language, for the judge's sandbox (`kforge plan verify` runs it there before any
        process outside the sandbox imports it); None for an entry point the sandbox does not call."""
        language = get_language(self.language)
        return CandidateCode(self.source, language) if self.entry_point == language.entry_point else None

    # -- serialisation ------------------------------------------------------------------------------------
    def _to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "language": self.language,
            "entry_point": self.entry_point,
            "source": self.source,
            "source_sha256": self.source_hash,
            "signatures": [sample_to_json(s) for s in self.signatures],
            "metadata": self.metadata,
        }

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> GeneratedKernelProvider:
        source = state["source"]
        expected = state.get("source_sha256")
        if expected and hashlib.sha256(source.encode()).hexdigest() != expected:
            raise ValueError("generated kernel source does not match its recorded sha256 (the file was edited)")
        violations = get_language(state.get("language", _LEGACY_LANGUAGE)).screen(source, state["function"])
        if violations:  # refused at load (PlanLoadError), not later at apply
            raise ValueError("generated kernel fails screening: " + format_violations(violations))
        return cls(
            state["function"],
            source,
            language=state.get("language", _LEGACY_LANGUAGE),
            entry_point=state.get("entry_point", "kernel_function"),
            signatures=[sample_from_json(s) for s in state.get("signatures", [])],
            metadata=state.get("metadata") or {},
        )
