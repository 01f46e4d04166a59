"""The judge: one component that judges every candidate, function kernel or module (`Judge`), what it judges against
(`FunctionTarget`, `ModuleTarget`, `InstanceTarget`) and what it says (`Verdict`, with a `forge.outcome.Outcome`
status)."""

from forge.judging.judge import Judge, JudgeOptions, TrustedCall, default_concurrency
from forge.judging.language import CandidateCode, CandidateLanguage, language_from_ref, language_ref
from forge.judging.modules import ModuleSource
from forge.judging.targets import MODULE_SEEDS, FunctionTarget, InstanceTarget, ModuleTarget, Target
from forge.judging.verdict import HarnessLimit, Verdict

__all__ = [
    "MODULE_SEEDS",
    "CandidateCode",
    "CandidateLanguage",
    "FunctionTarget",
    "HarnessLimit",
    "InstanceTarget",
    "Judge",
    "JudgeOptions",
    "ModuleSource",
    "ModuleTarget",
    "Target",
    "Verdict",
    "TrustedCall",
    "default_concurrency",
    "language_from_ref",
    "language_ref",
]
