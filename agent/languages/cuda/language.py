"""`CudaLanguage`: CUDA C++ kernels in a `CUDA_SRC` string, launched from a Python `kernel_function`.

Everything the rest of the agent needs from the language is here (one seam per language): prompt fragments and the
example file (`prompt_fragments()`), reply fences (`fence_tags`, `extract_reply`), screening (`screen`), the
toolchain fingerprint (`toolchain_key()` for cache keys, `environment()` for the plan), the sandbox child's
environment (`child_environment`, `shared_caches`), the build step (`build`, `build_pool`, and
`candidate_build_pool`, which the generator uses to compile screened candidates on CPU threads before they queue for
the GPU sandbox), the loader (`load`, inherited: importing the file runs `load_cuda(CUDA_SRC)`, which fetches the
cubin from the build cache or compiles it) and the run-time launch check (`launch_monitor`: the same rules as
Triton's, fed by the runtime's launch observer).
"""

from __future__ import annotations

import os
import re
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from agent.languages.base import ExceptionClass, KernelLanguage, PromptFragments
from agent.languages.cuda.build import Build, BuildPool, build_cubin, default_cache_dir
from agent.languages.cuda.diagnostics import CudaCompileError, format_diagnostics
from agent.languages.cuda.screening import screen_cuda_file
from agent.languages.cuda.source import CUDA_SOURCE_NAME, extract_cuda_source
from agent.languages.cuda.toolchain import TOOLCHAIN_ENV, Toolchain, default_backend, toolchain
from agent.screening.violation import Violation

if TYPE_CHECKING:
    from forge.checking.launch_check import LaunchMonitor

__all__ = ["CudaLanguage"]

PACKAGE_DIR = Path(__file__).parent


def _runtime_roots() -> tuple[Path, ...]:
    """Directories whose ATen ops are not the candidate's: the harness's languages (the CUDA runtime) and sandbox."""
    agent_root = PACKAGE_DIR.parents[1]
    return (agent_root / "languages", agent_root / "sandbox")


class CudaLanguage(KernelLanguage):
    """CUDA C++: `extern "C" __global__` kernels in `CUDA_SRC`, a Python `kernel_function` that launches them."""

    name = "cuda"
    display_name: ClassVar[str] = "CUDA C++"
    compute_bound_hint: ClassVar[str] = (
        "use tensor cores on tiles (`<mma.h>` wmma fragments for bf16/fp16 inputs with fp32 accumulation; fp32 inputs "
        "stay on IEEE FMA, no TF32), larger tiles staged through shared memory (cp.async via `<cuda_pipeline.h>`), "
        "several outputs per thread in registers, grouped tile ordering for L2 reuse")
    file_suffix = ".py"
    fence_tags = ("python", "py", "python3", "cuda", "cu", "cpp", "c++")
    entry_point = "kernel_function"
    example_name: ClassVar[str] = "cuda_example.py"

    # ------------------------------------------------------------------------------------------ prompts
    def prompt_fragments(self) -> PromptFragments:
        folder = PACKAGE_DIR / "prompts"
        return PromptFragments(
            display_name=self.display_name,
            kernel_noun='`extern "C" __global__`',
            template_dir=folder,
            system_rules="system_rules.j2",
            rules="rules.j2",
            speed="speed.j2",
            example_intro="example_intro.j2",
            example_file=PACKAGE_DIR / self.example_name,
            reply_fence="python",
        )

    # ------------------------------------------------------------------------------------------ replies
    def extract_reply(self, text: str):  # -> ExtractedCode | None (agent.replies; imported lazily)
        """The candidate file in an LLM reply: the Python block defining `kernel_function`; when that block has no
        `CUDA_SRC` and the reply has exactly one ```cuda/```cu/```cpp block with a `__global__` kernel, that block is
        spliced in as `CUDA_SRC = r\"\"\"...\"\"\"` after the imports (models often split the two)."""
        from agent.replies import ExtractedCode, extract_code

        chosen = None
        for tag in ("python", "cuda"):
            chosen = extract_code(text, tag)
            if chosen is not None and re.search(r"^\s*def\s+kernel_function\s*\(", chosen.code, re.MULTILINE):
                break
            chosen = None
        if chosen is None:
            return None
        if re.search(rf"^{CUDA_SOURCE_NAME}\s*[:=]", chosen.code, re.MULTILINE):
            return chosen  # the file has its own CUDA_SRC (screening judges it)
        device_blocks = []
        for tag in ("cuda", "cu", "cpp", "c++"):
            block = extract_code(text, tag, entry_points=())
            if block is not None and "__global__" in block.code and block.code not in device_blocks:
                device_blocks.append(block.code)
        if len(device_blocks) != 1 or '"""' in device_blocks[0]:
            return chosen
        code = _splice_cuda_source(chosen.code, device_blocks[0])
        return ExtractedCode(code=code, block_count=chosen.block_count,
                             note=chosen.note + "; CUDA_SRC taken from the reply's separate CUDA block")

    # ------------------------------------------------------------------------------------------ screening
    def screen(self, source: str, function_name: str | None = None) -> list[Violation]:
        return screen_cuda_file(source, function_name, self.entry_point)

    def launch_monitor(self) -> LaunchMonitor:
        """The run-time launch check (`forge.checking.launch_check`): counts launches of the candidate's own
        `extern "C" __global__` kernels (`kernels.k[grid, block](...)` on the `load_cuda` handle; the runtime's
        launch observer, `runtime.install_launch_counting`) and records the ATen ops the candidate's Python runs; ops
        made by the harness's runtime (`agent.languages`, `forge.sandbox`) are not the candidate's. So a launcher
        that launches nothing and returns PyTorch's result, or lets PyTorch compute beside a launch, is refused like
        a Triton one. Installs the counting observer (imports torch); call it before loading the candidate."""
        from agent.languages.cuda.runtime import install_launch_counting
        from forge.checking.launch_check import LaunchMonitor

        install_launch_counting()
        return LaunchMonitor(self.name, ignored_roots=_runtime_roots())

    def device_types(self) -> tuple[str, ...]:
        """CUDA only: there is no CPU interpreter for CUDA C++ (CPU CI compiles, it does not run)."""
        return ("cuda",)

    # ------------------------------------------------------------------------------------------ toolchain
    def toolchain(self, arch: str | None = None) -> Toolchain:
        return toolchain(None, arch)

    def toolchain_key(self, arch: str | None = None) -> str:
        """For kernel-cache keys: backend, arch and compiler version (a new compiler or GPU is a miss)."""
        return self.toolchain(arch).key()

    def environment(self, arch: str | None = None) -> dict[str, str | None]:
        """For the plan's environment record."""
        return self.toolchain(arch).to_dict()

    # ------------------------------------------------------------------------------------------ sandbox
    def child_environment(self, device_type: str, scratch: Path) -> dict[str, str]:
        """The child's own build cache in its scratch (what it compiles dies with it), the shared cache of cubins
        the parent's build pool compiled (`shared_caches`, read-only inside the boundary, looked up first), and the
        parent's toolchain pinned so the child computes the same build keys as the parent's `build_pool` (it then
        loads the precompiled cubin without needing a compiler inside the sandbox)."""
        cache = scratch / "cuda"
        env = {"KFORGE_CUDA_CACHE": str(cache), "KFORGE_CUDA_SHARED_CACHE": str(self.shared_cache()),
               "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions")}
        for name in ("KFORGE_CUDA_BACKEND", "KFORGE_NVRTC_LIBRARY"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        try:
            chain = toolchain()
        except Exception:  # noqa: BLE001 - no torch CUDA here: the child works its toolchain out itself
            chain = None
        if chain is not None and chain.arch is not None:
            env[TOOLCHAIN_ENV] = chain.to_json()
        return env

    @staticmethod
    def shared_cache() -> Path:
        """Where this process's build pool puts cubins for sandbox children (created)."""
        from forge.sandbox.isolation import sandbox_cache_dir

        folder = sandbox_cache_dir() / "cuda"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def shared_caches(self) -> list[Path]:
        return [self.shared_cache()]

    # ------------------------------------------------------------------------------------------ build
    def build(self, source: str, *, arch: str | None = None, cache_dir: str | os.PathLike | None = None) -> Build:
        """Compile a candidate file's CUDA_SRC into the build cache (raises `CudaCompileError`, or ValueError when
        the file has no literal CUDA_SRC)."""
        cuda_source = _cuda_source_of(source)
        return build_cubin(cuda_source, self._cubin_toolchain(arch), cache_dir)

    def build_pool(self, *, arch: str | None = None, cache_dir: str | os.PathLike | None = None,
                   max_workers: int | None = None) -> CandidateBuildPool:
        """A thread pool that compiles candidate files while the GPU checks others. Pass `cache_dir=
        self.shared_cache()` so sandbox children find the cubins."""
        return CandidateBuildPool(BuildPool(self._cubin_toolchain(arch), cache_dir or default_cache_dir(),
                                            max_workers))

    def candidate_build_pool(self) -> CandidateBuildPool | None:
        """The build pool whose cubins sandbox children load (`shared_cache()`, this process's toolchain, which
        `child_environment` pins in the child, so both compute the same build key); None where nothing can be built
        ahead: no GPU arch here, or the `load_inline` backend (its children build torch extensions, not cubins)."""
        if default_backend() == "load_inline":
            return None
        try:
            chain = self._cubin_toolchain(None)
        except Exception:  # noqa: BLE001 - no torch CUDA: the children work their toolchain out themselves
            return None
        if chain.arch is None:
            return None
        return CandidateBuildPool(BuildPool(chain, self.shared_cache()))

    @staticmethod
    def _cubin_toolchain(arch: str | None) -> Toolchain:
        backend = default_backend()
        return toolchain("nvcc" if backend == "load_inline" else backend, arch)

    # ------------------------------------------------------------------------------------------ errors
    def classify_exception(self, exc: BaseException) -> ExceptionClass:
        return "compile_error" if _compile_error(exc) is not None else "runtime_error"

    def compile_log(self, exc: BaseException) -> str:
        error = _compile_error(exc)
        if error is None:
            return str(exc)
        return format_diagnostics(error.diagnostics, getattr(error, "cuda_source", None)) or error.log[-2000:]


class CandidateBuildPool:
    """`BuildPool` over candidate files: `submit(file_source)` -> Future[Build] (ValueError when no CUDA_SRC)."""

    def __init__(self, pool: BuildPool) -> None:
        self.pool = pool

    def submit(self, source: str) -> Future[Build]:
        try:
            cuda_source = _cuda_source_of(source)
        except ValueError as exc:
            failed: Future[Build] = Future()
            failed.set_exception(exc)
            return failed
        return self.pool.submit(cuda_source)

    def close(self, wait: bool = True) -> None:
        self.pool.close(wait)

    def __enter__(self) -> CandidateBuildPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cuda_source_of(source: str) -> str:
    extracted = extract_cuda_source(source)
    if extracted is None:
        raise ValueError(f"the file has no module-level {CUDA_SOURCE_NAME} string literal")
    return extracted[0]


def _compile_error(exc: BaseException) -> CudaCompileError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, CudaCompileError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _splice_cuda_source(python_code: str, cuda_code: str) -> str:
    """Insert `CUDA_SRC = r\"\"\"<cuda_code>\"\"\"` after the last top-level import of `python_code`."""
    lines = python_code.splitlines()
    last_import = max((i for i, line in enumerate(lines) if re.match(r"(import|from)\s+\w", line)), default=-1)
    block = [f'{CUDA_SOURCE_NAME} = r"""', *cuda_code.rstrip("\n").splitlines(), '"""', ""]
    return "\n".join(lines[: last_import + 1] + [""] + block + lines[last_import + 1:]) + "\n"
