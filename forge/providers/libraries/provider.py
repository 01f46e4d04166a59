"""`LibraryKernelProvider`: one function of one registered kernel library, as a `KernelProvider`.

It holds only `(library name, function name)`, so it serialises to `{"type": "kernel_library", "library": ...,
"function": ...}` and a plan restores it wherever the library is installed. Restoring it where the library is
missing (or cannot be imported, as FlagGems on a machine without a GPU) raises `LibraryUnavailable`, a ValueError
whose message names the extra to install; `KernelOptimizationPlan.load` reports it as a `PlanLoadError`.

`prepare(samples)` refuses (returns False, reason logged at INFO) when the library is unavailable, a sample is on a
device type the library does not run on, the adapter's `supports` check rejects a call, or one call raises; each
accepted call has then run once, so Triton kernels are compiled before the oracle times anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from forge.provider import KernelProvider
from forge.providers.libraries.base import KernelLibrary, LibraryFunction, bind_arguments, get_library
from forge.samples import Sample, clone_value, iter_tensors

__all__ = ["LibraryKernelProvider"]

logger = logging.getLogger(__name__)


class LibraryKernelProvider(KernelProvider, type_name="kernel_library"):
    """`torch.nn.functional.<function>` served by a registered kernel library (see the module docstring)."""

    def __init__(self, library: str | KernelLibrary, function: str) -> None:
        super().__init__()
        name = library.name if isinstance(library, KernelLibrary) else library
        self.library = get_library(name)
        if isinstance(library, KernelLibrary) and library is not self.library and library != self.library:
            raise ValueError(f"kernel library {library.name!r} differs from the registered one; register it first")
        self.adapter: LibraryFunction = self.library.adapter(function)
        self._fn: Callable[..., Any] | None = None

    @property
    def supported_function(self) -> str:
        return self.adapter.function

    @property
    def name(self) -> str:
        return f"{self.library.title} {self.adapter.function}"

    # -- building ---------------------------------------------------------------------------------------------
    def _build(self) -> Callable[..., Any]:
        """The adapter bound to the imported library (raises `LibraryUnavailable`)."""
        if self._fn is None:
            self._fn = self.adapter.build(self.library.load())
        return self._fn

    def load_runtime_dependencies(self) -> None:
        self._build()

    def refusal(self, sample: Sample) -> str | None:
        """Why this provider cannot serve `sample` (None when it can, as far as can be told without running it)."""
        fn = self._build()
        devices = {t.device.type for t in iter_tensors((tuple(sample.args), dict(sample.kwargs)))}
        foreign = sorted(d for d in devices if not self.library.runs_on(d))
        if foreign:
            return f"{self.library.title} does not run on {', '.join(foreign)}"
        try:
            arguments = bind_arguments(fn, sample)
        except TypeError as exc:
            return f"the call does not fit F.{self.adapter.function}'s signature: {exc}"
        return self.adapter.supports(arguments)

    # -- KernelProvider hooks ---------------------------------------------------------------------------------
    def _prepare(self, samples: list[Sample]) -> bool:
        unavailable = self.library.unavailable_reason()
        if unavailable is not None:
            logger.info("%s: %s", self.name, unavailable)
            return False
        fn = self._build()
        for index, sample in enumerate(samples):
            reason = self.refusal(sample)
            if reason is not None:
                logger.info("%s cannot serve sample %d %s: %s", self.name, index, sample.describe(), reason)
                return False
            args, kwargs = clone_value(tuple(sample.args)), clone_value(dict(sample.kwargs))
            try:
                with torch.no_grad():
                    fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a library that fails on a call is refused, not raised
                logger.info("%s failed on sample %d %s: %s", self.name, index, sample.describe(), exc)
                return False
        return True

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn if self._fn is not None else self._build()
        return fn(*args, **kwargs)

    def _to_dict(self) -> dict[str, Any]:
        return {"library": self.library.name, "function": self.adapter.function}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> LibraryKernelProvider:
        provider = cls(str(state["library"]), str(state["function"]))
        provider._build()  # LibraryUnavailable (a ValueError naming the extra) when the library is missing here
        return provider

    # -- pickling (eval workers): names travel, the library and the built callable are per process -----------
    def __getstate__(self) -> dict[str, Any]:
        return {"library": self.library.name, "function": self.adapter.function, "ready": self._ready}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["library"], state["function"])
        self._ready = bool(state["ready"])
