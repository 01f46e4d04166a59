"""Export a plan's module kernels as a local `kernels` repository, so a Hugging Face user loads them with
`kernels.kernelize` or transformers' `KernelConfig` as well as with `plan.apply`.

Why: transformers marks its swappable layers (`@use_kernel_forward_from_hub("RMSNorm")` on `LlamaRMSNorm`) and
swaps their forwards through the `kernels` package. `kernelize` gives *every* instance of a marked class the
layer's forward, with no look at the instance or the call; a plan's module entry serves only the instances
(`forge.modules.instance_key`: attributes such as `eps`, parameter shapes and dtypes) and the call signatures it was
judged on. So the exported layer carries the guard: its forward is one call to `ExportedKernels.serve`, which runs
the same guarded forward `plan.apply` installs (`forge.runtime.instance_forward`: signature guard, eligibility,
counters, the custom op under `torch.compile`) and the class's original forward for anything else.

A repository (kernels 0.19, a "universal" build: loads with the CPU and the CUDA torch):

    DIR/kernel_mapping.json                       {"RMSNorm": "/abs/DIR:RMSNorm"}, KernelConfig's local form
    DIR/build/torch-universal/metadata.json       id (unique per export: kernels caches a module by it), name,
                                                  the files' digest (kernels refuses an edited file at load)
    DIR/build/torch-universal/<name>/__init__.py  `from . import layers`; stats(), prepare(model), reset()
    DIR/build/torch-universal/<name>/layers.py    one class per layer name, its forward one call into here
    DIR/build/torch-universal/<name>/plan.json    the exported entries, a plan saved (and signed) like any other

Importing `layers.py` loads `plan.json` with `KernelOptimizationPlan.load`: a plan carrying generated code must be
signed with this machine's key, a tampered one raises `PlanLoadError` inside `kernelize` before any forward is
swapped, and every entry's code is loaded (screened) then. The layer's forward keeps the original's parameter names
and kinds (kernels checks the count and kinds); a parameter with a default gets the sentinel `UNSET`, so `serve`
knows which arguments the caller passed and rearranges them into the spelling of a judged call (the first `n`
positionally, the rest by name, as recorded): the signature keys then match the judged ones exactly.

What is not exported (each named in `HubExport.skipped`): F-call entries (kernels swaps module forwards), classes
that declare no layer name, blocks replayed from CUDA graphs (the graph holds what `plan.apply` routes inside the
block) and forwards taking `*args` or positional-only parameters (a layer cannot mirror them).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import torch
from torch import nn

from forge.custom_ops import DispatchStats
from forge.errors import UsageError
from forge.modules import MODULE_PREFIX, class_name, declared_layer, resolve_class
from forge.plan import KernelOptimizationPlan, PlanEntry
from forge.runtime import instance_forward
from forge.samples import signature_of

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["UNSET", "ExportedKernels", "HubExport", "HubExportError", "export_kernels", "load_exported",
           "loaded_exports"]

logger = logging.getLogger(__name__)

BUILD = "torch-universal"
MAPPING_FILE = "kernel_mapping.json"
PLAN_FILE = "plan.json"
_ID_PREFIX = "_kforge_"
_NAME = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")  # kernels' KernelName
_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD
_GRAPHED_TYPE = "cuda_graph_module"  # forge.providers.GraphedModuleProvider


class HubExportError(UsageError, ValueError):
    """A plan that cannot be exported as a `kernels` repository (or a folder it cannot be written to); the message
    names the problem and the fix."""


class _Unset:
    """The default of every layer parameter that has one: the argument was not passed."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


# ---------------------------------------------------------------------------------------------------------
# Serving: what the generated layers call
# ---------------------------------------------------------------------------------------------------------
class _Layout(NamedTuple):
    """A class's forward parameters in the order the layer passes them (positional-or-keyword, then keyword-only)."""

    names: tuple[str, ...]
    positional: int  # the leading names that may be passed positionally


class _Form(NamedTuple):
    """How a judged call was spelled: its first `positional` parameters positionally, `keywords` by name."""

    positional: int
    keywords: tuple[str, ...]


class _Instance:
    """One instance's routing, built at its first call: the entry serving it (None: none does) and its forward."""

    __slots__ = ("entry", "stats", "forward", "forms", "layout", "training", "original")

    def __init__(self, entry: PlanEntry | None, stats: DispatchStats, forward: Callable[..., Any] | None,
                 forms: tuple[_Form, ...], layout: _Layout, training: bool, original: Callable[..., Any]) -> None:
        self.entry, self.stats, self.forward, self.forms = entry, stats, forward, forms
        self.layout, self.training, self.original = layout, training, original


def _layout(kind: type) -> _Layout:
    params = list(inspect.signature(kind.forward).parameters.values())[1:]  # without self
    names = tuple(p.name for p in params if p.kind in (_POSITIONAL, _KEYWORD))
    return _Layout(names, sum(p.kind is _POSITIONAL for p in params))


def _forms(entry: PlanEntry) -> tuple[_Form, ...]:
    """The spellings of the entry's judged calls, each once, in the order first judged."""
    found: dict[_Form, None] = {}
    for sample in entry.signatures:
        found.setdefault(_Form(len(sample.args), tuple(sample.kwargs)), None)
    return tuple(found)


class ExportedKernels:
    """The serving side of one exported repository (`load_exported`, at the import of its `layers.py`): per module
    class, the plan entries that serve its instances, with one `DispatchStats` per entry."""

    def __init__(self, plan: KernelOptimizationPlan, plan_path: Path) -> None:
        self.plan = plan
        self.plan_path = plan_path
        self._stats: dict[str, DispatchStats] = {}
        self._by_class: dict[str, list[tuple[PlanEntry, DispatchStats, tuple[_Form, ...]]]] = {}
        for index, entry in enumerate(plan.entries):
            entry.provider.load_runtime_dependencies()  # code that cannot load fails at import, before any swap
            stats = DispatchStats(plan.execution.value)
            name = entry.function if entry.function not in self._stats else f"{entry.function}#{index}"
            self._stats[name] = stats
            self._by_class.setdefault(entry.provider.target_class, []).append((entry, stats, _forms(entry)))
        self._unserved: dict[str, DispatchStats] = {}
        self._instances: weakref.WeakKeyDictionary[nn.Module, _Instance] = weakref.WeakKeyDictionary()
        # Parameter layouts, read at load so a trace never computes one: per class of the plan, and per layer name
        # (for a class that shares the layer's name but has no entry).
        self._layouts: dict[type, _Layout] = {}
        self._layer_layouts: dict[str, _Layout] = {}
        for target in self._by_class:
            kind = resolve_class(target)
            if kind is not None:
                self._layouts[kind] = _layout(kind)
                self._layer_layouts.setdefault(declared_layer(target) or "", self._layouts[kind])
        self._lock = threading.Lock()

    @property
    def repository(self) -> Path:
        """The repository folder (`DIR`, what a mapping names)."""
        return self.plan_path.parents[3]

    # -- per call -----------------------------------------------------------------------------------------
    def serve(self, module: nn.Module, layer: str, values: tuple, extra: dict[str, Any] | None) -> Any:
        """One call of a layer's forward on `module` (the original instance: kernelize binds the layer's forward to
        it): `values` are the forward's named parameters in order (`UNSET` where not passed), `extra` its `**`
        keywords. The plan's guarded forward when an entry serves the instance and the call has the spelling of a
        judged one, else the class's original forward."""
        compiling = torch.compiler.is_compiling()
        state = self._instances.get(module)
        if state is None or state.training != module.training:
            if compiling:  # binding registers a custom op, which cannot happen inside a trace: `prepare` first
                layout = self._layouts.get(type(module)) or self._layer_layouts.get(layer) or _layout(type(module))
                return type(module).forward(module, **_passed(layout, module, layer, values, extra))
            state = self._bind(module, layer)
        passed = _passed(state.layout, module, layer, values, extra)
        stats = state.stats
        if state.forward is None or (torch.is_grad_enabled() and _trainable(module)):
            if not compiling:  # (no counting inside a trace: Dynamo would replay it as a side effect)
                stats.fallback_calls += 1
            return state.original(**passed)
        calls = _spellings(state, values, passed)
        if not calls:
            if not compiling:
                stats.fallback_calls += 1
                if stats.first_miss is None:
                    stats.first_miss = signature_of((), passed)
            return state.original(**passed)
        args, kwargs = calls[0]
        if len(calls) > 1 and not compiling:  # several judged spellings fit: the one whose key was judged
            keys = state.entry.signature_keys  # type: ignore[union-attr]
            args, kwargs = next(((a, k) for a, k in calls if signature_of(a, k) in keys), calls[0])
        return state.forward(*args, **kwargs)

    def _bind(self, module: nn.Module, layer: str) -> _Instance:
        """The instance's routing: the guarded forward of the first entry that serves it (`provider.serves`), or
        none. Built at its first call (and again when it switches train/eval); under `torch.compile` bind first
        (`prepare`, or one eager call) so that no custom op is registered inside a trace."""
        with self._lock:
            kind = type(module)
            layout = self._layouts.get(kind)
            if layout is None:
                layout = self._layouts[kind] = _layout(kind)
            original = types.MethodType(kind.forward, module)  # the class's, not the layer's bound to the instance
            for entry, stats, forms in self._by_class.get(class_name(module), ()):
                if entry.provider.serves(module):
                    forward = instance_forward(entry, module, stats, original=original)
                    state = _Instance(entry, stats, forward, forms, layout, module.training, original)
                    break
            else:
                stats = self._unserved.setdefault(layer, DispatchStats(self.plan.execution.value))
                state = _Instance(None, stats, None, (), layout, module.training, original)
            self._instances[module] = state
            logger.debug("%s layer on a %s: %s", layer, class_name(module),
                         state.entry.function if state.entry is not None else "not served (original forward)")
            return state

    # -- the package's own functions ----------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> int:
        """Bind every instance of `model` whose class has entries now (instead of at its first call): do it before
        `torch.compile(model)` so each served instance's custom op exists before Dynamo traces it. Returns how many
        instances an entry serves."""
        served = 0
        for module in model.modules():
            if class_name(module) in self._by_class:
                layer = declared_layer(class_name(module)) or type(module).__name__
                served += self._bind(module, layer).entry is not None
        return served

    def reset(self) -> None:
        """Forget every instance's routing: each is bound again at its next call. An instance's behaviour is read
        when it is bound (as `plan.apply` reads it when applied): after converting a model that already ran (another
        dtype or device, other attributes), reset."""
        with self._lock:
            self._instances = weakref.WeakKeyDictionary()

    def stats(self) -> pd.DataFrame:
        """Counters per entry (the frame of `KernelProviderRuntime.stats_frame`), plus a row `"<layer>: not
        served"` per layer whose layer ran on instances no entry serves (their calls: `fallback_calls`)."""
        import pandas as pd

        rows = [{"function": name, **s.as_dict()} for name, s in self._stats.items()]
        rows += [{"function": f"{layer}: not served", **s.as_dict()} for layer, s in self._unserved.items()]
        return pd.DataFrame(rows, columns=["function", "provider_calls", "fallback_calls", "provider_errors"])


def _passed(layout: _Layout, module: nn.Module, layer: str, values: tuple, extra: dict[str, Any] | None
            ) -> dict[str, Any]:
    """The arguments the caller passed, by name (`UNSET` ones left out, the `**` ones added)."""
    names = layout.names
    if len(values) != len(names):
        raise TypeError(f"{class_name(module)}.forward takes {len(names)} named parameters, the {layer} layer "
                        f"passed {len(values)}: the layer was exported for a class with another forward")
    passed = {names[i]: values[i] for i in range(len(names)) if values[i] is not UNSET}
    if extra:
        passed.update(extra)
    return passed


def _trainable(module: nn.Module) -> bool:
    """Whether autograd would record a gradient for one of the instance's parameters (a kernel has no backward)."""
    return any(p.requires_grad for p in module.parameters())


def _spellings(state: _Instance, values: tuple, passed: dict[str, Any]) -> list[tuple[tuple, dict[str, Any]]]:
    """The call rearranged into each judged spelling it fits: the form's first parameters passed positionally, and
    the names passed beyond them exactly the form's keywords."""
    names, found = state.layout.names, []
    for form in state.forms:
        count = form.positional
        if count > state.layout.positional or len(passed) != count + len(form.keywords):
            continue
        if any(values[i] is UNSET for i in range(count)):
            continue
        leading = names[:count]
        if any(name in leading or name not in passed for name in form.keywords):
            continue
        found.append((tuple(values[:count]), {name: passed[name] for name in form.keywords}))
    return found


_LOADED: dict[Path, ExportedKernels] = {}
_LOADED_LOCK = threading.Lock()


def load_exported(plan_path: str | os.PathLike[str]) -> ExportedKernels:
    """The serving side of an exported repository, from its `plan.json` (what `layers.py` calls at import). The plan
    loads like any (`KernelOptimizationPlan.load`: schema, signature, code screened): `PlanLoadError` when it does
    not, and nothing is swapped."""
    path = Path(plan_path).resolve()
    plan = KernelOptimizationPlan.load(path)
    kernels = ExportedKernels(plan, path)
    with _LOADED_LOCK:
        _LOADED[path.parent] = kernels
    logger.info("loaded exported module kernels %s: %s", path, ", ".join(plan.functions))
    return kernels


def loaded_exports() -> dict[Path, ExportedKernels]:
    """The exported repositories imported in this process (by their package folder): `.stats()` of each."""
    with _LOADED_LOCK:
        return dict(_LOADED)


# ---------------------------------------------------------------------------------------------------------
# Exporting
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HubExport:
    """What `export_kernels` wrote: the repository, the mapping transformers' `KernelConfig` reads (layer name ->
    `"/abs/DIR:Layer"`), the exported and skipped entries (function, why) and the exported plan."""

    path: Path
    package: Path
    module_id: str
    mapping: dict[str, str]
    exported: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    plan: KernelOptimizationPlan

    @property
    def plan_path(self) -> Path:
        return self.package / PLAN_FILE

    @property
    def mapping_path(self) -> Path:
        return self.path / MAPPING_FILE

    def layer_repositories(self, device: str = "cuda") -> dict[str, dict[str, Any]]:
        """The mapping in `kernels.use_kernel_mapping`'s form, for `device` ("cuda", "cpu"...); needs `kernels`."""
        from kernels import LocalLayerRepository

        return {layer: {device: LocalLayerRepository(repo_path=self.path, layer_name=layer)} for layer in self.mapping}

    def instructions(self) -> str:
        """How to load it, with `kernels` and with transformers (the text `kforge plan export-kernels` prints)."""
        repos = ", ".join(f'"{layer}": {{"cuda": LocalLayerRepository(repo_path=Path("{self.path}"), '
                          f'layer_name="{layer}")}}' for layer in self.mapping)
        return "\n".join([
            "with the kernels package (device \"cuda\", or \"cpu\"):",
            "    from pathlib import Path",
            "    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping",
            f"    with use_kernel_mapping({{{repos}}}, inherit_mapping=False):",
            "        kernelize(model, mode=Mode.INFERENCE, device=\"cuda\")",
            "with transformers (CUDA; its KernelConfig refuses the CPU):",
            "    from transformers import KernelConfig",
            f"    model.set_use_kernels(True, KernelConfig({json.dumps(self.mapping)}, use_local_kernel=True))",
        ])


def export_kernels(plan: KernelOptimizationPlan, out_dir: str | os.PathLike[str], *, name: str | None = None,
                   overwrite: bool = False) -> HubExport:
    """Write `plan`'s module kernels to `out_dir` as a local `kernels` repository (see the module docstring).

    Every module entry whose class declares a hub layer name (`forge.modules.declared_layer`) is exported; the
    others are skipped with the reason (`HubExport.skipped`). `HubExportError` when nothing is exportable, when
    classes sharing a layer name have different forwards, or when `out_dir` is a non-empty folder that is not a
    previous export (replaced only with `overwrite=True`). Written in a temporary folder beside `out_dir` and renamed
    into place, so a failure leaves nothing half-written; `out_dir`'s parent must exist. A plan carrying generated
    code is signed with this machine's key (`KernelOptimizationPlan.save`; unsigned, with a warning, without one:
    loading it then needs `kforge plan sign`)."""
    target = Path(out_dir).resolve()
    _check_target(target, overwrite)
    layers, skipped = _exportable(plan)
    if not layers:
        reasons = "; ".join(f"{function}: {why}" for function, why in skipped[:3]) or "the plan is empty"
        raise HubExportError(f"nothing to export: no entry is a module kernel of a class that declares a hub layer "
                             f"name ({reasons}); make a plan with module kernels of such classes, e.g. `kforge "
                             f"optimize ... --modules RMSNorm`")
    package_name = _package_name(name, layers)
    entries = tuple(entry for _, group in sorted(layers.items()) for entry, _ in group)
    exported = KernelOptimizationPlan(entries=entries, environment=plan.environment, execution=plan.execution)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        build = staging / "build" / BUILD
        package = build / package_name.replace("-", "_")
        package.mkdir(parents=True)
        plan_bytes = exported.save(package / PLAN_FILE).read_bytes()
        module_id = f"{_ID_PREFIX}{package_name.replace('-', '_')}_{_module_nonce(plan_bytes, target)}"
        _write(package / "layers.py", _layers_source(layers))
        _write(package / "__init__.py", _INIT_SOURCE)
        _write(build / "metadata.json", json.dumps({
            "id": module_id, "name": package_name, "version": 1, "license": "Apache-2.0", "python-depends": [],
            "backend": {"type": "universal"}, "digest": _variant_digest(build)}, indent=2) + "\n")
        mapping = {layer: f"{target}:{layer}" for layer in sorted(layers)}
        _write(staging / MAPPING_FILE, json.dumps(mapping, indent=2) + "\n")
        _replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result = HubExport(path=target, package=target / "build" / BUILD / package.name, module_id=module_id,
                       mapping=mapping, exported=tuple(exported.functions), skipped=tuple(skipped), plan=exported)
    logger.info("exported %d module kernel(s) to %s as %s", len(result.exported), target, ", ".join(mapping))
    return result


def _check_target(target: Path, overwrite: bool) -> None:
    if not target.parent.is_dir():
        raise HubExportError(f"cannot export to {target}: folder {target.parent} does not exist (create it first)")
    if target.exists() and not target.is_dir():
        raise HubExportError(f"cannot export to {target}: it is a file; give a folder path")
    here = Path.cwd().resolve()
    if overwrite and (target == here or target in here.parents or target == Path.home().resolve()):
        raise HubExportError(f"refusing to replace {target}: it is the current folder, one above it or the home "
                             "folder; give a folder of its own for the export")
    if target.is_dir() and any(target.iterdir()) and not overwrite and not _is_export(target):
        raise HubExportError(f"cannot export to {target}: it is a non-empty folder that is not a kernel-forge export; "
                             "give an empty or new folder, or pass overwrite=True (CLI: --overwrite) to replace it")


def _is_export(folder: Path) -> bool:
    """Whether `folder` holds a previous export (its mapping file and a metadata id of ours)."""
    try:
        metadata = json.loads((folder / "build" / BUILD / "metadata.json").read_text())
    except (OSError, ValueError):
        return False
    return (folder / MAPPING_FILE).is_file() and str(metadata.get("id", "")).startswith(_ID_PREFIX)


def _replace(staging: Path, target: Path) -> None:
    """Move the written folder into place (a rename; an existing folder is renamed aside first, then removed)."""
    if not target.exists():
        os.replace(staging, target)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.replace(target, aside / "export")
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(aside / "export", target)  # put the previous export back
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _module_nonce(plan_bytes: bytes, target: Path) -> str:
    """Part of the module id: kernels imports a repository once per id and process, so every export gets its own
    (the plan, the folder and a nonce: the same plan exported again is imported again)."""
    return hashlib.sha256(plan_bytes + str(target).encode() + secrets.token_bytes(8)).hexdigest()[:12]


def _variant_digest(build: Path) -> dict[str, Any]:
    """The build's digest in kernels' metadata form (what `kernels._rust.Digest.hash_variant` computes: the base64
    SHA-256 of every file but `metadata.json` and `__pycache__`, by its path in the build). kernels checks it on
    every load of a local repository, so a `layers.py` or `__init__.py` edited after the export is refused there
    (`plan.json` is also signed); without one it loads with a warning that integrity cannot be verified."""
    files = {}
    for path in sorted(build.rglob("*")):
        relative = path.relative_to(build)
        if path.is_file() and relative.as_posix() != "metadata.json" and "__pycache__" not in relative.parts:
            files[relative.as_posix()] = base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()
    return {"algorithm": "sha256", "files": files}


def _package_name(name: str | None, layers: dict[str, Any]) -> str:
    if name is None:
        name = "kforge-" + "-".join(re.sub(r"[^a-z0-9]", "", layer.lower()) or "layer" for layer in sorted(layers))
    if not _NAME.match(name):
        raise HubExportError(f"invalid package name {name!r}: use lowercase letters, digits and dashes, starting with "
                             "a letter and ending with a letter or digit (e.g. kforge-rmsnorm)")
    return name


def _exportable(plan: KernelOptimizationPlan
                ) -> tuple[dict[str, list[tuple[PlanEntry, inspect.Signature]]], list[tuple[str, str]]]:
    """The entries to export grouped by layer name (with their class's forward signature), and the others with why.
    `HubExportError` when classes sharing a layer name have forwards a single layer cannot mirror."""
    layers: dict[str, list[tuple[PlanEntry, inspect.Signature]]] = {}
    skipped: list[tuple[str, str]] = []
    for entry in plan.entries:
        why, layer, signature = _why_not(entry)
        if why is not None:
            skipped.append((entry.function, why))
        else:
            layers.setdefault(layer, []).append((entry, signature))
    for layer, group in layers.items():
        first_entry, first = group[0]
        for entry, signature in group[1:]:
            if _parameters(signature) != _parameters(first):
                raise HubExportError(
                    f"{first_entry.provider.target_class} and {entry.provider.target_class} share the hub layer name "
                    f"{layer!r} but their forwards differ ({_parameters(first)} vs {_parameters(signature)}), so one "
                    f"layer cannot serve both; export a plan holding the entries of one of them")
    return layers, skipped


def _why_not(entry: PlanEntry) -> tuple[str | None, str, inspect.Signature | None]:
    """Why an entry is not exported (None: it is), its layer name and its class's forward signature."""
    if not entry.function.startswith(MODULE_PREFIX):
        return "an F call, not a module class: kernels swaps module forwards (plan.apply serves it)", "", None
    target = entry.provider.target_class
    if type(entry.provider).type_name == _GRAPHED_TYPE:
        return ("a block replayed from CUDA graphs: its graph holds what plan.apply routes inside the block, so "
                "plan.apply serves it"), "", None
    kind = resolve_class(target)
    layer = declared_layer(target) if kind is not None else None
    if kind is None:
        return f"cannot import {target} here", "", None
    if layer is None:
        return f"{target} declares no hub layer name (@use_kernel_forward_from_hub), so kernelize cannot swap it", \
            "", None
    if not layer.isidentifier() or layer.startswith("_"):
        return f"its declared layer name {layer!r} cannot name a layer class", "", None
    try:
        signature = inspect.signature(kind.forward)
    except (TypeError, ValueError) as exc:
        return f"its forward's signature cannot be read ({exc})", "", None
    odd = [p.name for p in list(signature.parameters.values())[1:]
           if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)]
    if odd:
        return f"its forward takes positional-only or *args parameters ({', '.join(odd)}), which a layer cannot " \
               "mirror", "", None
    return None, layer, signature


def _parameters(signature: inspect.Signature) -> list[tuple[str, str]]:
    """The forward's parameters (without self) as (name, kind): what one layer must mirror."""
    return [(p.name, p.kind.name) for p in list(signature.parameters.values())[1:]]


# ---------------------------------------------------------------------------------------------------------
# The generated package (forwarding only: every decision is made in `serve`)
# ---------------------------------------------------------------------------------------------------------
_INIT_SOURCE = '''"""Module kernels of a kernel-forge plan as a `kernels` package (`kforge plan export-kernels`).

stats(): calls per plan entry (served, fell back, failed); prepare(model): bind a model's instances now (before
torch.compile); reset(): bind them again at their next call (after converting a model that already ran).
"""

from . import layers

stats = layers._KERNELS.stats
prepare = layers._KERNELS.prepare
reset = layers._KERNELS.reset

__all__ = ["layers", "prepare", "reset", "stats"]
'''

_LAYERS_HEADER = '''"""Layers of kernel-forge module kernels (written by `kforge plan export-kernels`; do not edit).

Each forward hands its arguments to `forge.hub_kernels.ExportedKernels.serve`, which serves the plan beside this file
(plan.json) on the instances and call signatures it was judged on, and runs the original forward on anything else.
"""

from pathlib import Path

from torch import nn

from forge.hub_kernels import UNSET as _UNSET  # noqa: F401 - the default of parameters that have one
from forge.hub_kernels import load_exported

_KERNELS = load_exported(Path(__file__).with_name("plan.json"))
'''


def _layers_source(layers: dict[str, list[tuple[PlanEntry, inspect.Signature]]]) -> str:
    parts = [_LAYERS_HEADER]
    for layer, group in sorted(layers.items()):
        classes = ", ".join(sorted({entry.provider.target_class for entry, _ in group}))
        # a parameter that has a default in any of the classes has one in the layer (the suffix they share)
        defaults = {p.name for _, signature in group for p in signature.parameters.values()
                    if p.default is not inspect.Parameter.empty}
        parts.append(_layer_class(layer, classes, group[0][1], defaults))
    return "\n".join(parts)


def _layer_class(layer: str, classes: str, signature: inspect.Signature, defaults: set[str]) -> str:
    """A layer class mirroring `signature` (names and kinds), `UNSET` as the default of the parameters in
    `defaults`, whose forward passes the named parameters as a tuple and the `**` ones as a dict."""
    text, named, extra, keyword_only = [], [], "None", False
    for p in list(signature.parameters.values())[1:]:
        if p.kind is _VAR_KEYWORD:
            text.append(f"**{p.name}")
            extra = p.name
            continue
        if p.kind is _KEYWORD and not keyword_only:
            text.append("*")
            keyword_only = True
        text.append(f"{p.name}=_UNSET" if p.name in defaults else p.name)
        named.append(p.name)
    values = f"({named[0]},)" if len(named) == 1 else f"({', '.join(named)})"
    return (f"\nclass {layer}(nn.Module):\n"
            f'    """{layer}: {classes}."""\n\n'
            "    can_torch_compile = True  # a served call is one custom op under torch.compile (forge.runtime)\n\n"
            f"    def forward({', '.join(['self', *text])}):\n"
            f"        return _KERNELS.serve(self, {layer!r}, {values}, {extra})\n")
