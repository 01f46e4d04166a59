"""The seam between kernel-forge and third-party kernel libraries: `KernelLibrary`, `LibraryFunction`, a registry.

A kernel library (FlagGems, Liger-Kernel, your own) is described by data, not by a provider class of its own: its
name, the module to import, how to install it, and for each `torch.nn.functional` name an adapter that maps F's
signature onto the library's call plus a `supports` check that says which calls the adapter can serve. One
provider class (`forge.providers.libraries.provider.LibraryKernelProvider`) then serves every registered library
through the same oracle, and a plan names only `(library, function)`.

Libraries are optional: nothing here imports them. `KernelLibrary.load()` imports the module on first use and
caches the outcome; a missing or broken library is a `LibraryUnavailable` (a `ValueError`) whose one-line message
names the library, the reason and the extra to install, never an ImportError traceback. FlagGems, for one, raises
a RuntimeError at import on a machine without a GPU ("No device were detected"), so every exception at import
counts as "unavailable".
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from forge.errors import KernelForgeError
from forge.functional import original_function
from forge.samples import Sample

__all__ = [
    "KernelLibrary",
    "LibraryFunction",
    "LibraryUnavailable",
    "get_library",
    "kernel_libraries",
    "register_library",
]

logger = logging.getLogger(__name__)

# Given the bound arguments of one F call (names as in F's signature, defaults applied): None when the adapter
# can serve it, else the reason it cannot (logged when a provider refuses a sample).
SupportsCheck = Callable[[Mapping[str, Any]], "str | None"]


def _serves_everything(arguments: Mapping[str, Any]) -> str | None:
    return None


class LibraryUnavailable(KernelForgeError, ValueError):
    """A kernel library that cannot be used here; the message is one line and names the extra to install."""


@dataclass(frozen=True)
class LibraryFunction:
    """How one library serves `torch.nn.functional.<function>`.

    `build(module)` gets the imported library module and returns a callable with F's exact signature (same
    parameter names and defaults), so the runtime calls it like the original. `supports(arguments)` gets the bound
    arguments of one call and returns None when the adapter serves it, else a short reason.
    """

    function: str
    build: Callable[[ModuleType], Callable[..., Any]]
    supports: SupportsCheck = _serves_everything

    def __post_init__(self) -> None:
        original_function(self.function)  # a clear ValueError for names that are not F functions


@dataclass(frozen=True)
class KernelLibrary:
    """A kernel library as a source of F replacements (see the module docstring).

    `name` is the registry and plan key (`"flaggems"`); `title` is for people (`"FlagGems"`); `module` is the
    import name (`"flag_gems"`); `install_hint` says how to get it (`pip install -e ".[flaggems]"`).
    `default_functions` are the functions `default_providers` offers (those measured to beat eager somewhere;
    `library_providers` offers all of them). `device_types` are the torch device types the library runs on.
    """

    name: str
    title: str
    module: str
    install_hint: str
    functions: tuple[LibraryFunction, ...]
    default_functions: tuple[str, ...] = ()
    device_types: frozenset[str] = frozenset({"cuda"})
    _by_function: dict[str, LibraryFunction] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.lower() or not self.name.replace("_", "").isalnum():
            raise ValueError(f"a kernel library name must be a lower-case identifier, got {self.name!r}")
        by_function = {f.function: f for f in self.functions}
        if len(by_function) != len(self.functions):
            raise ValueError(f"kernel library {self.name!r} lists a function twice")
        unknown = sorted(set(self.default_functions) - set(by_function))
        if unknown:
            raise ValueError(f"kernel library {self.name!r}: default functions {unknown} have no adapter")
        object.__setattr__(self, "device_types", frozenset(self.device_types))
        object.__setattr__(self, "_by_function", by_function)

    @property
    def function_names(self) -> tuple[str, ...]:
        return tuple(self._by_function)

    def adapter(self, function: str) -> LibraryFunction:
        """The adapter for `function`; a ValueError naming the functions this library serves otherwise."""
        found = self._by_function.get(function)
        if found is None:
            raise ValueError(f"{self.title} has no adapter for F.{function} (it serves: "
                             f"{', '.join(self.function_names) or 'nothing'})")
        return found

    def runs_on(self, device_type: str) -> bool:
        return device_type in self.device_types

    def is_installed(self) -> bool:
        """Whether the module can be found (no import, so cheap and without side effects)."""
        try:  # the top-level package only: finding a dotted name would import its parents
            return importlib.util.find_spec(self.module.partition(".")[0]) is not None
        except (ImportError, ValueError):
            return False

    def load(self) -> ModuleType:
        """The imported library module (imported once per process); `LibraryUnavailable` when it cannot be."""
        return _load(self)

    def unavailable_reason(self) -> str | None:
        """None when `load()` works, else its one-line message."""
        try:
            self.load()
        except LibraryUnavailable as exc:
            return str(exc)
        return None


# -- loading ------------------------------------------------------------------------------------------------
_LOADED: dict[tuple[str, str], ModuleType | str] = {}  # (library name, module) -> module, or the failure message
_LOAD_LOCK = threading.Lock()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0].strip() if text else ''}".rstrip(": ")


def _load(library: KernelLibrary) -> ModuleType:
    key = (library.name, library.module)
    with _LOAD_LOCK:
        outcome = _LOADED.get(key)
        if outcome is None:
            outcome = _import(library)
            _LOADED[key] = outcome
    if isinstance(outcome, str):
        raise LibraryUnavailable(outcome)
    return outcome


def _import(library: KernelLibrary) -> ModuleType | str:
    if not library.is_installed():
        return f"{library.title} is not installed (no module {library.module!r}); install it with " \
               f"{library.install_hint}"
    try:
        return importlib.import_module(library.module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable here", said in one line
        logger.debug("importing %s failed", library.module, exc_info=True)
        return f"{library.title} cannot be imported here ({_first_line(exc)}); it needs {library.install_hint} " \
               "and a supported GPU"


def forget_loaded(name: str | None = None) -> None:
    """Drop cached import outcomes (all, or one library's), e.g. after installing a library in a running process."""
    with _LOAD_LOCK:
        for key in [k for k in _LOADED if name is None or k[0] == name]:
            del _LOADED[key]


# -- call binding ---------------------------------------------------------------------------------------------
def bind_arguments(adapter: Callable[..., Any], sample: Sample) -> dict[str, Any]:
    """The sample's arguments bound to the adapter's (= F's) parameter names, defaults applied; TypeError if the
    call does not fit the signature."""
    bound = inspect.signature(adapter).bind(*sample.args, **sample.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


# -- registry -------------------------------------------------------------------------------------------------
_LIBRARIES: dict[str, KernelLibrary] = {}


def register_library(library: KernelLibrary, *, replace: bool = False) -> KernelLibrary:
    """Make `library` known to `library_providers`, `default_providers` and plan loading; returns it.

    A second library under an existing name is an error unless `replace=True` (or it is equal to the first).
    """
    if not isinstance(library, KernelLibrary):
        raise TypeError(f"register_library needs a KernelLibrary, got {type(library).__name__}")
    existing = _LIBRARIES.get(library.name)
    if existing is not None and existing != library and not replace:
        raise ValueError(f"a kernel library named {library.name!r} is already registered ({existing.title}); "
                         "pass replace=True to replace it")
    _LIBRARIES[library.name] = library
    forget_loaded(library.name)
    return library


def unregister_library(name: str) -> None:
    """Remove a library from the registry (tests; a no-op for unknown names)."""
    _LIBRARIES.pop(name, None)
    forget_loaded(name)


def kernel_libraries() -> dict[str, KernelLibrary]:
    """A copy of the registry: name -> library."""
    return dict(_LIBRARIES)


def get_library(name: str) -> KernelLibrary:
    """The registered library called `name` (case-insensitive); a ValueError listing the known ones otherwise."""
    key = str(name).strip().lower()
    found = _LIBRARIES.get(key)
    if found is None:
        known = ", ".join(sorted(_LIBRARIES)) or "none"
        raise ValueError(f"unknown kernel library {name!r} (registered: {known}); register it with "
                         "forge.providers.libraries.register_library first")
    return found
