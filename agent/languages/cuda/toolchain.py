"""Where the CUDA compilers are and what they are: the toolchain fingerprint of cache keys and the plan environment.

Two compilers turn `CUDA_SRC` into a cubin: NVRTC (in process, through `ctypes` on `libnvrtc`; no cuda-python
package needed, so its API churn cannot break the harness) and `nvcc` (a subprocess). `load_inline` (torch's C++
extension build) is the third backend; it uses nvcc too. NVRTC is found at `$KFORGE_NVRTC_LIBRARY`, then beside the
`nvidia-cuda-nvrtc` wheel that torch's CUDA builds depend on (`site-packages/nvidia/cu13/lib`, `.../cuda_nvrtc/lib`),
then under `$CUDA_HOME`/`/usr/local/cuda`, then by soname. Its `libnvrtc-builtins` must be loaded first with
RTLD_GLOBAL (NVRTC 13 refuses to compile otherwise: "failed to open libnvrtc-builtins.so.13.0").

`fingerprint(arch)` = backend, compiler versions, arch and torch's CUDA version: a new compiler or GPU is a new
cache key, so no stale cubin is ever loaded.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BACKENDS", "TOOLCHAIN_ENV", "Toolchain", "cuda_include_dirs", "default_backend", "device_arch",
           "find_nvcc", "nvcc_version", "nvrtc_library", "nvrtc_version", "toolchain"]

BACKENDS = ("nvrtc", "nvcc", "load_inline")
TOOLCHAIN_ENV = "KFORGE_CUDA_TOOLCHAIN"


def _cuda_homes() -> list[Path]:
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    out = [Path(h) for h in homes if h]
    nvcc = shutil.which("nvcc")
    if nvcc:
        out.append(Path(os.path.realpath(nvcc)).parent.parent)
    out.append(Path("/usr/local/cuda"))
    return [h for h in dict.fromkeys(out) if (h / "include" / "cuda_runtime.h").is_file()]


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p, "nvidia").is_dir()]


@functools.cache
def find_nvcc() -> str | None:
    """Path of nvcc ($PATH first, then the CUDA homes), or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in _cuda_homes():
        candidate = home / "bin" / "nvcc"
        if candidate.is_file():
            return str(candidate)
    return None


@functools.cache
def nvcc_version() -> str | None:
    """`13.0.88`-style version of nvcc, or None."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def _nvrtc_candidates() -> list[str]:
    out: list[str] = []
    if os.environ.get("KFORGE_NVRTC_LIBRARY"):
        out.append(os.environ["KFORGE_NVRTC_LIBRARY"])
    for site in _site_dirs():
        out += sorted(glob.glob(str(site / "nvidia" / "*" / "lib" / "libnvrtc.so*")))
    for home in _cuda_homes():
        out += sorted(glob.glob(str(home / "lib64" / "libnvrtc.so*")))
    out += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    return [c for c in dict.fromkeys(out) if "builtins" not in c and ".alt." not in c]


@functools.cache
def nvrtc_library() -> ctypes.CDLL | None:
    """The loaded NVRTC library (with its builtins preloaded), or None when there is none."""
    for candidate in _nvrtc_candidates():
        try:
            folder = Path(candidate).parent
            for builtins in sorted(glob.glob(str(folder / "libnvrtc-builtins.so*"))):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(candidate)
            lib.nvrtcVersion  # noqa: B018 - raises AttributeError when this is not NVRTC
            return lib
        except (OSError, AttributeError):
            continue
    return None


@functools.cache
def nvrtc_version() -> str | None:
    lib = nvrtc_library()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        return None
    return f"{major.value}.{minor.value}"


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
    """Folders with `cuda_fp16.h` & co. and CCCL (`cuda/std/...`, `cub/...`) for NVRTC's `-I`."""
    dirs: list[Path] = []
    for home in _cuda_homes():
        dirs += [home / "include", home / "include" / "cccl", home / "targets" / "x86_64-linux" / "include"]
    for site in _site_dirs():
        for inc in sorted(glob.glob(str(site / "nvidia" / "*" / "include"))):
            dirs += [Path(inc), Path(inc) / "cccl"]
    keep = [d for d in dict.fromkeys(dirs) if d.is_dir()]
    return tuple(str(d) for d in keep)


def device_arch(device: int | None = None) -> str | None:
    """`sm_90`-style arch of a CUDA device (the current one by default), or None without a GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(device)
    except Exception:  # noqa: BLE001 - no driver, no device: no arch
        return None
    return f"sm_{major}{minor}"


def default_backend() -> str:
    """`$KFORGE_CUDA_BACKEND` when set, else NVRTC when its library loads, else nvcc (see BENCHMARKS for why)."""
    chosen = os.environ.get("KFORGE_CUDA_BACKEND", "").strip().lower()
    if chosen:
        if chosen not in BACKENDS:
            raise ValueError(f"KFORGE_CUDA_BACKEND={chosen!r}; expected one of {', '.join(BACKENDS)}")
        return chosen
    return "nvrtc" if nvrtc_library() is not None else "nvcc"


@dataclass(frozen=True)
class Toolchain:
    """What builds a CUDA candidate; `key()` goes into build-cache and kernel-cache keys, `to_dict()` into plans."""

    backend: str
    arch: str | None
    nvrtc: str | None
    nvcc: str | None
    torch_cuda: str | None

    def key(self) -> str:
        """Backend, arch and the version of the compiler that backend uses (not the others: a sandbox child that
        cannot see nvcc still computes the key of an NVRTC build)."""
        compiler = f"nvrtc={self.nvrtc or '-'}" if self.backend == "nvrtc" else f"nvcc={self.nvcc or '-'}"
        return f"cuda:{self.backend}:{self.arch or 'noarch'}:{compiler}:torch_cuda={self.torch_cuda or '-'}"

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_dict(self) -> dict[str, str | None]:
        return {"backend": self.backend, "arch": self.arch, "nvrtc": self.nvrtc, "nvcc": self.nvcc,
                "torch_cuda": self.torch_cuda}

    @property
    def available(self) -> bool:
        """Whether this backend's compiler is present."""
        return self.nvrtc is not None if self.backend == "nvrtc" else self.nvcc is not None


def toolchain(backend: str | None = None, arch: str | None = None) -> Toolchain:
    """The toolchain for `backend` (default: `default_backend()`) targeting `arch` (default: the current GPU's).

    `$KFORGE_CUDA_TOOLCHAIN` (JSON of `Toolchain.to_dict()`, set by the language for sandbox children) is used as is
    when neither is given: a child computes the parent's build keys and loads the cubins the parent's `BuildPool`
    compiled, even where the compilers are not visible inside the sandbox.
    """
    import torch

    pinned = os.environ.get(TOOLCHAIN_ENV)
    if pinned and backend is None and arch is None:
        data = json.loads(pinned)
        return Toolchain(**{k: data.get(k) for k in ("backend", "arch", "nvrtc", "nvcc", "torch_cuda")})

    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown CUDA backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return Toolchain(backend=backend, arch=arch or device_arch(), nvrtc=nvrtc_version(), nvcc=nvcc_version(),
                     torch_cuda=torch.version.cuda)
