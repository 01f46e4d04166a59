"""`TritonLanguage`: Triton kernels launched from a Python `kernel_function` wrapper.

Screening adds Triton's own names to the common policy (`triton.jit`, `autotune`, `heuristics`, `Config`, `cdiv`,
`next_power_of_2`, device queries through `triton.runtime.driver.active`, and all of `triton.language` that stays
inside `triton.language`, its enum members such as `tl.PropagateNan.ALL` included), then checks the file's
structure: a top-level `def kernel_function(...)` and at least one `@triton.jit` function. Whether
`kernel_function` really launches its kernels, and whether PyTorch computes anything on its behalf, is checked while
it runs (`launch_monitor()`, `forge.checking.launch_check`): a static check by name refused a kernel picked
from a per-shape cache and let a no-op launch beside tensor math pass.

On a machine without a GPU the sandbox runs Triton kernels on CPU tensors through the interpreter
(`TRITON_INTERPRET=1`), where a failure inside a kernel body (what the GPU compiler would refuse) surfaces as
`InterpreterError`, and an autotuner runs its first config (there is no device to time; `triton_hooks`).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from agent.languages.base import ExceptionClass, KernelLanguage, PromptFragments
from agent.languages.triton.hooks import install_interpreter_autotune, install_triton_hooks, interpreting
from agent.languages.triton.launch import install_cached_launchers, launch_cache_enabled
from agent.screening import policy
from agent.screening.python_ast import PythonRules, analyse_python
from agent.screening.violation import Violation
from forge.checking.launch_check import LaunchMonitor

__all__ = ["MODULE_RULES", "TRITON_ALLOWED", "TritonLanguage", "module_host_attributes", "module_torch_allowed",
           "triton_function_internals", "triton_language_constant", "triton_reference_problem"]

TRITON_ALLOWED: frozenset[str] = frozenset(
    {
        "triton.jit", "triton.autotune", "triton.heuristics", "triton.Config", "triton.cdiv",
        "triton.next_power_of_2", "triton.__version__", "triton.language",
        "triton.runtime.driver.active.get_current_device", "triton.runtime.driver.active.get_current_target",
        "triton.runtime.driver.active.get_active_torch_device",
        "triton.runtime.driver.active.utils.get_device_properties",
    }
)
_TRITON_NAMESPACES = frozenset(
    {"triton.runtime", "triton.runtime.driver", "triton.runtime.driver.active", "triton.runtime.driver.active.utils"}
)
_COMPILE_ERROR_NAMES = {"CompilationError", "CompileTimeAssertionFailure", "UnsupportedLanguageConstruct",
                        "InterpreterError", "OutOfResources", "PTXASError"}


def triton_reference_problem(qualname: str) -> str | None:
    """Why a reference to `triton.<...>` is refused, or None."""
    if qualname in TRITON_ALLOWED:
        return None
    parts = qualname.split(".")
    if qualname.startswith("triton.language."):
        if any(p.startswith("_") and p not in policy.SAFE_DUNDERS for p in parts[2:]):
            return f"{qualname} is a private Triton internal"
        for i in range(3, len(parts) + 1):
            value = policy.lookup(".".join(parts[:i]))
            if isinstance(value, types.ModuleType) and not value.__name__.startswith("triton.language"):
                return f"{qualname} leaves triton.language (reaches module {value.__name__})"
        return None
    return (f"{qualname} is not on the Triton allow-list (triton.jit, autotune, heuristics, Config, cdiv, "
            "next_power_of_2, triton.language.*, triton.runtime.driver.active device queries)")


def triton_language_constant(qualname: str) -> bool:
    """A member of an enum class that `triton.language` exposes (`tl.PropagateNan.ALL`, `tl.PropagateNan.NONE`, and
    any other enum of the installed Triton), reached through an allowed `triton.language` name: a constant, in
    device and host code alike. Why it opens nothing: the member is an instance of the enum, not a function, module
    or class; only the names in the enum's `__members__` qualify (not its methods, `mro`, `_missing_`, dunders), and
    an attribute read past the member (`.value`, `.name`) is still judged as a value's attribute. Triton before 3.7
    exposes some of these as pybind11 enums of its C++ IR (`triton._C.libtriton.ir.PROPAGATE_NAN`), which are not
    `enum.Enum`s but have the same `__members__` mapping to instances of the class: both count."""
    if not qualname.startswith("triton.language."):
        return False
    owner, _, member = qualname.rpartition(".")
    if triton_reference_problem(owner) is not None:
        return False
    cls = policy.lookup(owner)
    if isinstance(cls, enum.EnumMeta):
        return member in cls.__members__
    members = getattr(cls, "__members__", None) if isinstance(cls, type) else None
    return isinstance(members, dict) and member in members and isinstance(members[member], cls)


# Compiler internals of Triton's dtypes that kernels have no use for.
_DEVICE_ATTRIBUTES_DENIED = frozenset({"to_ir", "mangle", "codegen_name", "cache_key_part", "handle"})
# Instance attributes of Triton tensors and dtypes (not visible on their classes); `handle` (the IR or, under the
# interpreter, the backing array) is deliberately absent.
_DEVICE_INSTANCE_ATTRIBUTES = frozenset({"shape", "dtype", "type", "numel", "T", "element_ty", "value",
                                         "primitive_bitwidth", "fp_mantissa_width", "int_bitwidth", "int_signedness",
                                         "exponent_bias", "name", "itemsize"})


@functools.cache
def triton_device_attributes() -> frozenset[str]:
    """Attributes `@triton.jit` code may read on its values: the public methods of `tl.tensor` and of Triton's
    dtypes in the installed Triton (so the list follows Triton versions), plus their instance fields."""
    import triton.language as tl

    names = set(_DEVICE_INSTANCE_ATTRIBUTES)
    for cls_name in ("tensor", "dtype", "pointer_type", "block_type", "constexpr"):
        cls = getattr(tl, cls_name, None) or getattr(tl.core, cls_name, None)
        if cls is not None:
            names.update(n for n in dir(cls) if not n.startswith("_"))
    return frozenset(names - _DEVICE_ATTRIBUTES_DENIED)


def _triton_kernel_classes() -> list[type]:
    """The classes of the Triton objects host code can hold without an internal name: a kernel of the file (the JIT
    function and its bases, the autotuner and heuristics wrappers, the interpreter's function), what `kernel[grid]`
    gives under `TRITON_INTERPRET=1` (the grid executor), what a launch returns (the compiled kernel), and the
    harness's cached launcher that replaces `run` (`agent.languages.triton.launch`). Objects reached only through one
    of their internal names (`kernel.params`, `compiled.asm`, `kernel.rewrite()`) need no entry. Looked up by name,
    so a Triton version without one just skips it."""
    import importlib

    from agent.languages.triton import launch as triton_launch

    wanted = {
        "triton.runtime.jit": ("JITFunction", "JITCallable", "KernelInterface"),
        "triton.runtime.autotuner": ("Autotuner", "Heuristics"),
        "triton.runtime.interpreter": ("InterpretedFunction", "GridExecutor"),
        "triton.compiler.compiler": ("CompiledKernel",),
    }
    classes: list[type] = [triton_launch.CachedLauncher]
    for module_name, names in wanted.items():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - a Triton without this module has none of these classes
            continue
        classes.extend(c for c in (getattr(module, n, None) for n in names) if isinstance(c, type))
    return classes


# Attributes of those objects that hold only what the file gave or plain data, left readable because honest helper
# classes use the names: `GridExecutor.grid` is the grid the file passed to `kernel[grid]`; `CompiledKernel.kernel` is
# the compiled binary's bytes (`JITFunction.kernel` is None).
_HARMLESS_KERNEL_ATTRIBUTES = frozenset({"grid", "kernel"})


@functools.cache
def triton_function_internals() -> frozenset[str]:
    """Every attribute of the Triton objects host code can hold (`_triton_kernel_classes`: class attributes and the
    instance attributes their methods set, `policy.class_attribute_names`), e.g. `fn`, `src`, `get_capture_scope`,
    `used_global_vals`, `device_caches`, `run`, `configs`, `asm`: the names the file's own classes and the torch.nn
    layer names may not add to host code's attributes (a file defining `self.get_capture_scope = 1` must not make
    `kernel.get_capture_scope()` readable). Derived from the installed Triton, so it follows Triton versions; less
    `_HARMLESS_KERNEL_ATTRIBUTES`."""
    return policy.class_attribute_names(_triton_kernel_classes()) - _HARMLESS_KERNEL_ATTRIBUTES


@functools.cache
def module_host_attributes() -> frozenset[str]:
    """What module problems' host code may read on values screening cannot type, beyond `policy.HOST_ATTRIBUTES`:
    the torch.nn layers' parameter, buffer and setting names (`policy.module_attributes()`, derived from the live
    torch: `weight`, `bias`, `kernel_size`, `padding`, `num_groups`, `running_mean`, `normalized_shape`, ...), less
    every Triton kernel attribute (`triton_function_internals()`). So `conv = self.conv; conv.weight` and a helper
    taking the layer (`def _params(gn): return gn.num_groups, gn.eps`) pass; on a Triton kernel, function or frame
    these names do not exist."""
    return policy.module_attributes() - triton_function_internals()


@functools.lru_cache(maxsize=64)
def _instance_rules(attributes: frozenset[str]) -> PythonRules:
    extra = attributes - triton_function_internals()
    return dataclasses.replace(MODULE_RULES, host_attributes=lambda: module_host_attributes() | extra)


@functools.cache
def module_function_internals() -> frozenset[str]:
    """For module problems, Triton's kernel attributes plus the methods of nn.Module (`policy.module_methods()`): the
    file's own method names (`forward`, ...) must not open `train`, `apply` or `set_submodule` on a layer class
    reached as a value, where they come unbound."""
    return triton_function_internals() | policy.module_methods()


TRITON_RULES = PythonRules(
    extra_import_roots=frozenset({"triton"}),
    reference_rules={"triton": triton_reference_problem},
    namespaces=_TRITON_NAMESPACES,
    device_decorators=frozenset({"triton.jit"}),
    device_attributes=triton_device_attributes,
    function_internals=triton_function_internals,
    constants=triton_language_constant,
)


# Random initialisers a `ModelNew` uses to create its parameters exactly as the reference `Model` does.
_MODULE_PARAMETER_INIT = frozenset({"torch.randn", "torch.rand", "torch.randint", "torch.randn_like",
                                    "torch.rand_like"})


# torch.nn.init functions that are no initialiser: `_make_deprecate(fn)` wraps a function the file gives it.
_INIT_DENIED = frozenset({"_make_deprecate"})


def module_torch_allowed(qualname: str) -> bool:
    """`torch.nn` layer classes, `torch.nn.Parameter`, the functions of `torch.nn.init` and the random initialisers
    (`torch.randn` ...): what a KernelBench `ModelNew` needs to create the same parameters as the reference `Model`
    under the same seed; and the library calls a module may make for products, convolutions and attention
    (`policy.LIBRARY_CALLS`). The rest of `torch.nn.functional` stays refused.

    Of `torch.nn.init` only the functions it defines itself (`kaiming_uniform_`, `_calculate_fan_in_and_fan_out`
    ...), one level deep: the module also holds the modules it imported (`torch`, `math`, `warnings`) and `Tensor`,
    and a prefix allowance let `nn.init.torch.compile`, `nn.init.torch.ops.aten.softmax` and
    `nn.init.torch.sys._getframe` through."""
    if qualname in _MODULE_PARAMETER_INIT or qualname in policy.LIBRARY_CALLS:
        return True
    parts = qualname.split(".")
    if parts[:2] != ["torch", "nn"] or len(parts) < 3:
        return False
    if parts[2] == "init":
        if len(parts) != 4 or parts[3] in _INIT_DENIED:
            return False
        value = policy.lookup(qualname)
        return isinstance(value, types.FunctionType) and value.__module__ == "torch.nn.init"
    return len(parts) == 3 and parts[2][:1].isupper()


MODULE_RULES = PythonRules(
    extra_import_roots=TRITON_RULES.extra_import_roots,
    reference_rules=TRITON_RULES.reference_rules,
    namespaces=TRITON_RULES.namespaces,
    device_decorators=TRITON_RULES.device_decorators,
    device_attributes=TRITON_RULES.device_attributes,
    torch_allowed=module_torch_allowed,
    host_attributes=module_host_attributes,
    function_internals=module_function_internals,
    constants=TRITON_RULES.constants,
    construction_compute=True,
)


@functools.cache
def _runtime_roots() -> tuple[Path, ...]:
    """Directories whose ATen ops are not the candidate's: Triton's package and the harness's languages/sandbox."""
    import triton

    agent_root = Path(__file__).resolve().parents[2]  # agent/languages/triton/language.py -> agent
    return (Path(triton.__file__).resolve().parent, agent_root / "languages", agent_root / "sandbox")


class TritonLanguage(KernelLanguage):
    """Triton: `@triton.jit` kernels plus a Python `kernel_function` that allocates outputs and launches them."""
    compute_bound_hint: ClassVar[str] = (
        "use tl.dot on tiles (bf16/fp16 inputs, fp32 accumulation; fp32 inputs with input_precision='ieee'), larger "
        "tiles, tune num_warps/num_stages, keep operands in registers/shared memory, grouped tile ordering for L2 "
        "reuse")

    name = "triton"
    display_name = "Triton"
    file_suffix = ".py"
    fence_tags = ("python", "py", "triton")
    entry_point = "kernel_function"

    def screen(self, source: str, function_name: str | None = None) -> list[Violation]:
        analysis = analyse_python(source, TRITON_RULES, function_name)
        violations = list(analysis.violations)
        if analysis.tree is None:
            return violations
        entry = self.entry_point
        fn = analysis.functions.get(entry)
        if fn is None:
            violations.append(Violation(entry, 0, f"no top-level `def {entry}(...)`: the file must define it as the "
                                        "entry point the harness calls with the op's arguments", "structure"))
        elif entry in analysis.device_functions:
            violations.append(Violation(entry, fn.lineno, f"`{entry}` must be a plain Python wrapper that launches "
                                        "@triton.jit kernels, not a @triton.jit kernel itself", "structure"))
        if not analysis.device_functions - {entry}:
            violations.append(Violation("@triton.jit", 0, "no @triton.jit kernel: the computation must be written as "
                                        "a Triton kernel", "structure"))
        return violations

    def load(self, path: str | Path, module_name: str, entry_point: str | None = None) -> Callable:
        """Import as the base class does, then give the module's `@triton.jit` kernels cached launchers
        (`agent.languages.triton.launch`: a repeated launch skips the JIT's argument binding; off when
        `$KFORGE_TRITON_LAUNCH_CACHE=0`). On the interpreter, autotuners run their first config (installed before
        the import; `agent.languages.triton.hooks`)."""
        if interpreting():
            install_interpreter_autotune()
        entry = super().load(path, module_name, entry_point)
        if launch_cache_enabled():
            install_cached_launchers(sys.modules[module_name])
        return entry

    def screen_module(self, source: str, attributes: frozenset[str] = frozenset()) -> list[Violation]:
        """Screen a KernelBench-format `ModelNew` file: the same bans, plus a top-level `class ModelNew` and at least
        one `@triton.jit` kernel (torch.nn layer classes may be built, to hold the reference's parameters, and
        PyTorch compute ops called in the `__init__` of construction-only classes, to build buffers as the reference
        does: `MODULE_RULES.construction_compute`). `attributes`: the live instance's submodule, parameter and
        setting names (`forge.modules.attribute_names`), readable in host code like the torch.nn layers' names,
        less every Triton kernel attribute."""
        rules = MODULE_RULES if not attributes else _instance_rules(frozenset(attributes))
        analysis = analyse_python(source, rules, None)
        violations = list(analysis.violations)
        if analysis.tree is None:
            return violations
        if not any(isinstance(stmt, ast.ClassDef) and stmt.name == "ModelNew" for stmt in analysis.tree.body):
            violations.append(Violation("ModelNew", 0, "no top-level `class ModelNew(nn.Module)`: the file must define "
                                        "it with the reference Model's constructor arguments", "structure"))
        if not analysis.device_functions:
            violations.append(Violation("@triton.jit", 0, "no @triton.jit kernel: the computation must be written as "
                                        "Triton kernels", "structure"))
        return violations

    def launch_monitor(self) -> LaunchMonitor:
        """Counts launches of `@triton.jit` kernels (also autotuned, heuristics, compiled, cached and interpreted
        ones; `agent.languages.triton.hooks`) and records the ATen ops the candidate's own code runs; ops made by
        Triton's runtime (the interpreter's argument copies, an autotuner's timing) or the harness are not the
        candidate's. Installs the launch-counting hooks (call it before loading the candidate; cached launchers made
        earlier are re-bound). The candidate runs in the same process, so a kernel could tamper with this; the static
        screen forbids the constructs needed."""
        install_triton_hooks()
        return LaunchMonitor(self.name, ignored_roots=_runtime_roots())

    def device_types(self) -> tuple[str, ...]:
        """CUDA (also ROCm builds of torch) and, through the Triton interpreter, CPU."""
        return ("cuda", "cpu")

    def child_environment(self, device_type: str, scratch: Path) -> dict[str, str]:
        """The interpreter on CPU; the Triton cache is the child's own (`TRITON_CACHE_DIR` in its scratch, set for
        every child by `forge.sandbox.environment`)."""
        return {"TRITON_INTERPRET": "1"} if device_type == "cpu" else {}

    def classify_exception(self, exc: BaseException) -> ExceptionClass:
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            module = type(current).__module__ or ""
            if module.startswith("triton") and (
                type(current).__name__ in _COMPILE_ERROR_NAMES or module.startswith("triton.compiler")
            ):
                return "compile_error"
            current = current.__cause__ or current.__context__
        return "runtime_error"

    def prompt_fragments(self) -> PromptFragments:
        """Triton's fragments ship with the built-in prompts (`prompts/triton/`); its example is
        `agent/examples/triton_example.py`."""
        from agent.examples import EXAMPLES_DIR
        from prompts import PROMPTS_DIR

        return PromptFragments(
            display_name=self.title, kernel_noun="`@triton.jit`", template_dir=Path(PROMPTS_DIR) / "triton",
            system_rules="system_rules.j2", rules="rules.j2", speed="speed.j2", example_intro="example_intro.j2",
            example_file=Path(EXAMPLES_DIR) / "triton_example.py", reply_fence="python",
        )

    def toolchain_key(self) -> str:
        return f"triton {_triton_version()}"

    def environment(self) -> dict[str, Any]:
        return {"triton": _triton_version()}

    def compile_log(self, exc: BaseException) -> str:
        parts: list[str] = []
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen and len(parts) < 4:
            seen.add(id(current))
            parts.append(f"{type(current).__module__}.{type(current).__qualname__}: {current}")
            current = current.__cause__
        return "\n".join(parts)


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:  # noqa: BLE001 - triton is a dependency; a broken install keys as unknown
        return None
