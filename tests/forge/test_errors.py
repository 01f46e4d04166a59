"""One error hierarchy (`forge.errors`): every error kernel-forge raises on purpose is a `KernelForgeError`, and its
class says what it means for a candidate (`forge.outcome.outcome_of_exception`)."""

from __future__ import annotations

import pytest

from forge.checking.benchmarking import NotCapturableError
from forge.checking.integrity import IntegrityError
from forge.checking.spot_check import SpotCheckError
from forge.demos import UnknownDemoError
from forge.errors import CandidateError, KernelForgeError, UsageError
from forge.outcome import CandidateAbort, HarnessError, Outcome, ValidationIssue, outcome_of_exception
from forge.plan import PlanLoadError
from forge.sandbox.harness import SandboxChildLost, SandboxLimitReached
from forge.sandbox.isolation import SandboxUnavailableError
from forge.sandbox.wire import ReplyTooLarge, WireError


@pytest.mark.parametrize(("error", "outcome"), [
    (SpotCheckError(3, 10, 0, ValidationIssue("output: wrong")), Outcome.MISMATCH),
    (IntegrityError([], when="while timing"), Outcome.MISMATCH),
    (NotCapturableError("cannot capture"), Outcome.RUNTIME_ERROR),
    (CandidateAbort(SystemExit(3)), Outcome.RUNTIME_ERROR),
    (HarnessError("the reference raised"), Outcome.HARNESS_ERROR),
    (SandboxChildLost("the child died"), Outcome.CRASH),
    (ReplyTooLarge("too many bytes"), Outcome.HARNESS_ERROR),
    (ZeroDivisionError("the candidate's own"), Outcome.RUNTIME_ERROR),
])
def test_each_error_class_says_what_it_means(error, outcome):
    assert outcome_of_exception(error) is outcome


def test_every_error_kernel_forge_raises_is_in_the_hierarchy():
    for kind in (UsageError, HarnessError, CandidateError, SpotCheckError, IntegrityError, NotCapturableError,
                 CandidateAbort, SandboxChildLost, SandboxLimitReached, SandboxUnavailableError, WireError,
                 ReplyTooLarge):
        assert issubclass(kind, KernelForgeError), kind
    assert issubclass(SpotCheckError, RuntimeError) and issubclass(SandboxUnavailableError, RuntimeError)
    assert issubclass(PlanLoadError, ValueError) and issubclass(UnknownDemoError, ValueError)
