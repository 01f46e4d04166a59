"""What screening allows and refuses in a candidate kernel file: the documented allow-lists (and the reasons
given for the most common refusals).

The policy is an allow-list (a deny-list was walked around through the Triton function object's capture scope,
`InterpretedFunction.rewrite()`, names never imported and `str.format`). A file may use only:

* Names it binds itself (imports, definitions, assignments, parameters) and the builtins in `SAFE_BUILTINS`; any
  other name (`os` never imported, `type`, `object`, `format`, `vars`, the `getattr` family) is refused.
* On values screening cannot type (tensors, dtypes, devices, containers...): in host code the attributes in
  `HOST_ATTRIBUTES`, the public names the file's own classes define and, for module problems, the torch.nn layers'
  parameter and setting names (`module_attributes()`), less every name in `function_internals()` and the language's
  kernel-object attributes; in device code the language's device attributes (e.g. Triton's tensor methods inside
  `@triton.jit` code). On `self` in a plain method of one of the file's own classes, any non-dunder attribute
  (`self.x`, one level: what `self.x` holds is judged as a value). Function internals (`get_capture_scope`,
  `rewrite`, `fn`, `src`), formatting (`format`, `format_map`) and reflection are therefore refused. See "The
  file's own classes and torch.nn layers" below for why none of these opens a gadget.
* Attribute assignment only as `self.x = ...`; no string constant spelling a dunder (`d["__builtins__"]`, `"__glob" +
  "als__"`).
* Through the file's own classes only their constants and static methods (a class passed around as a value, as in
  ResNet's `_make_layer(BasicBlock, ...)`, may be instantiated, but its method names are then readable on no untyped
  value); `type(x)` only compared; `super()` or `super(<this class>, self)`.
* From allowed pure-Python modules, the helpers in `PLAIN_MODULE_ALLOWED` ("named math helpers").

Within that, module references are judged as follows:

* Imports: only the modules in `ALLOWED_IMPORT_ROOTS` (plus a language's own, e.g. `triton`). Everything else
  (`os`, `sys`, `subprocess`, `socket`, `ctypes`, `threading`, `inspect`, `gc`, `importlib`, `time`, `pathlib`...)
  is refused with the reason in `IMPORT_CATEGORIES`.
* `torch.<name>`: only the allocation and metadata helpers in `TORCH_ALLOWED`, plus dtype, layout and
  memory-format constants (`torch.float32`, `torch.strided`, `torch.channels_last`...). Every other `torch.*` name is
  a PyTorch compute op or machinery the kernel must not use (`torch.nn.functional.*`, `torch.softmax`,
  `torch.matmul`, `torch.ops.aten.*`, `torch.compile`, `torch.cuda.Stream`, `torch.cuda.synchronize`...).
  Module problems only: calls of the compute ops in `construction_ops()` / `construction_tensor_methods()` (and
  `@`) in the `__init__` body of a construction-only class of the file, to build buffers as the reference `Model`
  does (`torch.tril(torch.ones(n, n))`); see "Construction-time compute" below.
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

import ast
import builtins
import functools
import importlib
import inspect
import types
import typing
from collections.abc import Iterable
from typing import Any

import torch

from forge.text import parse_python

__all__ = [
    "ALLOWED_CLASS_DECORATORS",
    "ALLOWED_IMPORT_ROOTS",
    "ALLOWED_METHOD_DECORATORS",
    "BANNED_ATTRIBUTES",
    "BANNED_BUILTINS",
    "CALL_ONLY_METHODS",
    "CLASS_HOOKS",
    "FRAME_ATTRIBUTES",
    "FUNCTION_INTERNALS",
    "GETATTR_FAMILY",
    "HOST_ATTRIBUTES",
    "IMPORT_CATEGORIES",
    "LIBRARY_CALLS",
    "PLAIN_MODULE_ALLOWED",
    "SAFE_BUILTINS",
    "SAFE_DUNDERS",
    "SAFE_DUNDER_STRINGS",
    "TENSOR_METHODS_ALLOWED",
    "TORCH_ALLOWED",
    "TRUSTED_BASES",
    "VALUE_BANNED_ATTRIBUTES",
    "class_attribute_names",
    "construction_ops",
    "construction_tensor_methods",
    "forbidden_tensor_methods",
    "function_internals",
    "import_problem",
    "instance_attribute_names",
    "stored_attribute_names",
    "leaves_package",
    "lookup",
    "module_attributes",
    "module_methods",
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

# The library calls a MODULE file (a `ModelNew`) may make for the parts where cuBLAS, cuDNN or fused attention already
# win: products, convolutions, attention; the rest must be its own kernels. The run-time launch check holds the same
# policy over the ATen ops these reach (`forge.checking.launch_check.LIBRARY_OPS`, `LaunchPolicy.for_modules()`),
# and a module kernel must still launch at least one kernel of its own. A function kernel may call none of them.
LIBRARY_CALLS: frozenset[str] = frozenset(
    {"torch.matmul", "torch.mm", "torch.bmm", "torch.addmm", "torch.baddbmm", "torch.mv", "torch.addmv",
     *(f"torch.nn.functional.{name}" for name in (
         "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
         "scaled_dot_product_attention"))}
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

# Attributes refused on every value the screen cannot name, `self` chains included (which otherwise may read any
# non-dunder attribute): `self.conv.compile()` is torch.compile on a module (nn.Module.compile). Names that resolve
# (`torch.compile`) are judged as references instead.
VALUE_BANNED_ATTRIBUTES: dict[str, str] = {
    "compile": "PyTorch's compiler (nn.Module.compile runs torch.compile); kernels must be written in the kernel "
               "language",
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
# object is refused (function internals such as `get_capture_scope`, `rewrite`, `fn`, `src`; `format`). `data` is a
# tensor's (or parameter's) detached view, `self.weight.data`; no function, frame or Triton kernel object has it.
HOST_ATTRIBUTES: frozenset[str] = frozenset(
    """shape dtype device ndim is_cuda is_cpu is_meta layout requires_grad itemsize nbytes T mT is_sparse
    is_quantized is_leaf data
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


# -- Construction-time compute (module problems) -------------------------------------------------------------------
#
# A KernelBench reference `Model` builds some buffers with PyTorch ops in its `__init__` (minGPT's causal mask,
# `torch.tril(torch.ones(n, n)).view(1, 1, n, n)`; rotary tables from `torch.outer`/`cos`/`sin`; weights rescaled
# with `.mul_()`), and the prompt asks `ModelNew` to create its parameters and buffers exactly so. Module screening
# therefore allows *calls* of the ops below in the `__init__` bodies of the file's construction-only classes (the
# conditions and why they open no gadget: `agent.screening.python_ast._Analyser.in_construction`). The ops are
# derived from the live torch: the public functions of `torch._C._VariableFunctions` (the ATen ops torch exposes as
# `torch.<name>`) and `torch.functional.__all__` (torch's Python-level tensor functions: einsum, meshgrid, stft...),
# each a plain function of `torch` (no module, no class), less `_CONSTRUCTION_DENIED` and everything
# `_TORCH_CATEGORIES` names (compiler, streams, global state, torch.ops). None of them takes a Python callable, so
# a call can only compute a tensor from values that exist at construction. `torch.nn.functional` stays refused in
# `__init__` too: it re-exports `torch` itself and the `torch.overrides` hooks (`F.torch.compile`,
# `F.handle_torch_function`), so a prefix allowance would reopen what `_TORCH_CATEGORIES` refuses, and the
# reference models build their buffers with `torch.*` ops.

# ATen functions that read outside the tensors they are given (a file, a Python buffer, numpy memory), resize a
# tensor's storage in place, or constrain symbolic shapes (compiler machinery).
_CONSTRUCTION_DENIED: frozenset[str] = frozenset(
    {"from_file", "frombuffer", "from_numpy", "asarray", "resize_as_", "resize_as_sparse_", "sym_constrain_range",
     "sym_constrain_range_for_size"}
)
# Tensor methods that compute like the ATen functions above but have no `torch.<name>` function of their name
# (`x.repeat`, `x.unfold`, in-place random fills). Tensor methods that take a Python callable (`apply_`, `map_`,
# `map2_`), run or hook autograd (`backward`, `register_hook`, `retain_grad`), alias, resize or share storage
# (`set_`, `resize_`, `storage`, `untyped_storage`, `share_memory_`, `pin_memory`), reach the stream API
# (`record_stream`) or leave torch (`numpy`) are no construction ops and stay refused everywhere.
_CONSTRUCTION_EXTRA_METHODS: frozenset[str] = frozenset(
    {"repeat", "unfold", "uniform_", "random_", "exponential_", "cauchy_", "geometric_", "log_normal_",
     "fill_diagonal_", "sum_to_size"}
)


@functools.cache
def construction_ops() -> frozenset[str]:
    """`torch.<name>` compute ops a module file may call in its classes' `__init__` bodies (see the comment above):
    the public ATen functions (`torch._C._VariableFunctions`) and `torch.functional.__all__`, from the live torch,
    less `_CONSTRUCTION_DENIED`, anything `_TORCH_CATEGORIES` names, and names that are no plain function of
    `torch` (modules, classes)."""
    import torch.functional

    names = {n for n in dir(torch._C._VariableFunctions) if not n.startswith("_")}
    names |= {n for n in getattr(torch.functional, "__all__", ()) if not n.startswith("_")}
    ops: set[str] = set()
    for name in names - _CONSTRUCTION_DENIED:
        value = getattr(torch, name, None)
        if value is None or isinstance(value, (type, types.ModuleType)) or not callable(value):
            continue
        qualname = f"torch.{name}"
        if any(_matches(qualname, p) for patterns, _ in _TORCH_CATEGORIES for p in patterns):
            continue
        ops.add(qualname)
    return frozenset(ops)


@functools.cache
def construction_tensor_methods() -> frozenset[str]:
    """The PyTorch tensor ops (`forbidden_tensor_methods()`) a module file may call in its classes' `__init__`
    bodies: those named like a construction op, or like one with an in-place `_` (`tril`, `mul_`, `masked_fill_`),
    plus `_CONSTRUCTION_EXTRA_METHODS`; never a name in `_CONSTRUCTION_DENIED`, `BANNED_ATTRIBUTES` or
    `VALUE_BANNED_ATTRIBUTES`."""
    ops = {q.split(".", 1)[1] for q in construction_ops()}
    forbidden = forbidden_tensor_methods()
    names = {m for m in forbidden if m in ops or m.rstrip("_") in ops} | (_CONSTRUCTION_EXTRA_METHODS & forbidden)
    return frozenset(names - _CONSTRUCTION_DENIED - set(BANNED_ATTRIBUTES) - set(VALUE_BANNED_ATTRIBUTES))


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


# -- The file's own classes and torch.nn layers ---------------------------------------------------------------------
#
# Why these relaxations open no gadget. Screening lets a method read and write any non-dunder attribute of `self`
# because `self` is then the file's own instance: whatever its attributes hold, the file put there through code the
# screen judged. That holds only while a method cannot be called with another object as `self`, so everything that
# hands a method (or the class, through which methods come unbound) to code of the file's choice is refused:
# `Cls.method`, a method name read on a class passed as a value (`c = Cls; c.update(obj, v)`), `type(obj)` outside a
# comparison, `super(C, obj)` with any other object than the method's own `self`, a method aliased in its class body
# (`get = update`, `classmethod(update)`), `classmethod` at all, method decorators other than
# `ALLOWED_METHOD_DECORATORS`, class decorators other than `ALLOWED_CLASS_DECORATORS`, metaclasses, classes nested in
# classes (`self.Inner` is the class) and the hooks in `CLASS_HOOKS` (they receive the class or an owner).
# Staticmethods and methods of classes whose bases are not in `TRUSTED_BASES` (e.g. a `str` subclass, whose `self`
# has `format`) get no `self` privilege at all. The privilege covers `self.x` only: what `self.x` holds is judged as
# any value (`self.k = kernel; self.k.get_capture_scope()` is refused), and attributes are set only as `self.x = ...`
# or on a layer or instance the class itself created there (`self.conv = nn.Conv2d(...)`; `self.conv.bias = ...`);
# on such an owned `self.x` its `forward` and the methods listing its own parameters, buffers and submodules may be
# called too (bound to that instance: `agent.screening.python_ast._OWNED_MODULE_CALLS`).
#
# Attribute names on values the screen cannot type: besides `HOST_ATTRIBUTES`, the names the file's own classes
# define (class-body names, `self.x = ...` in their methods) and, for module problems, the parameter, buffer and
# setting names of torch.nn layers (`module_attributes()`, derived from the live torch, the recurrent layers'
# computed `weight_ih_l0`... included). Neither set may contain a
# name in `function_internals()` (nor the language's own, e.g. Triton's JITFunction and autotuner attributes): such a
# name read on a function, code object, frame, generator, Triton kernel or autotuner is refused as before, so what
# the new names reach is a tensor, a layer's setting, or an attribute of the file's own object.

# Names through which functions and kernel objects give up their globals, source or compiled code (beside every
# non-dunder attribute of `_INTERNAL_TYPES`; the languages add their kernel objects'): never allowed on untyped values
# through the own-class or torch.nn name sets.
FUNCTION_INTERNALS: frozenset[str] = frozenset(
    """fn src get_capture_scope rewrite format format_map cache used_global_vals module globals builtins code func
    base_fn run warmup preload kernel_cache device_caches hash cache_key do_bench launch_metadata jit_fn mro
    compile""".split()
)

_INTERNAL_TYPES: tuple[type, ...] = (
    types.FunctionType, types.CodeType, types.FrameType, types.TracebackType, types.GeneratorType,
    types.CoroutineType, types.AsyncGeneratorType, types.MethodType, types.BuiltinFunctionType,
    types.MethodWrapperType, types.WrapperDescriptorType, types.MethodDescriptorType,
    types.ClassMethodDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType, types.ModuleType,
    types.CellType, types.MappingProxyType, type, property, staticmethod, classmethod, super, functools.partial,
    functools.partialmethod, functools.cached_property, type(functools.lru_cache(maxsize=None)(len)),
)


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


@functools.cache
def function_internals() -> frozenset[str]:
    """`FUNCTION_INTERNALS`, `FRAME_ATTRIBUTES`, `BANNED_ATTRIBUTES` and every non-dunder attribute of the
    function-like Python types (`_INTERNAL_TYPES`: functions, code, frames, tracebacks, generators, coroutines,
    methods, descriptors, modules, cells, `type`, property, partial, lru_cache wrappers...), read from the live
    interpreter."""
    names = set(FUNCTION_INTERNALS) | FRAME_ATTRIBUTES | set(BANNED_ATTRIBUTES) | set(VALUE_BANNED_ATTRIBUTES)
    for kind in _INTERNAL_TYPES:
        names.update(n for n in dir(kind) if not _dunder(n))
    return frozenset(names)


# Bases whose instances keep the `self` privilege in methods of the file's classes (beside the file's own trusted
# classes, `object`, the builtin exceptions and, for module problems, the torch.nn layers the language allows).
TRUSTED_BASES: frozenset[str] = frozenset(
    {"abc.ABC", "typing.NamedTuple", "typing.Generic", "typing.Protocol", "enum.Enum", "enum.IntEnum", "enum.Flag",
     "enum.IntFlag"}
)
# Class decorators that return the class they are given (without handing it to the file's code).
ALLOWED_CLASS_DECORATORS: frozenset[str] = frozenset(
    {"dataclasses.dataclass", "functools.total_ordering", "enum.unique", "typing.final", "typing.runtime_checkable"}
)
# Method decorators that keep the method bound to instances (`property` is a builtin name, judged apart).
ALLOWED_METHOD_DECORATORS: frozenset[str] = frozenset(
    {"functools.cached_property", "functools.lru_cache", "functools.cache", "torch.no_grad", "torch.inference_mode",
     "torch.enable_grad", "abc.abstractmethod", "typing.final", "typing.overload", "typing.override"}
)
# Methods Python calls with the class (or an owner class, or a non-instance) instead of an instance: defining them
# would hand the class, and through it the unbound methods, to the file's code.
CLASS_HOOKS: frozenset[str] = frozenset(
    {"__new__", "__init_subclass__", "__class_getitem__", "__set_name__", "__get__", "__set__", "__delete__",
     "__mro_entries__", "__prepare__", "__instancecheck__", "__subclasscheck__", "__getattr__", "__getattribute__",
     "__setattr__", "__delattr__", "__del__", "__reduce__", "__reduce_ex__", "_generate_next_value_", "_missing_"}
)

_REGISTERING_CALLS = frozenset({"register_buffer", "register_parameter", "register_module", "add_module",
                                "__setattr__", "setattr"})


@functools.cache
def _source_tree(path: str) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_python(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def _class_node(cls: type) -> ast.ClassDef | None:
    """The `class` statement of `cls` in its source file (found by qualified name; None without a source)."""
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        return None
    tree = _source_tree(path) if path else None
    if tree is None:
        return None
    body: list[ast.stmt] = tree.body
    node: ast.ClassDef | None = None
    for part in cls.__qualname__.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def instance_attribute_names(cls: type) -> frozenset[str]:
    """The attributes the methods of `cls` itself set on their first parameter (`stored_attribute_names`). Read
    statically from the class's source file with `ast`: nothing is instantiated and no code of the class runs."""
    node = _class_node(cls)
    return frozenset(stored_attribute_names(node)) if node is not None else frozenset()


def stored_attribute_names(node: ast.ClassDef) -> set[str]:
    """The attributes the methods of a class (its AST) set on their first parameter: `self.x = ...`,
    `self.x: T = ...`, and by a constant name `self.register_buffer("x", ...)` (also `register_parameter`,
    `register_module`, `add_module`, `setattr(self, "x", ...)`, `super().__setattr__("x", ...)`)."""
    names: set[str] = set()
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [*method.args.posonlyargs, *method.args.args]
        if not params:
            continue
        me = params[0].arg
        for sub in ast.walk(method):
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and isinstance(sub.value, ast.Name) \
                    and sub.value.id == me:
                names.add(sub.attr)
            elif isinstance(sub, ast.Call):
                func, args = sub.func, sub.args
                if isinstance(func, ast.Name) and func.id == "setattr" and len(args) >= 2:
                    args = args[1:]
                elif not (isinstance(func, ast.Attribute) and func.attr in _REGISTERING_CALLS):
                    continue
                if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                    names.add(args[0].value)
    return names


def class_attribute_names(classes: Iterable[type]) -> frozenset[str]:
    """Every attribute name the classes (and their bases other than `object` and `typing.Generic`) define on the
    class (`dir`) or set on instances (`instance_attribute_names`): what an object of one of them answers to."""
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            if klass in (object, typing.Generic):
                continue
            names.update(dir(klass))
            names.update(instance_attribute_names(klass))
    return frozenset(n for n in names if not _dunder(n))


@functools.cache
def module_attributes() -> frozenset[str]:
    """Parameter, buffer and setting names of the torch.nn layers, derived from the live torch: for every public
    class of `torch.nn.modules` (its `__all__`) and every nn.Module class in its MRO, the names in `__constants__`,
    the class's own annotations, the parameters of `__init__`, and the attributes its methods set or register on
    `self` (`instance_attribute_names`: `weight`, `bias`, `running_mean`, `head_dim`, ...). Private names and the
    methods of nn.Module (`forward`, `parameters`, `modules`, `apply`...) are left out; so are PyTorch tensor ops
    (`forbidden_tensor_methods`, refused as tensor ops anyway) and every name in `function_internals()`."""
    import torch.nn as nn
    import torch.nn.modules as nn_modules

    seen: list[type] = []
    for public in getattr(nn_modules, "__all__", ()):
        cls = getattr(nn_modules, public, None)
        if isinstance(cls, type) and issubclass(cls, nn.Module):
            seen.extend(k for k in cls.__mro__ if isinstance(k, type) and issubclass(k, nn.Module) and k not in seen)
    names: set[str] = set()
    for cls in seen:
        names.update(vars(cls).get("__constants__", ()))
        try:
            names.update(inspect.get_annotations(cls))
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate: skip it
            pass
        init = vars(cls).get("__init__")
        if init is not None:
            try:
                names.update(p.name for p in inspect.signature(init).parameters.values()
                             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
            except (TypeError, ValueError):
                pass
        names.update(instance_attribute_names(cls))
        names.update(n for n, v in vars(cls).items() if isinstance(v, property))  # `all_weights` of the RNNs
    names.update(_rnn_parameter_names())
    public_names = {n for n in names if isinstance(n, str) and n.isidentifier() and not n.startswith("_")}
    return frozenset(public_names - module_methods() - {"self"} - forbidden_tensor_methods() - function_internals())


# Layers of an nn.LSTM / GRU / RNN whose parameter names `module_attributes` lists (`weight_ih_l0` ... `_l63`).
_RNN_MAX_LAYERS = 64


def _rnn_parameter_names() -> set[str]:
    """The parameters the recurrent layers register under computed names (`weight_ih_l0`, `bias_hh_l1_reverse`,
    `weight_hr_l0`, ...; no `self.x = ...` a static read could find): the layer-0 names of a tiny bidirectional,
    projected `nn.LSTM` of the live torch (a superset of GRU's and RNN's), repeated for `_RNN_MAX_LAYERS` layers."""
    import torch.nn as nn

    try:
        first = list(nn.LSTM(1, 2, num_layers=1, bidirectional=True, proj_size=1)._flat_weights_names)
    except Exception:  # noqa: BLE001 - a torch without these internals: no computed names
        return set()
    return {n.replace("_l0", f"_l{k}", 1) for n in first if "_l0" in n for k in range(_RNN_MAX_LAYERS)}


@functools.cache
def module_methods() -> frozenset[str]:
    """The methods of `torch.nn.Module` (`forward`, `train`, `apply`, `set_submodule`, ...), from the live torch. A
    layer class reached as a value (`[nn.Conv2d][0]`) gives them unbound, to be called with any object as self; on
    `self` chains they stay readable (the instance is the file's own)."""
    import torch.nn as nn

    return frozenset(n for n in dir(nn.Module)
                     if not _dunder(n) and callable(inspect.getattr_static(nn.Module, n, None)))
