"""forge.outcome: typed issues survive JSON and pickling; candidate BaseExceptions are contained, the user's Ctrl-C
and interrupts outside candidate code are not."""

from __future__ import annotations

import json
import math
import os
import signal
import threading

import pytest
import torch

from forge.outcome import (
    CandidateAbort,
    CandidateCall,
    MismatchRow,
    Outcome,
    ValidationIssue,
    candidate_code,
    is_memory_exhaustion,
    issue_of,
    outcome_of_issues,
    watch_interrupts,
)


def test_an_issue_round_trips_through_json_with_nan_and_inf() -> None:
    issue = ValidationIssue("output: NaN where the reference has 1", kind=Outcome.MISMATCH, sample=1, case="fresh #1",
                            leaf="output[0]", worst_index=(0, 2), expected=math.inf, got=math.nan,
                            rows=(MismatchRow((0, 2), math.inf, math.nan), MismatchRow((1, 0), 1.0, 2.0, 1.0, 1e-5)))
    again = ValidationIssue.from_dict(json.loads(json.dumps(issue.to_dict(), allow_nan=False)))
    assert again == issue and again.expected == math.inf and math.isnan(again.got)
    assert again.rows[1] == issue.rows[1] and again.rows[0].index == (0, 2)
    with pytest.raises(AttributeError):
        issue.kind = Outcome.OK
    with pytest.raises(TypeError, match="unknown fields"):
        ValidationIssue("x", colour="red")


def test_plain_strings_are_mismatches_and_the_report_outcome_prefers_runtime_errors() -> None:
    assert issue_of("values differ").kind is Outcome.MISMATCH
    raised = ValidationIssue("candidate raised ValueError", kind=Outcome.RUNTIME_ERROR)
    assert outcome_of_issues(["values differ", raised]) is Outcome.RUNTIME_ERROR
    assert not Outcome.HARNESS_ERROR.blames_candidate and Outcome.MISMATCH.blames_candidate


def test_memory_exhaustion_is_told_from_other_failures() -> None:
    assert is_memory_exhaustion(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_memory_exhaustion(MemoryError())
    assert is_memory_exhaustion(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: 4 TB"))
    assert not is_memory_exhaustion(ValueError("out of memory"))  # not an allocator's exception
    assert not is_memory_exhaustion(RuntimeError("shape mismatch"))


class _Kernel:
    allows_dispatch_poisoning = False

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def __call__(self, x):
        if self.error is not None:
            raise self.error
        return x


@pytest.mark.parametrize("error", [SystemExit(2), GeneratorExit(), KeyboardInterrupt()])
def test_candidate_base_exceptions_become_candidate_abort(error) -> None:
    call = CandidateCall(_Kernel(error))
    assert call.allows_dispatch_poisoning is False and CandidateCall(call).fn is call.fn
    with watch_interrupts(), pytest.raises(CandidateAbort, match=type(error).__name__) as info:
        call(1)
    assert info.value.__cause__ is error and info.value.original_type == type(error).__name__
    with watch_interrupts(), pytest.raises(CandidateAbort), candidate_code():
        raise error
    assert CandidateCall(_Kernel(None))(3) == 3


def test_where_sigint_is_ignored_every_keyboard_interrupt_is_the_candidates(monkeypatch) -> None:
    """With SIGINT ignored (or left to its default action) no Ctrl-C can become a KeyboardInterrupt, so one raised
    inside a watched block is code's and is contained (pytest-xdist's workers run so)."""
    for handler in (signal.SIG_IGN, signal.SIG_DFL):
        monkeypatch.setattr(signal, "getsignal", lambda signum, handler=handler: handler)
        with watch_interrupts(), pytest.raises(CandidateAbort, match="KeyboardInterrupt"):
            CandidateCall(_Kernel(KeyboardInterrupt()))(1)


def test_keyboard_interrupts_that_may_be_the_users_propagate() -> None:
    kernel = CandidateCall(_Kernel(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        kernel(1)  # main thread and nothing watching SIGINT: it may be a real Ctrl-C, never swallowed

    def ctrl_c(x):
        os.kill(os.getpid(), signal.SIGINT)
        return x

    with watch_interrupts(), pytest.raises(KeyboardInterrupt):
        CandidateCall(ctrl_c)(1)  # a real SIGINT while the candidate runs
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    caught: list[BaseException] = []

    def in_a_thread() -> None:  # signals never reach other threads: a KeyboardInterrupt there is code-raised
        try:
            kernel(1)
        except CandidateAbort as exc:
            caught.append(exc)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert len(caught) == 1
