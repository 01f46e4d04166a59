"""Compile `CUDA_SRC` to a cubin for one arch, cached by source hash + toolchain; a thread pool for many candidates.

Every build compiles the same text: `PRELUDE` (fixed-width integer types through `<cuda/std/cstdint>`, which NVRTC
lacks otherwise: `int64_t` is "undefined" and `<cstdint>` "cannot be opened" under NVRTC 13), a `#line 1 "CUDA_SRC"`
directive (so every compiler message names CUDA_SRC lines), then the candidate's source. Options are the harness's,
never the model's: `-std=c++17`, `-arch=sm_XY` of the target device only (one cubin, no PTX, no fat binary), and
the CUDA include folders for NVRTC. The cache file is `<cache>/cubin/<sha256>.cubin`, the hash covering the text,
the options and `Toolchain.key()`, written atomically (`forge.atomic`), so concurrent builders and sandbox children
sharing a cache folder never read half a file. Failures are not cached (a fix prompt always gets a fresh log).

Parallel builds (`BuildPool`): threads, because NVRTC runs through ctypes (the GIL is released during the call) and
nvcc is a subprocess, so N threads use N cores while the GPU validates other candidates.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agent.languages.cuda.diagnostics import CompileDiagnostic, CudaCompileError, parse_compiler_output
from agent.languages.cuda.toolchain import Toolchain, cuda_include_dirs, find_nvcc, nvrtc_library
from forge.atomic import write_bytes_atomic

__all__ = ["PRELUDE", "Build", "BuildPool", "build_cubin", "compile_options", "compile_text", "default_cache_dir"]

logger = logging.getLogger(__name__)

PRELUDE = '#include <cuda/std/cstdint>\n#line 1 "CUDA_SRC"\n'
NVCC_TIMEOUT_S = 300


def default_cache_dir() -> Path:
    """`$KFORGE_CUDA_CACHE`, else `~/.cache/kforge/cuda` (sandbox children get their own through the language)."""
    configured = os.environ.get("KFORGE_CUDA_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "kforge" / "cuda"


def shared_cubin(key: str) -> Path | None:
    """A cubin the parent's build pool compiled, in `$KFORGE_CUDA_SHARED_CACHE` (a sandbox child reads it there,
    read-only; it never writes that folder), or None."""
    shared = os.environ.get("KFORGE_CUDA_SHARED_CACHE")
    path = Path(shared) / "cubin" / f"{key}.cubin" if shared else None
    return path if path is not None and path.is_file() and path.stat().st_size > 0 else None


def compile_text(cuda_source: str) -> str:
    """The exact text every backend compiles for `cuda_source`."""
    return PRELUDE + cuda_source


def compile_options(toolchain: Toolchain) -> tuple[str, ...]:
    if toolchain.arch is None:
        raise ValueError("no target arch: pass arch='sm_90' (or run where torch sees a CUDA GPU)")
    options = ("-std=c++17", f"-arch={toolchain.arch}")
    if toolchain.backend == "nvrtc":
        options += tuple(f"-I{d}" for d in cuda_include_dirs())
    return options


@dataclass(frozen=True)
class Build:
    """A compiled candidate: its cache key, cubin path, toolchain, wall seconds spent here, and whether it was a hit."""

    key: str
    path: Path
    toolchain: Toolchain
    seconds: float
    cached: bool

    def cubin(self) -> bytes:
        return self.path.read_bytes()


def build_key(cuda_source: str, toolchain: Toolchain) -> str:
    """sha256 over the compiled text, the options (minus include paths, which vary by machine) and the toolchain."""
    options = [o for o in compile_options(toolchain) if not o.startswith("-I")]
    payload = "\0".join([compile_text(cuda_source), *options, toolchain.key()])
    return hashlib.sha256(payload.encode()).hexdigest()


def _nvrtc_compile(text: str, options: tuple[str, ...]) -> bytes:
    lib = nvrtc_library()
    if lib is None:
        raise RuntimeError("NVRTC is not available (no libnvrtc found; set KFORGE_NVRTC_LIBRARY or use nvcc)")
    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"CUDA_SRC", 0, None, None)
    if status != 0:
        raise RuntimeError(f"nvrtcCreateProgram failed with status {status}")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log_buffer = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log_buffer)
        log = log_buffer.value.decode(errors="replace")
        if status != 0:
            raise CudaCompileError(parse_compiler_output(log), log, "nvrtc")
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        if size.value == 0 or lib.nvrtcGetCUBIN(prog, cubin) != 0:
            raise CudaCompileError([CompileDiagnostic("nvrtc", 0, "error", "NVRTC produced no cubin")], log, "nvrtc")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvcc_compile(text: str, options: tuple[str, ...]) -> bytes:
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc is not available (not on PATH nor under CUDA_HOME)")
    with tempfile.TemporaryDirectory(prefix="kforge-nvcc-") as folder:
        src, out = Path(folder, "kernel.cu"), Path(folder, "kernel.cubin")
        src.write_text(text)
        cmd = [nvcc, "-cubin", *options, "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S, cwd=folder)
        except subprocess.TimeoutExpired as exc:
            raise CudaCompileError([CompileDiagnostic("nvcc", 0, "error", f"nvcc ran over {NVCC_TIMEOUT_S} s")],
                                   str(exc), "nvcc") from None
        log = proc.stdout + proc.stderr
        if proc.returncode != 0 or not out.is_file():
            raise CudaCompileError(parse_compiler_output(log), log, "nvcc")
        return out.read_bytes()


def build_cubin(cuda_source: str, toolchain: Toolchain, cache_dir: str | os.PathLike | None = None) -> Build:
    """The cubin of `cuda_source` from the cache, or compiled now and stored (raises `CudaCompileError`)."""
    if toolchain.backend not in ("nvrtc", "nvcc"):
        raise ValueError(f"build_cubin builds with nvrtc or nvcc, not {toolchain.backend!r}")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = build_key(cuda_source, toolchain)
    path = folder / "cubin" / f"{key}.cubin"
    start = time.perf_counter()
    found = shared_cubin(key) or (path if path.is_file() and path.stat().st_size > 0 else None)
    if found is not None:
        return Build(key, found, toolchain, time.perf_counter() - start, cached=True)
    options = compile_options(toolchain)
    text = compile_text(cuda_source)
    cubin = _nvrtc_compile(text, options) if toolchain.backend == "nvrtc" else _nvcc_compile(text, options)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, cubin)
    seconds = time.perf_counter() - start
    logger.debug("built %s with %s in %.2f s", key[:12], toolchain.backend, seconds)
    return Build(key, path, toolchain, seconds, cached=False)


class BuildPool:
    """Compile candidates on CPU threads: `submit(cuda_source)` returns a Future of a `Build` (or its
    `CudaCompileError`); the caller keeps the GPU busy with other candidates meanwhile. Use as a context manager
    or call `close()`."""

    def __init__(self, toolchain: Toolchain, cache_dir: str | os.PathLike | None = None,
                 max_workers: int | None = None) -> None:
        self.toolchain = toolchain
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        workers = max_workers or max(1, min(8, (os.cpu_count() or 2) - 1))
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kforge-cuda-build")

    def submit(self, cuda_source: str) -> Future[Build]:
        return self._executor.submit(build_cubin, cuda_source, self.toolchain, self.cache_dir)

    def map(self, cuda_sources: Iterable[str]) -> list[Future[Build]]:
        return [self.submit(s) for s in cuda_sources]

    def close(self, wait: bool = True) -> None:
        """Stop the threads; `wait=False` drops queued builds and returns at once (running ones finish)."""
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self) -> BuildPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
