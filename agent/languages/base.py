"""`KernelLanguage`: what the agent needs to know about one kernel language (screening, loading, running).

A language names itself, says how its sources are fenced in LLM replies and stored on disk, screens a source
statically, imports a stored source and returns its entry callable, and tells the sandbox which environment and
which exception classes belong to it, where its sandbox children keep their builds, whether it counts its own launches
(the run-time launch check) and whether it builds candidates ahead of the sandbox. Triton (`triton/`) and CUDA C++
(`cuda/`) implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from agent.screening.violation import Violation
from forge.source_files import import_source_file

if TYPE_CHECKING:
    from forge.checking.launch_check import LaunchMonitor

__all__ = ["CandidateBuilds", "ExceptionClass", "KernelLanguage", "PromptFragments"]

ExceptionClass = Literal["compile_error", "runtime_error"]


class CandidateBuilds(Protocol):
    """Builds candidate files ahead of the sandbox (`KernelLanguage.candidate_build_pool()`): `submit(file_source)`
    returns a Future that completes when the build is in the cache the sandbox children load from."""

    def submit(self, source: str) -> Future[Any]: ...

    def close(self, wait: bool = True) -> None: ...


@dataclass(frozen=True)
class PromptFragments:
    """What the prompt templates need from a language. `template_dir` holds the Jinja fragments the built-in
    templates include as `lang/<name>` (`system_rules`, `rules`, `speed`, `example_intro`; each rendered with the
    same variables as the template including it); `example_file` is shown verbatim as the example of a
    function-problem file; `kernel_noun` names the language's kernels in the system prompt."""

    display_name: str
    kernel_noun: str
    template_dir: Path
    system_rules: str
    rules: str
    speed: str
    example_intro: str
    example_file: Path
    reply_fence: str


class KernelLanguage(ABC):
    """One kernel language. Subclasses set the class attributes and implement `screen` and `device_types`; the
    defaults below (reply extraction, toolchain fingerprint) suit a Python file with no build step."""

    name: ClassVar[str]
    display_name: ClassVar[str] = ""
    file_suffix: ClassVar[str] = ".py"
    fence_tags: ClassVar[tuple[str, ...]] = ("python", "py")
    entry_point: ClassVar[str] = "kernel_function"
    # The optimize prompt's advice for a compute-bound kernel (`agent.prompting.views.Performance`), in the
    # language's own terms.
    compute_bound_hint: ClassVar[str] = (
        "use the GPU's matrix units on tiles (bf16/fp16 inputs, fp32 accumulation; IEEE fp32 for fp32 inputs), larger "
        "tiles, keep operands in registers/shared memory, grouped tile ordering for L2 reuse")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @abstractmethod
    def screen(self, source: str, function_name: str | None = None) -> list[Violation]:
        """Static checks of a candidate source; empty = allowed. `function_name` is the op being implemented."""

    @abstractmethod
    def device_types(self) -> tuple[str, ...]:
        """torch device types this language's kernels run on (e.g. `("cuda", "cpu")`)."""

    def screen_module(self, source: str, attributes: frozenset[str] = frozenset()) -> list[Violation]:
        """Static checks of a `ModelNew` file (a module problem); `attributes`, for a file written for a live
        instance, the names it may read on it (`forge.modules.attribute_names`: `original.gate_proj`). Languages that
        cannot write modules refuse it."""
        return [Violation("ModelNew", 0, f"{self.title} cannot write whole modules (ModelNew files); module problems "
                          "are written in Triton", "structure")]

    def load(self, path: str | Path, module_name: str, entry_point: str | None = None) -> Callable:
        """Import the source file at `path` as module `module_name` and return its entry callable (`entry_point`,
        default the language's; `"ModelNew"` for a module problem, whose class is returned).

        Raises whatever the import raises, or `AttributeError`/`TypeError` with a clear message when the entry point
        is missing or not callable. The module is registered in `sys.modules` (Triton and dataclasses need it).
        """
        path = Path(path)
        entry_point = entry_point or self.entry_point
        module = import_source_file(path, module_name)
        entry = getattr(module, entry_point, None)
        if entry is None:
            raise AttributeError(f"kernel source {path.name} defines no `{entry_point}`")
        if not callable(entry):
            raise TypeError(f"`{entry_point}` in {path.name} is a {type(entry).__name__}, not callable")
        return entry

    def launch_monitor(self) -> LaunchMonitor | None:
        """The run-time launch check's monitor for this language (`forge.checking.launch_check`), or None when the
        language cannot count its own kernels' launches. Call it before importing the candidate (it installs the
        language's launch-counting hooks); then `with monitor.watch(inputs) as record: out = candidate(...)` and
        `launch_issues(records)`."""
        return None

    def child_environment(self, device_type: str, scratch: Path) -> dict[str, str]:
        """Extra environment variables for a sandbox child running kernels on `device_type`; `scratch` is the
        child's private writable folder (its compiled kernels go there, and die with it)."""
        return {}

    def shared_caches(self) -> list[Path]:
        """Folders this process fills for sandbox children and they only read (under
        `forge.sandbox.isolation.sandbox_cache_dir()`, content-addressed; never a cache the parent loads code from):
        CUDA's prebuilt binaries. Default: none."""
        return []

    def candidate_build_pool(self) -> CandidateBuilds | None:
        """A pool that compiles candidates on CPU threads into the cache sandbox children load from, or None when
        the language has no separate build step (Triton compiles at the first launch, in the child)."""
        return None

    def classify_exception(self, exc: BaseException) -> ExceptionClass:
        """Whether an exception raised while running a candidate is a compile error of this language."""
        return "runtime_error"

    def compile_log(self, exc: BaseException) -> str:
        """The compiler's message for a compile error (an excerpt is shown to the agent)."""
        return str(exc)

    @property
    def title(self) -> str:
        """The name shown in prompts and reports (`display_name`, else the capitalised `name`)."""
        return self.display_name or self.name.capitalize()

    def prompt_fragments(self) -> PromptFragments:
        """The language's prompt fragments and example file (see `PromptFragments`)."""
        raise NotImplementedError(f"kernel language {self.name!r} has no prompt fragments; the agent cannot ask for "
                                  "it (implement KernelLanguage.prompt_fragments)")

    def extract_reply(self, text: str) -> Any:
        """The candidate file in an LLM reply (`agent.replies.ExtractedCode`), or None when there is none."""
        from agent.replies import extract_code

        return extract_code(text)

    def toolchain_key(self) -> str:
        """What makes a compiled kernel of this language reusable (compiler and runtime versions), for the kernel
        cache's key: a new compiler is a miss."""
        return ""

    def environment(self) -> dict[str, Any]:
        """The toolchain, for the plan's environment record."""
        return {}
