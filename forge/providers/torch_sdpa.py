"""`TorchSDPAProvider`: `scaled_dot_product_attention` pinned to one PyTorch SDPA backend.

PyTorch picks an SDPA backend per call by a fixed priority; pinning one (flash, memory-efficient, cuDNN or math)
can be faster for a given shape, or the only one that accepts it. `prepare` runs every sample under the backend
and refuses the provider when any sample is rejected.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from torch.nn.attention import SDPBackend, sdpa_kernel

from forge.functional import original_function
from forge.provider import KernelProvider
from forge.samples import Sample, clone_value

__all__ = ["SDPA_BACKENDS", "TorchSDPAProvider", "default_sdpa_backends", "sdpa_backend_names"]

logger = logging.getLogger(__name__)

# The one table of SDPA backend names; every other list is derived from it (`default_sdpa_backends` for
# `default_providers`, the eval sources `sdpa-<name>` and so `kforge eval --source`). Its order is the order
# `evals.sources.SDPASource()` (no backend given) tries them in: the first that accepts every call wins.
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# Other spellings accepted for the same backends (PyTorch's enum names, lower-case).
_ALIASES = {
    **SDPA_BACKENDS,
    "flash_attention": SDPBackend.FLASH_ATTENTION,
    "efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
    "mem_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn_attention": SDPBackend.CUDNN_ATTENTION,
}


def sdpa_backend_names() -> tuple[str, ...]:
    """The backend names of `SDPA_BACKENDS`, in its order (cudnn, flash, efficient, math)."""
    return tuple(SDPA_BACKENDS)


def default_sdpa_backends() -> tuple[str, ...]:
    """The backends `default_providers` offers on CUDA: the fused ones of `SDPA_BACKENDS`, in its order (math, the
    unfused reference path, is left out)."""
    return tuple(name for name, backend in SDPA_BACKENDS.items() if backend is not SDPBackend.MATH)


def _resolve_backend(backend: SDPBackend | str) -> SDPBackend:
    if isinstance(backend, SDPBackend):
        return backend
    if isinstance(backend, str):
        key = backend.strip().lower()
        if key in _ALIASES:
            return _ALIASES[key]
        member = getattr(SDPBackend, backend.strip().upper(), None)
        if isinstance(member, SDPBackend):
            return member
    choices = ", ".join(sorted(SDPA_BACKENDS))
    raise ValueError(f"unknown SDPA backend {backend!r}; use an SDPBackend member or one of: {choices}")


class TorchSDPAProvider(KernelProvider, type_name="torch_sdpa"):
    """`F.scaled_dot_product_attention` run under `sdpa_kernel(backend)`."""

    def __init__(self, backend: SDPBackend | str = SDPBackend.FLASH_ATTENTION) -> None:
        super().__init__()
        self.backend = _resolve_backend(backend)
        self._sdpa = original_function("scaled_dot_product_attention")

    @property
    def supported_function(self) -> str:
        return "scaled_dot_product_attention"

    @property
    def name(self) -> str:
        return f"PyTorch SDPA {self.backend.name}"

    def _prepare(self, samples: list[Sample]) -> bool:
        for index, sample in enumerate(samples):
            args, kwargs = clone_value(tuple(sample.args)), clone_value(dict(sample.kwargs))
            try:
                with warnings.catch_warnings(), sdpa_kernel([self.backend]):
                    warnings.simplefilter("ignore", UserWarning)  # PyTorch explains each refusal as a warning
                    self._sdpa(*args, **kwargs)
            except Exception as exc:  # the backend rejects this shape/dtype/mask
                logger.info("%s cannot run sample %d %s: %s", self.name, index, sample.describe(), exc)
                return False
        return True

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        with sdpa_kernel([self.backend]):
            return self._sdpa(*args, **kwargs)

    def _to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend.name}

    @classmethod
    def _from_dict(cls, state: dict[str, Any]) -> TorchSDPAProvider:
        return cls(state["backend"])
