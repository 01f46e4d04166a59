"""The `torch.nn.functional` functions kernel-forge can intercept, and their original implementations.

The originals are captured when this module is first imported, so a baseline or a static provider never calls a
function that a profiler or an active plan has patched into `torch.nn.functional` (which would recurse or measure
a replacement instead of PyTorch).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch.nn.functional as F

__all__ = ["functional_names", "original_function"]

_ALLOWED_MODULES = {"torch.nn.functional", "torch", "torch._C._nn", "torch.functional", "torch._C._VariableFunctions"}


# Helpers that live in torch.nn.functional but are not ops.
_NOT_OPS = {"assert_int_or_pair", "has_torch_function", "has_torch_function_unary", "has_torch_function_variadic",
            "handle_torch_function", "boolean_dispatch"}


def _patchable(name: str, value: object) -> bool:
    if name.startswith("_") or name in _NOT_OPS:
        return False
    if not (inspect.isfunction(value) or inspect.isbuiltin(value)):
        return False
    return getattr(value, "__module__", None) in _ALLOWED_MODULES or inspect.isbuiltin(value)


_ORIGINALS: dict[str, Callable] = {
    name: value for name, value in sorted(vars(F).items()) if _patchable(name, value)
}


def functional_names() -> list[str]:
    """Public `torch.nn.functional` functions that can be intercepted and replaced, sorted."""
    return list(_ORIGINALS)


def original_function(name: str) -> Callable:
    """The unpatched `torch.nn.functional.<name>`; a clear error for names that are not replaceable functions."""
    try:
        return _ORIGINALS[name]
    except KeyError:
        raise ValueError(
            f"{name!r} is not a replaceable torch.nn.functional function; see forge.functional.functional_names()"
        ) from None
