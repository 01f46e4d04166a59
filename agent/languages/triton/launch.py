"""Cheap launches of generated Triton kernels: a per-kernel cache from a call's cheap key to its compiled kernel.

WHY. A generated file launches its kernels with `kernel[grid](...)`, which goes through `JITFunction.run` on every
call: the argument binder, the specialisation of every argument, the compile-cache key, the launch-metadata dict and
two calls of Triton's (empty) launch hook chains. Measured on the H200 host (triton 3.6, torch 2.11,
`benchmarks/launch_overhead.py`): `kernel[grid](...)` 20.6 us of host time per launch, the compiled kernel's launcher
alone 5.3 us, ATen's whole `F.silu` 9.8 us; so a generated elementwise kernel that wins on device time loses inside a
model (BENCHMARKS.md section 3c: two kernels that won by 3-4 % in isolation made the demo 19 % slower).

The hot path is straight-line code compiled per call layout (`_compile_keyer`, `_compile_packer`): the first
version, a generic loop, cut the H200 launch only to 16.9 us; with a JIT stubbed to a no-op launcher on the CI
machine (triton 3.9) the JIT path costs ~7-8.6 us, the loop version ~7.6 us and the straight-line version ~4.4-5.7 us,
of which ~1 us is Triton's own `__getitem__` lambda.

WHAT. `install_cached_launchers(module)` replaces `run` on every `@triton.jit` function the module defines (also those
wrapped by `triton.autotune` / `triton.heuristics`, which call `self.fn.run`). A call whose key was seen before goes
straight to the cached `CompiledKernel`'s launcher (`compiled.run(...)`, the same entry `JITFunction.run` ends in,
identical in triton 3.6 through 3.9), with no launch hooks (they are checked to be empty). A miss goes through the
normal JIT path, which compiles or finds the kernel, launches it, and the result fills the cache.

The key is deliberately finer than Triton's specialisation, so a hit can never pick a kernel Triton would not have
picked: the call's layout (positional count, keyword names), per tensor its dtype and whether `data_ptr` is 16-byte
aligned, every scalar's exact type and value (Triton specialises ints on ==1, %16 and the 32/64-bit range; the exact
value covers all of these), every keyword option (`num_warps`, constexprs...), the current device and the compile
knobs the JIT folds into its options (`debug`, `instrumentation_mode`, ...). Anything else (tuples, tensor
descriptors, objects that merely have `data_ptr`) bypasses the cache and takes the normal path, as do warm-up
calls, kernels with pre-run hooks, and launches while a launch hook is registered (profilers such as proton keep
working). On a hit the JIT's guard against changed global variables is re-checked, as `JITFunction.run` does.
Under `TRITON_INTERPRET=1` `triton.jit` makes `InterpretedFunction`s, which are left untouched.

The run-time launch check (`forge.checking.launch_check`) counts a hit as one launch of the kernel (the hooks of
`agent.languages.triton.hooks` count the JIT path, which hits skip); outside a watch this costs one attribute read
(~40 ns on the CI machine).
"""

from __future__ import annotations

import logging
import types
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from forge.checking.launch_check import WATCH
from forge.env import env_flag

__all__ = [
    "CachedLauncher",
    "LaunchCacheStats",
    "TritonRuntimeHooks",
    "cached_launchers",
    "install_cached_launchers",
    "launch_cache_enabled",
    "refresh_slow_paths",
    "remove_cached_launchers",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 256
CACHE_ENV = "KFORGE_TRITON_LAUNCH_CACHE"
_MAX_KEYERS = 16
_SCALAR_TYPES = frozenset({int, float, bool, str, type(None), torch.dtype})
_TENSOR = torch.Tensor
_MISSING = object()
# Compile knobs `JITFunction.run` folds into the options of every launch (3.6: debug, instrumentation_mode;
# 3.9 adds fpsan_homomorphic_casts). Those the installed Triton lacks are skipped.
_KNOB_OPTIONS = (("runtime", "debug"), ("compilation", "instrumentation_mode"),
                 ("compilation", "fpsan_homomorphic_casts"))


@dataclass(frozen=True)
class LaunchCacheStats:
    """Counters of one kernel's cached launcher: `hits` used the cached launcher, `misses` went through the JIT
    and filled the cache, `bypasses` went through the JIT without a cache look-up (see the module docstring)."""

    hits: int
    misses: int
    bypasses: int
    entries: int


class TritonRuntimeHooks:
    """What a cached launch reads from Triton's runtime each call: whether a launch hook or a stage-inspection hook is
    active, the current device and the compile knobs that enter the key (`state`), and the current stream. Tests
    substitute their own."""

    def __init__(self, current_device: Callable[[], int] | None = None) -> None:
        from triton import knobs
        from triton.runtime import driver

        self._knobs = knobs
        self._driver = driver
        self._device: Callable[[], int] | None = current_device  # default: the active driver's, on first use
        self._stream: Callable[[int], int] | None = None
        self._knob_reads = tuple(
            (getattr(knobs, group), name) for group, name in _KNOB_OPTIONS
            if hasattr(knobs, group) and _declares(getattr(knobs, group), name)
        )
        self._hook_chain = getattr(knobs, "HookChain", None)
        self._has_stages_hook = _declares(knobs.runtime, "add_stages_inspection_hook")

    def stream(self, device: int) -> int:
        if self._stream is None:
            self._stream = self._driver.active.get_current_stream
        return self._stream(device)

    def state(self) -> tuple[Any, ...] | None:
        """`(device, compile knobs...)` for the key, or None while a launch or stage-inspection hook is active.
        Hot path: inlined checks (a launch hook is idle when it is None or a `HookChain` with no calls; triton >= 3.5
        always sets an empty chain)."""
        runtime = self._knobs.runtime
        chain = self._hook_chain
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if ((enter is not None and (type(enter) is not chain or enter.calls))
                or (leave is not None and (type(leave) is not chain or leave.calls))
                or (self._has_stages_hook and runtime.add_stages_inspection_hook is not None)):
            return None
        device = self._device
        if device is None:
            device = self._device = self._driver.active.get_current_device
        return (device(), *[getattr(group, name) for group, name in self._knob_reads])


def _declares(group: Any, name: str) -> bool:
    """Whether a knobs group's class declares `name` (`hasattr` on the class would run env descriptors)."""
    return any(name in vars(klass) for klass in type(group).__mro__)


@dataclass(frozen=True)
class _Entry:
    """One cached kernel: its launcher pieces and how to build the launcher's full argument tuple from a call."""

    kernel: Any  # the CompiledKernel, returned like `JITFunction.run` returns it
    launch: Any  # CompiledKernel.run: the driver's launcher object
    function: Any
    packed_metadata: Any
    pack: Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]  # call -> every parameter, in order


class CachedLauncher:
    """Stands in for `jit_fn.run` (the signature `run(*args, grid, warmup, **kwargs)` is Triton's own)."""

    def __init__(self, jit_fn: Any, *, runtime: TritonRuntimeHooks | None = None,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.jit_fn = jit_fn
        self.slow_run: Callable[..., Any] = jit_fn.run
        self.max_entries = max_entries
        self._runtime = runtime
        self._params = tuple((p.name, p.default if p.has_default else _MISSING) for p in jit_fn.params)
        self._names = tuple(name for name, _ in self._params)
        self._entries: dict[tuple[Any, ...], _Entry] = {}
        self._keyers: dict[tuple[Any, ...], Callable[..., tuple[Any, ...] | None]] = {}
        self._hits = self._misses = self._bypasses = 0
        self._full_logged = False
        self._label = _name(jit_fn)
        _LAUNCHERS.add(self)

    def stats(self) -> LaunchCacheStats:
        return LaunchCacheStats(self._hits, self._misses, self._bypasses, len(self._entries))

    def clear(self) -> None:
        self._entries.clear()
        self._keyers.clear()

    def __repr__(self) -> str:
        return f"CachedLauncher({_name(self.jit_fn)!r}, {self.stats()})"

    def __call__(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        runtime = self._runtime
        if runtime is None:
            runtime = self._runtime = TritonRuntimeHooks()
        state = runtime.state()  # (device, compile knobs), or None while a launch hook is active
        if warmup or state is None or self.jit_fn.pre_run_hooks:
            self._bypasses += 1
            return self.slow_run(*args, grid=grid, warmup=warmup, **kwargs)
        keyer = self._keyers.get((len(args), tuple(kwargs)))
        key = keyer(state, args, kwargs) if keyer is not None else None
        if key is None:
            key = _key(state, args, kwargs)
        entry = self._entries.get(key) if key is not None else None
        if entry is None or (self.jit_fn.used_global_vals and not self._globals_unchanged()):
            return self._miss(key, args, kwargs, grid)
        self._hits += 1
        if WATCH.record is not None and not WATCH.depth:  # the launch check (hits bypass the hooked JIT path)
            WATCH.record.note_launch(self._label)
        launch_args = entry.pack(args, kwargs)
        if callable(grid):
            grid = grid(dict(zip(self._names, launch_args, strict=True)))
        size = len(grid)
        entry.launch(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, runtime.stream(state[0]),
                     entry.function, entry.packed_metadata, None, None, None, *launch_args)
        return entry.kernel

    def _globals_unchanged(self) -> bool:
        for (name, _), (value, globals_dict) in self.jit_fn.used_global_vals.items():
            if globals_dict.get(name, _MISSING) != value:
                return False  # the JIT path raises Triton's own error
        return True

    # -- miss -----------------------------------------------------------------------------------------------
    def _miss(self, key: tuple[Any, ...] | None, args: tuple[Any, ...], kwargs: dict[str, Any], grid: Any) -> Any:
        if key is None:
            self._bypasses += 1
        else:
            self._misses += 1
        kernel = self.slow_run(*args, grid=grid, warmup=False, **kwargs)
        if key is None:
            return kernel
        entry = self._entry_for(kernel, len(args), kwargs)
        if entry is not None:
            if len(self._entries) < self.max_entries:
                self._entries[key] = entry
                layout = (len(args), tuple(kwargs))
                if layout not in self._keyers and len(self._keyers) < _MAX_KEYERS:
                    keyer = _compile_keyer(args, kwargs)
                    if keyer is not None:
                        self._keyers[layout] = keyer
            elif not self._full_logged:
                self._full_logged = True
                logger.debug("launch cache of %s is full (%d entries): further signatures use the JIT path",
                             _name(self.jit_fn), self.max_entries)
        return kernel

    def _entry_for(self, kernel: Any, nargs: int, kwargs: dict[str, Any]) -> _Entry | None:
        """The cache entry for a kernel the JIT just launched, or None when it cannot be replayed safely."""
        function = getattr(kernel, "function", None)
        packed = getattr(kernel, "packed_metadata", _MISSING)
        if function is None or packed is _MISSING or nargs > len(self._params):
            return None  # not a loaded CompiledKernel (e.g. a compile future) or a call the JIT will reject
        tail = self._params[nargs:]
        if any(name not in kwargs and default is _MISSING for name, default in tail):
            return None
        # Keywords that are not parameters are launch options (num_warps, ...): in the key, not launch arguments.
        return _Entry(kernel=kernel, launch=kernel.run, function=function, packed_metadata=packed,
                      pack=_compile_packer(tail, kwargs))


_LAUNCHERS: weakref.WeakSet[CachedLauncher] = weakref.WeakSet()


def refresh_slow_paths() -> int:
    """Re-bind the JIT fallback (`slow_run`) of every live cached launcher that still holds a `JITFunction.run` other
    than the class's current one (the launch check's hooks were installed or removed after it was made); returns
    how many. A fallback set to anything else (a test's stand-in) is left alone."""
    refreshed = 0
    for launcher in list(_LAUNCHERS):
        run, jit_fn = launcher.slow_run, launcher.jit_fn
        current = getattr(type(jit_fn), "run", None)
        if getattr(run, "__self__", None) is jit_fn and current is not None and run.__func__ is not current:
            launcher.slow_run = types.MethodType(current, jit_fn)
            refreshed += 1
    return refreshed


def _key(state: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The cheap key of a call (see the module docstring), flat: two items per value, each keyword's name before
    its two, so no two layouts collide; None when a value's specialisation cannot be told cheaply.

    Hot path (every launch): exact-type checks first, because `isinstance(x, torch.Tensor)` on a non-tensor goes
    through torch's Python-level metaclass hook (~0.5 us a value)."""
    parts: list[Any] = [state, len(args)]
    append = parts.append
    for value in args:
        kind = type(value)
        if kind is _TENSOR:
            append(value.dtype)
            append(not value.data_ptr() & 15)
        elif kind in _SCALAR_TYPES:
            append(kind)
            append(value)
        elif isinstance(value, torch.Tensor):
            append(value.dtype)
            append(not value.data_ptr() & 15)
        else:
            return None
    for name, value in kwargs.items():
        append(name)
        kind = type(value)
        if kind is _TENSOR or (kind not in _SCALAR_TYPES and isinstance(value, torch.Tensor)):
            append(value.dtype)
            append(not value.data_ptr() & 15)
        elif kind in _SCALAR_TYPES:
            append(kind)
            append(value)
        else:
            return None
    return tuple(parts)


def _compile_packer(tail: tuple[tuple[str, Any], ...], kwargs: dict[str, Any]
                    ) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]:
    """The launcher's argument tuple for one call layout: the positional arguments, then each later parameter from
    the keywords or its default (what `JITFunction.run` passes as `*bound_args.values()`), as straight-line code."""
    if not tail:
        return _positional_only
    namespace: dict[str, Any] = {}
    items = []
    for index, (name, default) in enumerate(tail):
        if name in kwargs:
            items.append(f"kwargs[{name!r}]")
        else:
            namespace[f"D{index}"] = default
            items.append(f"D{index}")
    exec(f"def pack(args, kwargs):\n    return (*args, {', '.join(items)})", namespace)  # noqa: S102 - our template
    return namespace["pack"]


def _positional_only(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    return args


def _compile_keyer(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., tuple[Any, ...] | None] | None:
    """`_key` as straight-line code for one call layout (positional count, keyword names in order) and the value
    kinds seen in `args`/`kwargs` (plain tensor, or the exact scalar type): half the cost of the generic loop
    (~1.5 vs ~3 us for 6 values on the 2-core CI machine). It returns exactly what `_key` returns, or None when a
    value's type differs (the caller then falls back to `_key`). None when some value has no cheap kind."""
    namespace: dict[str, Any] = {"T": _TENSOR}
    values = [(f"a{i}", None, value) for i, value in enumerate(args)]
    values += [(f"k{j}", name, value) for j, (name, value) in enumerate(kwargs.items())]
    checks, parts = [], ["state", str(len(args))]
    for var, name, value in values:
        if name is not None:
            parts.append(repr(name))
        kind = type(value)
        if kind is _TENSOR:
            checks.append(f"type({var}) is T")
            parts += [f"{var}.dtype", f"not {var}.data_ptr() & 15"]
        elif kind in _SCALAR_TYPES:
            namespace[f"K_{var}"] = kind
            checks.append(f"type({var}) is K_{var}")
            parts += [f"K_{var}", var]
        else:
            return None
    lines = ["def keyer(state, args, kwargs):"]
    if args:
        lines.append(f"    {', '.join(f'a{i}' for i in range(len(args)))}, = args")
    lines += [f"    k{j} = kwargs[{name!r}]" for j, name in enumerate(kwargs)]
    if checks:
        lines.append(f"    if not ({' and '.join(checks)}):")
        lines.append("        return None")
    lines.append(f"    return ({', '.join(parts)},)")
    exec("\n".join(lines), namespace)  # noqa: S102 - our own template; names enter only through repr()
    return namespace["keyer"]


def _name(jit_fn: Any) -> str:
    return getattr(getattr(jit_fn, "fn", None), "__name__", None) or repr(jit_fn)


# -- installation ---------------------------------------------------------------------------------------------
def _jit_function_class() -> type | None:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: nothing to wrap
        return None
    return JITFunction


def _jit_functions_in(module: types.ModuleType) -> Iterator[Any]:
    """The `@triton.jit` functions `module` defines, also when wrapped by autotune/heuristics (via `.fn`)."""
    jit_class = _jit_function_class()
    if jit_class is None:
        return
    seen: set[int] = set()
    for value in list(vars(module).values()):
        depth = 0
        while not isinstance(value, jit_class) and hasattr(value, "fn") and depth < 8:
            value, depth = value.fn, depth + 1
        if isinstance(value, jit_class) and id(value) not in seen and value.module == module.__name__:
            seen.add(id(value))
            yield value


def launch_cache_enabled() -> bool:
    """False when `$KFORGE_TRITON_LAUNCH_CACHE` is `0`/`false`/`off`/`no` (the escape hatch; default on; any other
    value than a flag is refused with a one-line `forge.errors.SettingError`)."""
    return env_flag(CACHE_ENV, True)


def install_cached_launchers(module: types.ModuleType, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> int:
    """Give every `@triton.jit` function defined in `module` a `CachedLauncher`; returns how many were installed
    (0 under the interpreter, where there are no JIT functions). Idempotent."""
    installed = 0
    for jit_fn in _jit_functions_in(module):
        if isinstance(vars(jit_fn).get("run"), CachedLauncher):
            continue
        jit_fn.run = CachedLauncher(jit_fn, max_entries=max_entries)
        installed += 1
    if installed:
        logger.debug("cached launchers installed on %d Triton kernel(s) of %s", installed, module.__name__)
    return installed


def cached_launchers(module: types.ModuleType) -> dict[str, CachedLauncher]:
    """The cached launchers installed in `module`, by kernel name (for stats and tests)."""
    found = {}
    for jit_fn in _jit_functions_in(module):
        launcher = vars(jit_fn).get("run")
        if isinstance(launcher, CachedLauncher):
            found[_name(jit_fn)] = launcher
    return found


def remove_cached_launchers(module: types.ModuleType) -> int:
    """Undo `install_cached_launchers`: the module's kernels launch through `JITFunction.run` again."""
    removed = 0
    for jit_fn in _jit_functions_in(module):
        if isinstance(vars(jit_fn).get("run"), CachedLauncher):
            del jit_fn.run
            removed += 1
    return removed
