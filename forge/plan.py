"""`KernelOptimizationPlan`: the chosen provider per function, serialisable to JSON and applicable to a module.

A plan file carries a format name and version, the environment it was measured on, and per entry the provider's
state, the call signatures it was validated on (the runtime's signature guard) and the measured latencies. Loading
checks everything before returning: a corrupt file, an unknown version or an unknown provider type raises
`PlanLoadError` naming the problem and nothing is applied.

A plan holding a provider that carries code (`KernelProvider.carries_code`: generated kernels) must be signed
(`forge.signing`, HMAC with the user's key): `save` signs it when a key is configured, and `from_dict`/`load` refuse
an unsigned or mis-signed one before any entry is built (so before any source is screened or imported) unless the
caller passes `trust_unsigned=True`. Plans of static providers only load unsigned (their code is installed, not
carried by the file).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from forge.environment import environment_differences, environment_fingerprint
from forge.errors import KernelForgeError
from forge.execution import Execution, parse_execution
from forge.plan_schema import read_plan_json, validate_plan_dict
from forge.provider import KernelProvider, provider_type
from forge.samples import Sample, sample_from_json, sample_to_json, signature_of, spec_sample
from forge.signing import SignatureCheck, check_document, load_key, sign_document

if TYPE_CHECKING:
    import pandas as pd

    from forge.checking import KernelUtils
    from forge.runtime import KernelProviderRuntime

__all__ = ["KernelOptimizationPlan", "PlanEntry", "PlanLoadError", "PLAN_FORMAT", "PLAN_VERSION"]

logger = logging.getLogger(__name__)

PLAN_FORMAT = "kernel-forge-plan"
PLAN_VERSION = 1


class PlanLoadError(KernelForgeError, ValueError):
    """A plan file or dict that cannot be loaded; the message names the problem and the fix."""


def _code_carrying_entries(data: dict[str, Any]) -> list[str]:
    """The functions whose provider type carries code (an unknown type is refused later, when entries are built)."""
    found = []
    for raw in data.get("entries") or []:
        type_name = raw["provider"]["type"]  # the schema checked the shape
        target = provider_type(type_name)
        if target is not None and target.carries_code:
            found.append(str(raw.get("function") or type_name))
    return found


def _check_plan_signature(data: dict[str, Any], trust_unsigned: bool) -> SignatureCheck:
    """The plan's signature status; `PlanLoadError` when it carries code and is not validly signed here."""
    carrying = _code_carrying_entries(data)
    try:
        key = load_key()
    except (OSError, ValueError) as exc:
        if carrying:
            raise PlanLoadError(f"cannot read the signing key: {exc}") from exc
        logger.warning("cannot read the signing key (%s); this plan holds no generated code and loads unsigned", exc)
        key = None
    check = check_document(data, key)
    if check.valid or not carrying:
        return check
    problem = f"the plan holds generated code ({', '.join(carrying)}); signature: {check.describe()}"
    if key is None:
        problem += " (no signing key here: set $KFORGE_SIGNING_KEY or create a key file with `kforge plan sign`)"
    if trust_unsigned:
        logger.warning("%s; loading it anyway because trust_unsigned=True (its sources are still screened)", problem)
        return check
    raise PlanLoadError(f"{problem}. Nothing was imported. Review its kernels (`kforge plan show FILE "
                        "--trust-unsigned`) and sign it with `kforge plan sign FILE`, or load it with "
                        "trust_unsigned=True (CLI: --trust-unsigned)")


@dataclass(frozen=True)
class PlanEntry:
    """One planned replacement: a ready provider, the signatures it was validated on, and its measurements."""

    provider: KernelProvider
    signatures: tuple[Sample, ...]
    source: str = "static"
    latency_ms: float | None = None
    baseline_ms: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.provider, KernelProvider):
            raise TypeError(f"plan entry provider must be a KernelProvider, got {type(self.provider).__name__}")
        if not self.signatures:
            raise ValueError(f"plan entry for {self.provider.supported_function} has no validated signatures")
        object.__setattr__(
            self, "signatures", tuple(spec_sample(s, with_stats=True) for s in self.signatures)
        )

    @property
    def function(self) -> str:
        return self.provider.supported_function

    @property
    def speedup(self) -> float | None:
        if self.latency_ms and self.baseline_ms:
            return self.baseline_ms / self.latency_ms
        return None

    @cached_property
    def signature_keys(self) -> frozenset[Hashable]:
        return frozenset(signature_of(s.args, s.kwargs) for s in self.signatures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "source": self.source,
            "description": self.description,
            "latency_ms": self.latency_ms,
            "baseline_ms": self.baseline_ms,
            "provider": self.provider.to_dict(),
            "signatures": [sample_to_json(s) for s in self.signatures],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanEntry:
        provider = KernelProvider.from_dict(data["provider"])
        function = data.get("function")
        if function is not None and function != provider.supported_function:
            raise ValueError(
                f"entry says function {function!r} but its provider replaces {provider.supported_function!r}"
            )
        return cls(
            provider=provider,
            signatures=tuple(sample_from_json(s) for s in data["signatures"]),
            source=str(data.get("source", "static")),
            latency_ms=data.get("latency_ms"),
            baseline_ms=data.get("baseline_ms"),
            description=str(data.get("description", "")),
        )


@dataclass(frozen=True)
class KernelOptimizationPlan:
    """The fastest correct provider per function (at most one entry per function).

    `execution` is how the model was meant to run when the plan was measured (`forge.execution.Execution`): kernels
    were selected on that mode's clock and the end-to-end check ran the model that way. Apply the plan the same way.
    """

    entries: tuple[PlanEntry, ...] = ()
    environment: dict[str, Any] = field(default_factory=dict)
    execution: Execution = Execution.EAGER
    # How the file it was loaded from was signed (`forge.signing`); None for a plan built in memory.
    signature: SignatureCheck | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        object.__setattr__(self, "execution", parse_execution(self.execution))
        seen: set[Any] = set()
        for entry in self.entries:
            if not isinstance(entry, PlanEntry):
                raise TypeError(f"plan entries must be PlanEntry objects, got {type(entry).__name__}")
            # An F call is routed by name (one provider each); a module class's forward by instance: one entry per
            # behaviour of the class (`forge.modules.instance_key`), never two for the same instances.
            keys = getattr(entry.provider, "instance_keys", None)
            owned = [(entry.function, k) for k in keys] if entry.function.startswith("module:") and keys else \
                [entry.function]
            twice = next((k for k in owned if k in seen), None)
            if twice is not None:
                raise ValueError(f"a plan holds at most one provider per function (a module class: per instance "
                                 f"behaviour); {entry.function!r} appears twice")
            seen.update(owned)

    @property
    def providers(self) -> tuple[KernelProvider, ...]:
        return tuple(e.provider for e in self.entries)

    @property
    def functions(self) -> list[str]:
        return [e.function for e in self.entries]

    @property
    def carries_code(self) -> bool:
        """Whether an entry's provider carries code (a generated kernel): such a plan must be signed."""
        return any(type(e.provider).carries_code for e in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    # -- serialisation ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "environment": self.environment or environment_fingerprint(),
            "execution": self.execution.value,
            "entries": [e.to_dict() for e in self.entries],
        }

    @classmethod
    def from_dict(cls, data: Any, *, strict_environment: bool = False,
                  trust_unsigned: bool = False) -> KernelOptimizationPlan:
        """Build a plan from `to_dict()` output; raises `PlanLoadError` (nothing is half-built).

        A plan carrying code must hold a valid signature under this machine's key (`forge.signing`); with
        `trust_unsigned=True` an unsigned or mis-signed one loads with a warning (its sources are still screened).
        """
        if not isinstance(data, dict):
            raise PlanLoadError(f"a plan must be a JSON object, got {type(data).__name__}")
        if data.get("format") != PLAN_FORMAT:
            raise PlanLoadError(
                f"not a kernel-forge plan (format is {data.get('format')!r}, expected {PLAN_FORMAT!r})"
            )
        version = data.get("version")
        if version != PLAN_VERSION:
            raise PlanLoadError(
                f"unsupported plan version {version!r}; this kernel-forge reads version {PLAN_VERSION}. "
                "Re-create the plan with `kforge optimize` or use the kernel-forge release that wrote it"
            )
        validate_plan_dict(data)  # every field's type and bounds (forge.plan_schema), before anything is built
        signature = _check_plan_signature(data, trust_unsigned)  # before any entry (and so any source) is built
        raw_entries = data.get("entries")
        if not isinstance(raw_entries, list):
            raise PlanLoadError("plan has no 'entries' list")
        entries = []
        for index, raw in enumerate(raw_entries):
            label = raw.get("function", "?") if isinstance(raw, dict) else "?"
            try:
                entries.append(PlanEntry.from_dict(raw))
            except Exception as exc:
                raise PlanLoadError(f"plan entry {index} ({label}): {exc}") from exc
        environment = data.get("environment") or {}
        if environment:
            diffs = environment_differences(environment)
            if diffs:
                message = "plan was measured on another environment: " + "; ".join(diffs)
                if strict_environment:
                    raise PlanLoadError(message + " (strict_environment=True)")
                logger.warning("%s. Kernels are still guarded by signature; run plan.verify() to re-check them.",
                               message)
        try:
            execution = parse_execution(data.get("execution", Execution.EAGER.value))
        except ValueError as exc:
            raise PlanLoadError(f"plan 'execution': {exc}") from exc
        try:
            return cls(entries=tuple(entries), environment=environment, execution=execution, signature=signature)
        except (TypeError, ValueError) as exc:
            raise PlanLoadError(str(exc)) from exc

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan as JSON atomically (`forge.atomic`: unique temporary, fsync, rename; a crash or a
        concurrent save never leaves half a file). The folder must exist; errors name the path.

        A plan carrying code is signed when a signing key is configured (`forge.signing.load_key`); without one it
        is written unsigned with a warning, and loading it needs `kforge plan sign FILE` (or trust_unsigned)."""
        from forge.atomic import write_json_atomic

        data = self.to_dict()
        if self.carries_code:
            try:
                key, problem = load_key(), "no signing key is configured ($KFORGE_SIGNING_KEY or a key file)"
            except (OSError, ValueError) as exc:
                key, problem = None, f"cannot read the signing key ({exc})"
            if key is None:
                logger.warning("%s: the plan %s holds generated code and is saved unsigned; review it and run "
                               "`kforge plan sign %s`", problem, path, path)
            else:
                data = sign_document(data, key)
        return write_json_atomic(Path(path), data, indent=2, allow_nan=False)

    @classmethod
    def load(cls, path: str | os.PathLike, *, strict_environment: bool = False,
             trust_unsigned: bool = False) -> KernelOptimizationPlan:
        """Read a plan written by `save`; raises `PlanLoadError` with the file name on any problem (an unsigned or
        mis-signed plan carrying code included, unless `trust_unsigned`: see `from_dict`)."""
        path = Path(path)
        data = read_plan_json(path)  # regular files only, size cap before reading, bounded read (forge.plan_schema)
        try:
            return cls.from_dict(data, strict_environment=strict_environment, trust_unsigned=trust_unsigned)
        except PlanLoadError as exc:  # the fix names this file (`kforge plan sign FILE`)
            raise PlanLoadError(f"plan file {path}: " + str(exc).replace("FILE", str(path))) from exc

    # -- use ----------------------------------------------------------------------------------------------
    def runtime(self, module: nn.Module, *, execution: Execution | str | None = None) -> KernelProviderRuntime:
        """The runtime that applies this plan to `module`; `execution`: how it will run (a plan made for another
        mode warns, `forge.runtime.PlanModeWarning`)."""
        from forge.runtime import KernelProviderRuntime

        return KernelProviderRuntime(module, self, execution=execution)

    @contextlib.contextmanager
    def apply(self, module: nn.Module, *, execution: Execution | str | None = None
              ) -> Iterator[KernelProviderRuntime]:
        """Inside the block, `module(...)` runs with the planned providers (under `torch.no_grad()`); `execution` as
        for `runtime`."""
        runtime = self.runtime(module, execution=execution)
        with runtime.applied():
            yield runtime

    def verify(self, kernel_utils: KernelUtils | None = None, *, model: nn.Module | None = None
               ) -> dict[str, list[str]]:
        """Re-validate every provider on fresh inputs drawn from its signatures (e.g. after moving machines).

        Returns the errors per function (empty lists = all good). A module entry (`forge.modules`) is checked against
        the instances of `model` it serves (their original forwards, float64 on upcast copies); without `model` it
        cannot be checked and says so as its error.
        """
        from forge.checking import KernelUtils
        from forge.functional import original_function
        from forge.samples import draw_sample

        utils = kernel_utils or KernelUtils()
        result: dict[str, list[str]] = {}
        for entry in self.entries:
            samples = [draw_sample(s) for s in entry.signatures]
            if entry.function.startswith("module:"):
                result.setdefault(entry.function, []).extend(_verify_module_entry(entry, samples, utils, model))
                continue
            result[entry.function] = list(utils.validate(original_function(entry.function), entry.provider, samples))
        return result

    def summary(self) -> pd.DataFrame:
        """One row per entry: function, provider, source, latencies, speedup, signatures."""
        import pandas as pd

        rows = [
            {
                "function": e.function,
                "provider": e.provider.name,
                "source": e.source,
                "latency_ms": e.latency_ms,
                "baseline_ms": e.baseline_ms,
                "speedup": e.speedup,
                "signatures": len(e.signatures),
            }
            for e in self.entries
        ]
        return pd.DataFrame(
            rows, columns=["function", "provider", "source", "latency_ms", "baseline_ms", "speedup", "signatures"]
        )



def _verify_module_entry(entry: PlanEntry, samples: list[Sample], utils: KernelUtils,
                         model: nn.Module | None) -> list[str]:
    """The oracle on a module entry, instance by instance of `model` (see `KernelOptimizationPlan.verify`)."""
    from forge.judging.modules import ReferenceModel
    from forge.modules import class_name

    if model is None:
        return [f"{entry.function}: not verified: a module kernel is checked against the model's own instances; "
                "pass model= (plan.verify(model=...))"]
    provider = entry.provider
    served = [m for m in model.modules() if class_name(m) == provider.target_class and provider.serves(m)]
    if not served:
        return [f"{entry.function}: not verified: no instance of {provider.target_class} in this model has the "
                "behaviour the entry was judged on"]
    representative = served[0]  # the served instances share the behaviour the entry was judged on (instance_key)
    code = provider.candidate_code() if type(provider).carries_code else None
    if code is not None:  # generated code runs in the sandbox first; only if it passes there is it imported here
        from forge.judging import InstanceTarget, Judge

        judge = Judge(utils)
        try:
            verdict = judge.judge_source(code.source, InstanceTarget.of(representative, samples), code.language,
                                         benchmark=False)
        finally:
            judge.close()
        if not verdict.ok:
            return [f"{entry.function}: in the sandbox: {verdict.status.value}: {verdict.message}"]
    return [str(e) for e in utils.validate(ReferenceModel(representative), provider.bind(representative), samples)]
