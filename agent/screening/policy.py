"""What screening allows and refuses in a candidate kernel file: the documented allow-lists (and the reasons
given for the most common refusals).

The policy is an allow-list (issue 9: a deny-list was walked around through the Triton function object's capture
scope, `InterpretedFunction.rewrite()`, names never imported and `str.format`). A file may use only:

* Names it binds itself (imports, definitions, assignments, parameters) and the builtins in `SAFE_BUILTINS`; any
  other name (`os` never imported, `type`, `object`, `format`, `vars`, the `getattr` family) is refused.
* On values screening cannot type (tensors, dtypes, devices, containers...): the attributes in `HOST_ATTRIBUTES`
  (host code) or the language's device attributes (e.g. Triton's tensor methods inside `@triton.jit` code); on
  `self` in the file's own classes, any non-dunder attribute. Function internals (`get_capture_scope`, `rewrite`,
  `fn`, `src`), formatting (`format`, `format_map`) and reflection are therefore refused.
* Attribute assignment only on `self`; no string constant spelling a dunder (`d["__builtins__"]`, `"__glob" +
  "als__"`).
* From allowed pure-Python modules, the helpers in `PLAIN_MODULE_ALLOWED` ("named math helpers").

Within that, module references are judged as follows:

* Imports: only the modules in `ALLOWED_IMPORT_ROOTS` (plus a language's own, e.g. `triton`). Everything else
  (`os`, `sys`, `subprocess`, `socket`, `ctypes`, `threading`, `inspect`, `gc`, `importlib`, `time`, `pathlib`...)
  is refused with the reason in `IMPORT_CATEGORIES`.
* `torch.<name>`: only the allocation and metadata helpers in `TORCH_ALLOWED`, plus dtype, layout and
  memory-format constants (`torch.float32`, `torch.strided`, `torch.channels_last`...). Every other `torch.*` name is
  a PyTorch compute op or machinery the kernel must not use (`torch.nn.functional.*`, `torch.softmax`,
  `torch.matmul`, `torch.ops.aten.*`, `torch.compile`, `torch.cuda.Stream`, `torch.cuda.synchronize`...).
* Tensor methods (`x.softmax()`, `x.matmul(y)`, `x.relu_()`...): every public callable of `torch.Tensor` is refused
  except the view, copy, allocation and metadata methods in `TENSOR_METHODS_ALLOWED`. The `@` operator is refused
  outside device code. Plain arithmetic operators cannot be told apart from integer grid arithmetic statically and are
  allowed here; tensor arithmetic outside the kernels is refused at run time (`forge.checking.launch_check`), as is
  a wrapper that launches none of its kernels.
* Builtins that reach outside the file or run code: `BANNED_BUILTINS` (named reasons); the `getattr` family
  (`GETATTR_FAMILY`) always.
* Attributes: dunders other than `SAFE_DUNDERS`, frame attributes (`f_back`, `f_locals`...), and the tensor-hack
  attributes in `BANNED_ATTRIBUTES`.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import inspect
import types
from typing import Any

import torch

__all__ = [
    "ALLOWED_IMPORT_ROOTS",
    "BANNED_ATTRIBUTES",
    "BANNED_BUILTINS",
    "CALL_ONLY_METHODS",
    "FRAME_ATTRIBUTES",
    "GETATTR_FAMILY",
    "HOST_ATTRIBUTES",
    "IMPORT_CATEGORIES",
    "PLAIN_MODULE_ALLOWED",
    "SAFE_BUILTINS",
    "SAFE_DUNDERS",
    "SAFE_DUNDER_STRINGS",
    "TENSOR_METHODS_ALLOWED",
    "TORCH_ALLOWED",
    "forbidden_tensor_methods",
    "import_problem",
    "leaves_package",
    "lookup",
    "plain_module_problem",
    "torch_reference_problem",
]

# Pure-Python standard modules a kernel file may import (the language adds its own, e.g. `triton`).
ALLOWED_IMPORT_ROOTS: frozenset[str] = frozenset(
    {"__future__", "torch", "math", "functools", "typing", "dataclasses", "itertools", "collections", "enum",
     "numbers", "abc"}
)

# Why a module is refused; the first matching prefix wins (anything unlisted: "not on the import allow-list").
IMPORT_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("os.environ", "environment access"),
    ("os.getenv", "environment access"),
    ("os.putenv", "environment access"),
    ("os.system", "process control"),
    ("os.popen", "process control"),
    ("os.exec*", "process control"),
    ("os.spawn*", "process control"),
    ("os.fork*", "process control"),
    ("os.kill*", "process control"),
    ("os.remove", "file system writes"),
    ("os.unlink", "file system writes"),
    ("os.rmdir", "file system writes"),
    ("os", "operating-system access (processes, files, environment)"),
    ("posix", "operating-system access (processes, files, environment)"),
    ("subprocess", "process control"),
    ("pty", "process control"),
    ("signal", "signal handling"),
    ("sys", "interpreter introspection (sys._getframe, sys.modules)"),
    ("inspect", "frame introspection"),
    ("traceback", "frame introspection"),
    ("gc", "garbage-collector introspection (reaching the harness's tensors)"),
    ("importlib", "dynamic import"),
    ("builtins", "dynamic access to builtins"),
    ("runpy", "dynamic import"),
    ("pkgutil", "dynamic import"),
    ("socket", "network access"),
    ("ssl", "network access"),
    ("urllib", "network access"),
    ("http", "network access"),
    ("requests", "network access"),
    ("httpx", "network access"),
    ("aiohttp", "network access"),
    ("ftplib", "network access"),
    ("smtplib", "network access"),
    ("ctypes", "foreign-function access"),
    ("cffi", "foreign-function access"),
    ("threading", "threads (work hidden from the timer)"),
    ("_thread", "threads (work hidden from the timer)"),
    ("multiprocessing", "processes (work hidden from the timer)"),
    ("concurrent", "threads or processes (work hidden from the timer)"),
    ("asyncio", "asynchronous tasks (work hidden from the timer)"),
    ("shutil", "file system writes"),
    ("pathlib", "file system access"),
    ("io", "file access"),
    ("tempfile", "file system writes"),
    ("glob", "file system access"),
    ("time", "timing functions (the harness owns timing)"),
    ("timeit", "timing functions (the harness owns timing)"),
    ("pickle", "serialization (can run code)"),
    ("marshal", "serialization (can run code)"),
    ("types", "code-object construction"),
    ("code", "dynamic code execution"),
    ("codeop", "dynamic code execution"),
    ("weakref", "object tracking"),
    ("numpy", "host-side compute (kernels compute on the device in the kernel language)"),
)

# torch.<name> a kernel wrapper may use: allocation, metadata, device queries, autograd switches.
TORCH_ALLOWED: frozenset[str] = frozenset(
    "torch." + name
    for name in (
        # allocation
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
        "arange", "tensor", "as_tensor",
        # metadata and types
        "Tensor", "Size", "device", "dtype", "layout", "memory_format", "is_tensor", "is_floating_point",
        "is_complex", "numel", "finfo", "iinfo", "get_default_dtype", "promote_types", "result_type", "can_cast",
        "broadcast_shapes", "__version__", "version.cuda", "version.hip",
        # autograd switches
        "no_grad", "inference_mode", "is_grad_enabled", "is_inference_mode_enabled",
        # device queries
        "cuda.is_available", "cuda.device_count", "cuda.current_device", "cuda.device", "cuda.get_device_properties",
        "cuda.get_device_capability", "cuda.get_device_name",
    )
)

# torch.* prefixes with a specific reason (checked before the allow-list; first match wins).
_TORCH_CATEGORIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("torch.nn.functional",), "is a PyTorch functional op; the kernel must compute the result itself"),
    (("torch.nn",), "is a torch.nn module or function; kernels must not use PyTorch layers"),
    (("torch.ops", "torch._ops", "torch._C._nn", "torch._C._VariableFunctions", "torch._refs", "torch._prims",
      "torch._decomp"),
     "is a PyTorch operator (torch.ops / aten); kernels must not call PyTorch operators"),
    (("torch.compile", "torch.jit", "torch._dynamo", "torch._inductor", "torch.export", "torch.fx",
      "torch.library", "torch.utils.cpp_extension"),
     "is a PyTorch compiler or extension API; kernels must be written in the kernel language"),
    (("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.Event", "torch.cuda.synchronize",
      "torch.cuda.current_stream", "torch.cuda.default_stream", "torch.cuda.set_stream", "torch.cuda.StreamContext",
      "torch.cuda.ExternalStream", "torch.cuda.graph", "torch.cuda.CUDAGraph", "torch.cuda.graphs", "torch.Stream",
      "torch.Event", "torch.accelerator", "torch.cuda.streams", "torch.cuda.set_sync_debug_mode"),
     "is a CUDA stream, event, graph or synchronisation API; the harness owns streams and timing"),
    (("torch.Tensor._make_subclass", "torch._C._TensorBase", "torch._C.TensorBase", "torch.overrides"),
     "is a tensor-subclass hook (lazy or fake tensors); kernels must return plain tensors"),
    (("torch.manual_seed", "torch.set_*", "torch.use_deterministic_algorithms", "torch.backends",
      "torch.random", "torch.cuda.manual_seed", "torch.cuda.set_*", "torch.cuda.memory", "torch.cuda.empty_cache"),
     "changes global PyTorch state; kernels must not"),
)

# Tensor methods a wrapper may call: views, copies, allocation, conversions and metadata.
TENSOR_METHODS_ALLOWED: frozenset[str] = frozenset(
    """size dim ndimension numel nelement stride storage_offset data_ptr element_size is_contiguous contiguous view
    view_as reshape reshape_as flatten unflatten squeeze unsqueeze permute transpose t expand expand_as narrow select
    unbind split chunk as_strided movedim moveaxis swapaxes swapdims to cpu cuda float half bfloat16 double int long
    bool short byte char type type_as new_empty new_zeros new_ones new_full new_empty_strided new_tensor clone copy_
    zero_ fill_ detach detach_ item tolist get_device is_floating_point is_complex is_signed requires_grad_ values
    index real imag dim_order""".split()
)

# Forbidden tensor-method names that also name plain attributes elsewhere (`torch.finfo(dt).max`): refused only
# when called.
CALL_ONLY_METHODS: frozenset[str] = frozenset({"max", "min", "mode", "indices", "all", "any", "new", "put"})

BANNED_BUILTINS: dict[str, str] = {
    "eval": "dynamic code execution",
    "exec": "dynamic code execution",
    "compile": "dynamic code execution",
    "__import__": "dynamic import",
    "globals": "frame introspection",
    "locals": "frame introspection",
    "vars": "frame introspection",
    "dir": "introspection",
    "open": "file access",
    "input": "interactive input",
    "breakpoint": "debugger entry",
    "setattr": "attribute patching (monkey-patching)",
    "delattr": "attribute patching (monkey-patching)",
    "memoryview": "raw memory access",
    "exit": "interpreter exit",
    "quit": "interpreter exit",
}

# Dunder attributes and names that are harmless; every other dunder is refused.
SAFE_DUNDERS: frozenset[str] = frozenset({"__init__", "__name__", "__qualname__", "__doc__", "__version__",
                                          "__all__", "__file__", "__post_init__"})

FRAME_ATTRIBUTES: frozenset[str] = frozenset(
    {"f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame",
     "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code"}
)

BANNED_ATTRIBUTES: dict[str, str] = {
    "_make_subclass": "tensor-subclass hack (lazy or fake tensors)",
    "as_subclass": "tensor-subclass hack (lazy or fake tensors)",
    "_version": "caching on tensor version counters",
    "_cdata": "raw tensor handles",
    "record_stream": "CUDA stream API",
}


# Builtins a kernel file may name (pure helpers, containers, numbers, `type` for `type(x) is tuple`, exceptions);
# attributes of what they return pass the attribute allow-list like any other value. Every other builtin (getattr,
# setattr, hasattr, vars, globals, object, format, open, eval, __import__, ...) is refused.
SAFE_BUILTINS: frozenset[str] = frozenset(
    """abs all any bool dict divmod enumerate filter float frozenset int isinstance issubclass iter len list map max
    min next pow print range repr reversed round set slice sorted str sum tuple zip super property staticmethod
    classmethod callable chr ord hex bin oct hash complex type NotImplemented Ellipsis""".split()
) | frozenset(
    name for name in dir(builtins)
    if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), Exception)
)

# Builtins that read or write attributes by a (computed) name: refused as calls and as values.
GETATTR_FAMILY: frozenset[str] = frozenset({"getattr", "setattr", "delattr", "hasattr"})

# Attributes a kernel's host code may read on objects screening cannot type (tensors, devices, dtypes, finfo,
# device properties, containers, strings, numbers, Triton autotuners and configs). Any other attribute of such an
# object is refused (function internals such as `get_capture_scope`, `rewrite`, `fn`, `src`; `format`).
HOST_ATTRIBUTES: frozenset[str] = frozenset(
    """shape dtype device ndim is_cuda is_cpu is_meta layout requires_grad itemsize nbytes T mT is_sparse
    is_quantized is_leaf
    type index
    is_signed
    eps max min tiny bits resolution smallest_normal
    multi_processor_count total_memory name major minor warp_size max_threads_per_multi_processor
    regs_per_multiprocessor L2_cache_size shared_memory_per_block shared_memory_per_block_optin
    shared_memory_per_multiprocessor gcnArchName is_integrated is_multi_gpu_board
    get items keys values append extend pop popitem setdefault update copy insert count sort reverse add discard
    remove clear union intersection difference issubset issuperset
    join split rsplit startswith endswith lower upper strip lstrip rstrip replace isdigit
    real imag bit_length is_integer numerator denominator conjugate
    best_config kwargs num_warps num_stages num_ctas cache_clear cache_info""".split()
) | TENSOR_METHODS_ALLOWED

# String constants that may look like dunders (everything else spelled `__x__` is refused: `d["__builtins__"]`).
SAFE_DUNDER_STRINGS: frozenset[str] = frozenset({"__main__"})


@functools.cache
def forbidden_tensor_methods() -> frozenset[str]:
    """Public callables of `torch.Tensor` that are not in `TENSOR_METHODS_ALLOWED` (computed from the live torch)."""
    names = {n for n in dir(torch.Tensor) if not n.startswith("_") and callable(getattr(torch.Tensor, n, None))}
    return frozenset(names - TENSOR_METHODS_ALLOWED)


_MISSING = object()


@functools.cache
def lookup(qualname: str) -> Any:
    """The live object a dotted name refers to (roots limited to importable allowed modules), or a sentinel.

    Used to tell modules from functions and to recognise dtype constants. Returns `lookup.missing` when the name
    does not resolve. Only module attributes are evaluated; other objects are read statically (no property or
    lazy driver initialisation runs in the screening process).
    """
    parts = qualname.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
    except Exception:  # noqa: BLE001 - any import failure means "unknown"
        return _MISSING
    for i, part in enumerate(parts[1:], start=1):
        try:
            # Modules: plain getattr (lazy submodules); anything else statically, so no property runs.
            nxt = getattr(obj, part, _MISSING) if isinstance(obj, types.ModuleType) else inspect.getattr_static(
                obj, part, _MISSING)
        except Exception:  # noqa: BLE001 - a failing lazy attribute means "unknown"
            nxt = _MISSING
        if isinstance(nxt, (property, types.GetSetDescriptorType, types.MemberDescriptorType)):
            return _MISSING
        if nxt is _MISSING and isinstance(obj, types.ModuleType):
            try:
                nxt = importlib.import_module(".".join(parts[: i + 1]))
            except Exception:  # noqa: BLE001
                nxt = _MISSING
        if nxt is _MISSING:
            return _MISSING
        obj = nxt
    return obj


lookup.missing = _MISSING  # type: ignore[attr-defined]


def _matches(name: str, pattern: str) -> bool:
    """`pattern` matches itself and its dotted children; a trailing `*` matches any name with that prefix."""
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern or name.startswith(pattern + ".")


def import_problem(module: str, allowed_roots: frozenset[str]) -> str | None:
    """Why importing (or referring to) `module` is refused, or None when its root is allowed."""
    if module.split(".")[0] in allowed_roots:
        return None
    for pattern, reason in IMPORT_CATEGORIES:
        if _matches(module, pattern):
            return f"{module} is {reason}; kernels may import only {', '.join(sorted(allowed_roots))}"
    return f"{module} is not on the import allow-list ({', '.join(sorted(allowed_roots))})"


# Names in the allowed pure-Python modules that evaluate strings as code.
PLAIN_MODULE_DENIED: dict[str, str] = {
    "typing.get_type_hints": "evaluates annotation strings as code",
    "typing.ForwardRef": "evaluates strings as code",
    "typing.evaluate_forward_ref": "evaluates strings as code",
}


def leaves_package(qualname: str) -> str | None:
    """The name of a module outside `qualname`'s root package that the dotted name walks into, if any.

    `typing.sys.modules` walks into `sys`; `triton.language.core.builtins` into `builtins`.
    """
    parts = qualname.split(".")
    root = parts[0]
    for i in range(2, len(parts) + 1):
        value = lookup(".".join(parts[:i]))
        if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] != root:
            return value.__name__
    return None


# The names a kernel may use from each allowed pure-Python module ("*": every public top-level name).
PLAIN_MODULE_ALLOWED: dict[str, frozenset[str] | str] = {
    "math": "*",
    "typing": "*",
    "__future__": frozenset({"annotations"}),
    "functools": frozenset({"lru_cache", "cache", "partial", "reduce", "wraps", "cached_property", "total_ordering"}),
    "itertools": frozenset({"product", "chain", "accumulate", "islice", "repeat", "count", "combinations",
                            "permutations", "zip_longest", "starmap", "pairwise", "groupby"}),
    "dataclasses": frozenset({"dataclass", "field", "replace"}),
    "collections": frozenset({"namedtuple", "OrderedDict", "defaultdict", "deque", "Counter"}),
    "enum": frozenset({"Enum", "IntEnum", "auto", "unique"}),
    "numbers": frozenset({"Number", "Integral", "Real"}),
    "abc": frozenset({"ABC", "abstractmethod"}),
}


def plain_module_problem(qualname: str) -> str | None:
    """Why a reference into an allowed pure-Python module (math, functools, typing...) is refused, or None."""
    for name, reason in PLAIN_MODULE_DENIED.items():
        if _matches(qualname, name):
            return f"{qualname} {reason}"
    parts = qualname.split(".")
    allowed = PLAIN_MODULE_ALLOWED.get(parts[0])
    if allowed is not None and len(parts) >= 2 and allowed != "*" and parts[1] not in allowed:
        return (f"{qualname} is not on the allow-list of {parts[0]} helpers "
                f"({', '.join(sorted(allowed))})")
    if any(p.startswith("_") and p not in SAFE_DUNDERS for p in qualname.split(".")[1:]):
        return f"{qualname} is a private internal"
    escaped = leaves_package(qualname)
    if escaped:
        return f"{qualname} reaches module {escaped} through {qualname.split('.')[0]}; not allowed"
    return None


def _is_type_constant(qualname: str) -> bool:
    value = lookup(qualname)
    return isinstance(value, (torch.dtype, torch.layout, torch.memory_format))


def torch_reference_problem(qualname: str, function_name: str | None = None) -> str | None:
    """Why a reference to `torch.<...>` is refused, or None when it is an allowed helper or constant.

    `function_name` is the `torch.nn.functional` function being implemented: any torch name ending in it (e.g.
    `torch.softmax` for `softmax`) is refused as a call of the reference op, even if otherwise allowed.
    """
    parts = qualname.split(".")
    if function_name and parts[-1] == function_name and len(parts) > 1:
        return (f"{qualname} is the reference op {function_name!r} itself; the kernel must implement it, not call "
                "PyTorch")
    for patterns, reason in _TORCH_CATEGORIES:
        if any(_matches(qualname, pattern) for pattern in patterns):
            return f"{qualname} {reason}"
    if len(parts) >= 3 and parts[1] == "Tensor":
        method = parts[2]
        if method in forbidden_tensor_methods():
            return f"{qualname} is a PyTorch tensor op; the kernel must compute the result itself"
        if method.startswith("_") and method not in SAFE_DUNDERS:
            return f"{qualname} is a private tensor internal"
        return None
    if qualname in TORCH_ALLOWED or _is_type_constant(qualname):
        return None
    if any(p.startswith("_") and p not in SAFE_DUNDERS for p in parts[1:]):
        return f"{qualname} is a private PyTorch internal"
    return (f"{qualname} is a PyTorch compute op or not on the allow-list of allocation and metadata helpers "
            "(torch.empty*, zeros*, ones*, full*, arange, tensor, dtypes, Size, device, finfo/iinfo, "
            "cuda.get_device_properties, ...)")
