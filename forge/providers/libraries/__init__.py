"""Kernel libraries (FlagGems, Liger-Kernel, your own) as static providers, through one seam.

    from forge.providers.libraries import library_providers
    providers = library_providers("cuda", ["flaggems", "liger"])     # LibraryUnavailable if one is missing

A library is a `KernelLibrary` (name, module, install hint, F adapters with `supports` checks) in a registry
(`register_library`); every function of every library is served by one provider class, `LibraryKernelProvider`,
which the optimizer validates and times like any other candidate, so a library is picked only where it proves
correct and faster. Nothing here imports a library until a provider is prepared or restored. See `base.py` for
the seam, `flaggems.py` and `liger.py` for the adapters and their measured speed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch

from forge.providers.libraries.base import (
    KernelLibrary,
    LibraryFunction,
    LibraryUnavailable,
    forget_loaded,
    get_library,
    kernel_libraries,
    register_library,
    unregister_library,
)
from forge.providers.libraries.flaggems import FLAGGEMS
from forge.providers.libraries.liger import LIGER
from forge.providers.libraries.provider import LibraryKernelProvider

__all__ = [
    "FLAGGEMS",
    "LIGER",
    "KernelLibrary",
    "LibraryFunction",
    "LibraryKernelProvider",
    "LibraryUnavailable",
    "forget_loaded",
    "get_library",
    "installed_library_providers",
    "kernel_libraries",
    "library_providers",
    "register_library",
    "unregister_library",
]

logger = logging.getLogger(__name__)

register_library(FLAGGEMS)
register_library(LIGER)


def library_providers(device: str | torch.device, names: Iterable[str],
                      functions: Sequence[str] | None = None) -> list[LibraryKernelProvider]:
    """One provider per function of each named library (or only `functions`, where the library has them).

    Raises `LibraryUnavailable` (one line, naming the extra to install) when a named library cannot be imported,
    and a ValueError when it does not run on `device` or is not registered.
    """
    device_type = torch.device(device).type
    providers: list[LibraryKernelProvider] = []
    for name in names:
        library = get_library(name)
        if not library.runs_on(device_type):
            raise ValueError(f"{library.title} does not run on {device_type} (it runs on "
                             f"{', '.join(sorted(library.device_types))})")
        library.load()
        chosen = library.function_names if functions is None else [f for f in functions if f in library.function_names]
        providers += [LibraryKernelProvider(library.name, f) for f in chosen]
    return providers


def installed_library_providers(device: str | torch.device) -> list[LibraryKernelProvider]:
    """The `default_functions` of every registered library that runs on `device` and imports here; libraries
    that are missing are skipped (logged at DEBUG)."""
    device_type = torch.device(device).type
    providers: list[LibraryKernelProvider] = []
    for library in kernel_libraries().values():
        if not library.runs_on(device_type) or not library.is_installed():
            continue
        reason = library.unavailable_reason()
        if reason is not None:
            logger.debug("skipping kernel library %s: %s", library.name, reason)
            continue
        providers += [LibraryKernelProvider(library.name, f) for f in library.default_functions]
    return providers
