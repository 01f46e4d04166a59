"""What a CUDA candidate calls at run time: `kernels = load_cuda(CUDA_SRC)`, then `kernels.name[grid, block](...)`.

`load_cuda` builds the source with the harness's toolchain (`build.py`; backend from `$KFORGE_CUDA_BACKEND`, cache
folder from `$KFORGE_CUDA_CACHE`, arch of the current GPU) and returns a handle whose attributes are exactly the
source's `extern "C" __global__` kernels (anything else is an AttributeError: a candidate launches only its own
kernels). A launch `kernels.k[grid, block](*args)` or `kernels.k[grid, block, shared_bytes](*args)` packs each
argument by the kernel's declared parameter type (tensor or None -> device pointer; Python int -> the declared
integer width, range-checked; number -> float/double) and launches on torch's current stream of the current device.

Two loaders:
* cubin (NVRTC or nvcc): `cuModuleLoadData` + `cuLaunchKernel` through `ctypes` on `libcuda` (no cuda-python: its
  API changed across cuda-core 0.x releases, and ctypes costs about a microsecond a call). Arguments are packed into
  one ctypes Structure per launch whose field addresses form the `kernelParams` array.
* `load_inline`: torch's C++ extension build of the same source plus generated `launch_<name>` wrappers (`<<<...>>>`
  on the passed stream); kept for comparison and as a fallback where no cubin loader works.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import operator
import os
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agent.languages.cuda.build import build_cubin, compile_text, default_cache_dir
from agent.languages.cuda.diagnostics import CudaCompileError, parse_compiler_output
from agent.languages.cuda.source import KernelParam, KernelSignature, parse_kernels
from agent.languages.cuda.toolchain import Toolchain, toolchain
from forge.checking.launch_check import note_launch
from forge.errors import KernelForgeError

__all__ = ["CudaKernels", "CudaLaunchError", "add_launch_observer", "clear_loaded", "install_launch_counting",
           "load_cuda", "remove_launch_observer"]

_MAX_STATIC_SHARED = 48 * 1024
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CUDA_ERROR_INVALID_CONTEXT = 201
_CTYPES = {"ptr": ctypes.c_uint64, "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64,
           "u64": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double, "bool": ctypes.c_bool}
_STRUCT_CODES = {"ptr": "Q", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d", "bool": "?"}
_INT_RANGE = {"i32": (-(2**31), 2**31), "u32": (0, 2**32), "i64": (-(2**63), 2**63), "u64": (0, 2**64)}


class CudaLaunchError(KernelForgeError, RuntimeError):
    """A launch was refused by the driver or given arguments that do not fit the kernel's parameters."""


# Called after every launch as observer(kernel_name, grid, block, shared_bytes): the hook for a run-time launch
# monitor (`KernelLanguage.launch_monitor()`); an empty list costs one truth test per launch.
_LAUNCH_OBSERVERS: list[Callable[[str, tuple, tuple, int], None]] = []


def add_launch_observer(observer: Callable[[str, tuple, tuple, int], None]) -> None:
    """Call `observer(kernel_name, grid, block, shared_bytes)` after every CUDA candidate launch in this process."""
    _LAUNCH_OBSERVERS.append(observer)


def remove_launch_observer(observer: Callable[[str, tuple, tuple, int], None]) -> None:
    _LAUNCH_OBSERVERS.remove(observer)


def _count_launch(kernel: str, grid: tuple, block: tuple, shared: int) -> None:
    note_launch(kernel)


def install_launch_counting() -> None:
    """Count every successful launch of a candidate's kernel into the active launch watch
    (`forge.checking.launch_check.note_launch`; nothing is counted outside a watch). Idempotent; installed by
    `CudaLanguage.launch_monitor()` in the processes that judge candidates, never by a plain load (production
    launches keep the observer list empty). A launch the driver refuses raises before the observers run, so it
    does not count."""
    if _count_launch not in _LAUNCH_OBSERVERS:
        _LAUNCH_OBSERVERS.append(_count_launch)


# ---------------------------------------------------------------------------------------------- arguments


def _pointer(value: Any, param: KernelParam, kernel: str) -> int:
    if value is None:
        return 0
    if isinstance(value, torch.Tensor):
        if not value.is_cuda:
            raise CudaLaunchError(f"{kernel}: argument `{param.name}` is a {value.device} tensor; CUDA kernels "
                                  "need CUDA tensors")
        return value.data_ptr()
    raise CudaLaunchError(f"{kernel}: argument `{param.name}` ({param.c_type}) must be a torch tensor or None, got "
                          f"{type(value).__name__}")


def _converter(param: KernelParam, kernel: str) -> Callable[[Any], Any]:
    kind = param.kind
    if kind == "ptr":
        return lambda v: _pointer(v, param, kernel)
    if kind in ("f32", "f64"):
        return float
    if kind == "bool":
        return bool
    low, high = _INT_RANGE[kind]

    def to_int(value: Any) -> int:
        try:
            number = operator.index(value)
        except TypeError:
            raise CudaLaunchError(f"{kernel}: argument `{param.name}` ({param.c_type}) must be an int, got "
                                  f"{type(value).__name__}") from None
        if not low <= number < high:
            raise CudaLaunchError(f"{kernel}: argument `{param.name}` = {number} does not fit {param.c_type}")
        return number

    return to_int


def _dims(value: Any, what: str, kernel: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise CudaLaunchError(f"{kernel}: {what} must be a positive int or a tuple of 1 to 3 positive ints, got "
                              f"{value!r}")
    return (*dims, 1, 1)[:3]  # type: ignore[return-value]


def _config(key: Any, kernel: str) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    if not isinstance(key, tuple) or len(key) not in (2, 3):
        raise CudaLaunchError(f"{kernel}: launch as kernels.{kernel}[grid, block](...) or "
                              f"kernels.{kernel}[grid, block, shared_bytes](...)")
    shared = key[2] if len(key) == 3 else 0
    if not isinstance(shared, int) or shared < 0:
        raise CudaLaunchError(f"{kernel}: shared_bytes must be a non-negative int, got {shared!r}")
    return _dims(key[0], "grid", kernel), _dims(key[1], "block", kernel), shared


def _current_stream() -> tuple[int, int]:
    """(device index, raw cudaStream_t of torch's current stream there)."""
    index = torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return index, (raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream)


# ---------------------------------------------------------------------------------------------- kernels


class _Kernel:
    """One launchable kernel; `kernel[grid, block]` returns a (cached) callable that launches it.

    `checked_packing`: the launcher packs scalars with `struct`, which itself refuses values that do not fit the
    declared C type (`struct.error`); then only pointers are converted per call and the full per-argument checks
    run only to explain a refusal (measured on a 2-core CPU: 3.8 us a call with per-argument converters, ~1 us
    fewer without). Otherwise (the load_inline launcher) every argument is checked before the launch.
    """

    def __init__(self, signature: KernelSignature, launch: Callable[[tuple, tuple, int, Sequence], None], *,
                 checked_packing: bool = False) -> None:
        assert signature.params is not None
        self.signature = signature
        self.name = signature.name
        self._converters = tuple(_converter(p, signature.name) for p in signature.params)
        self._pointers = tuple(i for i, p in enumerate(signature.params) if p.kind == "ptr")
        self._checked_packing = checked_packing
        self._launch = launch
        self._bound: dict[Any, Callable[..., None]] = {}

    def __getitem__(self, key: Any) -> Callable[..., None]:
        try:
            return self._bound[key]
        except (KeyError, TypeError):
            config = _config(key, self.name)
            bound = functools.partial(self._call, config)
            try:
                self._bound[key] = bound
            except TypeError:
                pass
            return bound

    def _convert_all(self, args: tuple) -> list:
        return [convert(a) for convert, a in zip(self._converters, args, strict=True)]

    def _call(self, config: tuple, *args: Any) -> None:
        if len(args) != len(self._converters):
            params = ", ".join(f"{p.c_type} {p.name}" for p in self.signature.params or ())
            raise CudaLaunchError(f"{self.name} takes {len(self._converters)} arguments ({params}), got {len(args)}")
        grid, block, shared = config
        if not self._checked_packing:
            self._launch(grid, block, shared, self._convert_all(args))
        else:
            self._launch_packed(grid, block, shared, args)
        if _LAUNCH_OBSERVERS:
            for observer in tuple(_LAUNCH_OBSERVERS):
                observer(self.name, grid, block, shared)

    def _launch_packed(self, grid: tuple, block: tuple, shared: int, args: tuple) -> None:
        values = list(args)
        for i in self._pointers:
            value = values[i]
            if value is None:
                values[i] = 0
            elif isinstance(value, torch.Tensor) and value.is_cuda:
                values[i] = value.data_ptr()
            else:
                values[i] = self._converters[i](value)  # raises the explanation
        try:
            self._launch(grid, block, shared, values)
        except struct.error:
            self._launch(grid, block, shared, self._convert_all(args))  # raises CudaLaunchError, or packs converted

    def __repr__(self) -> str:
        return f"<CUDA kernel {self.name}>"


class CudaKernels:
    """The handle `load_cuda` returns: one attribute per `extern "C" __global__` kernel of the source."""

    def __init__(self, kernels: dict[str, _Kernel], backend: str, key: str) -> None:
        self._kernels = kernels
        self.backend = backend
        self.key = key

    def __getattr__(self, name: str) -> _Kernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"CUDA_SRC defines no launchable kernel {name!r} (extern \"C\" __global__ kernels: "
                             f"{', '.join(sorted(kernels)) or 'none'})")

    def __dir__(self) -> list[str]:
        return sorted(self._kernels)

    def __repr__(self) -> str:
        return f"<CudaKernels {self.backend} {', '.join(sorted(self._kernels))}>"


# ---------------------------------------------------------------------------------------------- cubin loader


class _Driver:
    """The few `libcuda` entry points the cubin loader needs, through ctypes."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.lib = lib
        vp, ui = ctypes.c_void_p, ctypes.c_uint
        lib.cuLaunchKernel.argtypes = [vp, ui, ui, ui, ui, ui, ui, ui, vp, ctypes.POINTER(vp), vp]
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
        lib.cuCtxSetCurrent.argtypes = [vp]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.check(lib.cuInit(0), "cuInit")

    def error_name(self, status: int) -> str:
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(status, ctypes.byref(name))
        return (name.value or b"CUDA_ERROR_UNKNOWN").decode()

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise CudaLaunchError(f"{what} failed: {self.error_name(status)} ({status})")

    def use_primary_context(self, index: int) -> None:
        """Make device `index`'s primary context (torch's) current on this thread."""
        device, ctx, current = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.lib.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value != ctx.value:
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load_functions(self, cubin: bytes, names: Sequence[str]) -> dict[str, int]:
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        functions = {}
        for name in names:
            fn = ctypes.c_void_p()
            self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                       f"cuModuleGetFunction({name})")
            functions[name] = fn.value
        return functions


_DRIVER: _Driver | None = None
_DRIVER_LOCK = threading.Lock()


def _driver() -> _Driver:
    global _DRIVER
    with _DRIVER_LOCK:
        if _DRIVER is None:
            _DRIVER = _Driver()
        return _DRIVER


class _CubinModule:
    """A cubin loaded lazily per device (in torch's primary context) with ctypes launchers for its kernels."""

    def __init__(self, cubin: bytes, signatures: Sequence[KernelSignature]) -> None:
        self.cubin = cubin
        self.signatures = {s.name: s for s in signatures}
        self._per_device: dict[int, dict[str, int]] = {}
        self._shared_set: set[tuple[int, str, int]] = set()
        self._lock = threading.Lock()
        self._layouts: dict[str, tuple[struct.Struct, tuple[int, ...], int]] = {}
        for sig in signatures:
            params = sig.params or ()
            fields = [(f"a{i}", _CTYPES[p.kind]) for i, p in enumerate(params)]
            layout = type(f"_{sig.name}_args", (ctypes.Structure,), {"_fields_": fields})
            offsets = tuple(getattr(layout, f).offset for f, _ in fields)
            packer = struct.Struct("@" + "".join(_STRUCT_CODES[p.kind] for p in params))
            assert packer.size <= ctypes.sizeof(layout)  # native struct alignment == the C ABI's
            self._layouts[sig.name] = (packer, offsets, max(1, ctypes.sizeof(layout)))

    def _functions(self, index: int) -> dict[str, int]:
        functions = self._per_device.get(index)
        if functions is None:
            with self._lock:
                functions = self._per_device.get(index)
                if functions is None:
                    torch.cuda.init()
                    driver = _driver()
                    driver.use_primary_context(index)
                    functions = driver.load_functions(self.cubin, list(self.signatures))
                    self._per_device[index] = functions
        return functions

    def launcher(self, name: str) -> Callable[[tuple, tuple, int, Sequence], None]:
        """A launch function writing the arguments into one fixed buffer whose field addresses are the
        `kernelParams` array (the driver copies them at launch, also under CUDA-graph capture); a lock keeps two
        threads from interleaving pack and launch."""
        packer, offsets, size = self._layouts[name]
        buffer = ctypes.create_string_buffer(size)
        base = ctypes.addressof(buffer)
        params = (ctypes.c_void_p * max(1, len(offsets)))(*[base + o for o in offsets])
        pack_into = packer.pack_into
        lock = threading.Lock()

        def run(grid: tuple, block: tuple, shared: int, values: Sequence) -> None:
            index, stream = _current_stream()
            function = self._functions(index)[name]
            driver = _DRIVER or _driver()
            if shared > _MAX_STATIC_SHARED and (index, name, shared) not in self._shared_set:
                driver.check(driver.lib.cuFuncSetAttribute(
                    function, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared), f"{name}: shared memory")
                self._shared_set.add((index, name, shared))
            with lock:
                pack_into(buffer, 0, *values)
                status = driver.lib.cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                                   shared, stream, params, None)
                if status == _CUDA_ERROR_INVALID_CONTEXT:  # a thread torch has not used yet: bind, retry
                    driver.use_primary_context(index)
                    status = driver.lib.cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1],
                                                       block[2], shared, stream, params, None)
            if status != 0:
                driver.check(status, f"launch of {name}")

        return run


# ---------------------------------------------------------------------------------------------- load_inline loader

_EXTENSION_LOCK = threading.Lock()


def _wrapper(sig: KernelSignature) -> tuple[str, str]:
    """(CUDA definition, C++ declaration) of `launch_<name>` for the load_inline backend."""
    params = sig.params or ()
    args = ", ".join(["int64_t gx", "int64_t gy", "int64_t gz", "int64_t bx", "int64_t by", "int64_t bz",
                      "int64_t smem", "int64_t stream"]
                     + [f"{'double' if p.kind in ('f32', 'f64') else 'int64_t'} a{i}" for i, p in enumerate(params)])
    casts = []
    for i, p in enumerate(params):
        c_type = " ".join(w for w in p.c_type.replace("*", " * ").split() if w not in ("__restrict__", "__restrict"))
        casts.append(f"reinterpret_cast<{c_type}>(a{i})" if p.kind == "ptr" else f"static_cast<{c_type}>(a{i})")
    body = (
        f"void launch_{sig.name}({args}) {{\n"
        f"  if (smem > {_MAX_STATIC_SHARED}) cudaFuncSetAttribute({sig.name}, "
        "cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);\n"
        f"  {sig.name}<<<dim3(gx, gy, gz), dim3(bx, by, bz), (size_t)smem, (cudaStream_t)stream>>>("
        f"{', '.join(casts)});\n"
        "  cudaError_t err = cudaGetLastError();\n"
        f"  if (err != cudaSuccess) throw std::runtime_error(std::string(\"launch of {sig.name} failed: \") + "
        "cudaGetErrorString(err));\n}\n"
    )
    return body, f"void launch_{sig.name}({args});"


def extension_sources(cuda_source: str, signatures: Sequence[KernelSignature]) -> tuple[str, str, list[str]]:
    """(C++ declarations, CUDA text, function names) that `load_inline` builds for the load_inline backend."""
    wrappers = [_wrapper(s) for s in signatures]
    cuda_text = (compile_text(cuda_source) + '\n#line 1 "kforge_launchers"\n#include <stdexcept>\n#include <string>\n'
                 + "\n".join(w[0] for w in wrappers))
    cpp_text = "#include <cstdint>\n" + "\n".join(w[1] for w in wrappers)
    return cpp_text, cuda_text, [f"launch_{s.name}" for s in signatures]


def _build_extension(cuda_source: str, signatures: Sequence[KernelSignature], chain: Toolchain,
                     cache_dir: Path) -> Any:
    from torch.utils.cpp_extension import load_inline

    key = hashlib.sha256((compile_text(cuda_source) + chain.key()).encode()).hexdigest()
    name = f"kforge_cuda_{key[:24]}"
    cpp_text, cuda_text, functions = extension_sources(cuda_source, signatures)
    folder = cache_dir / "torch_ext" / name
    folder.mkdir(parents=True, exist_ok=True)
    arch = chain.arch or "sm_90"
    number = arch.removeprefix("sm_")
    with _EXTENSION_LOCK:
        saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{number[:-1]}.{number[-1]}"
        try:
            return load_inline(name=name, cpp_sources=cpp_text, cuda_sources=cuda_text, functions=functions,
                               extra_cuda_cflags=["-O3"], build_directory=str(folder),
                               verbose=False)
        except RuntimeError as exc:
            log = str(exc)
            raise CudaCompileError(parse_compiler_output(log), log, "load_inline") from None
        finally:
            if saved is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = saved


def _extension_launcher(module: Any, name: str) -> Callable[[tuple, tuple, int, tuple], None]:
    fn = getattr(module, f"launch_{name}")

    def run(grid: tuple, block: tuple, shared: int, values: Sequence) -> None:
        _, stream = _current_stream()
        fn(grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, *values)

    return run


# ---------------------------------------------------------------------------------------------- entry point

_LOADED: dict[tuple[str, str], CudaKernels] = {}
_LOADED_LOCK = threading.Lock()


def launchable(signatures: Sequence[KernelSignature]) -> list[KernelSignature]:
    return [s for s in signatures if s.extern_c and s.params is not None]


def load_cuda(cuda_source: str, *, backend: str | None = None, cache_dir: str | os.PathLike | None = None,
              arch: str | None = None) -> CudaKernels:
    """Build (or fetch from the build cache) `cuda_source` for the current GPU and return its kernels' handle.

    Raises `CudaCompileError` (file/line/message diagnostics) when the source does not compile.
    """
    if not isinstance(cuda_source, str):
        raise TypeError(f"load_cuda takes the CUDA_SRC string, got {type(cuda_source).__name__}")
    chain = toolchain(backend, arch)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    memo = (hashlib.sha256(cuda_source.encode()).hexdigest(), chain.key())
    with _LOADED_LOCK:
        if memo in _LOADED:
            return _LOADED[memo]
    signatures = launchable(parse_kernels(cuda_source))
    try:
        handle = _load(cuda_source, signatures, chain, folder, memo[0])
    except CudaCompileError as error:
        error.cuda_source = cuda_source  # type: ignore[attr-defined] - lets compile_log quote the offending lines
        raise
    with _LOADED_LOCK:
        _LOADED[memo] = handle
    return handle


def _load(cuda_source: str, signatures: list[KernelSignature], chain: Toolchain, folder: Path,
          source_hash: str) -> CudaKernels:
    if chain.backend == "load_inline":
        module = _build_extension(cuda_source, signatures, chain, folder)
        kernels = {s.name: _Kernel(s, _extension_launcher(module, s.name)) for s in signatures}
        return CudaKernels(kernels, "load_inline", source_hash)
    build = build_cubin(cuda_source, chain, folder)
    loaded = _CubinModule(build.cubin(), signatures)
    kernels = {s.name: _Kernel(s, loaded.launcher(s.name), checked_packing=True) for s in signatures}
    return CudaKernels(kernels, chain.backend, build.key)


def clear_loaded() -> None:
    """Forget the handles loaded in this process (tests; a fresh `load_cuda` then rebuilds or hits the cache)."""
    with _LOADED_LOCK:
        _LOADED.clear()
