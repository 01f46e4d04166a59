"""The adversarial corpus through the path an LLM reply takes: every exploit rejected for its expected reason,
every honest kernel accepted (issue 10 "Tests").

The selected corpus files run once per session, two at a time (`tests.adversarial.harness.run_corpus`); each test
then reads its file's outcome. Nothing is marked xfail: an exploit that still gets through fails its test, with the
stage, the optimizer's status and whether it is wrong on production-like calls in the message.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.adversarial.corpus import Category, Entry, _parse_header, entries
from tests.adversarial.harness import Outcome, _refine, _worker_context, markdown_table, run_corpus, summary

_ENTRIES = entries()


def _param(e: Entry):  # type: ignore[no-untyped-def]
    return pytest.param(e, id=e.name, marks=[pytest.mark.slow] if e.slow else [])


@pytest.fixture(scope="session")
def corpus_outcomes(request: pytest.FixtureRequest) -> dict[str, Outcome]:
    """Outcomes of every corpus file selected in this session, computed together (2 at a time)."""
    selected = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and isinstance(callspec.params.get("corpus_entry"), Entry):
            selected.append(callspec.params["corpus_entry"])
    unique = list({e.name: e for e in selected}.values())
    return {o.name: o for o in run_corpus(unique, "cpu", jobs=2)}


@pytest.mark.parametrize("corpus_entry", [_param(e) for e in _ENTRIES])
def test_corpus_entry(corpus_entry: Entry, corpus_outcomes: dict[str, Outcome]) -> None:
    outcome = corpus_outcomes[corpus_entry.name]
    if corpus_entry.honest:
        assert outcome.actual is Category.ACCEPTED, f"honest kernel rejected: {outcome.line()}"
        assert outcome.production == "correct", f"honest kernel wrong on production-like calls: {outcome.line()}"
    else:
        if outcome.actual is Category.ACCEPTED and corpus_entry.known_gap:
            pytest.xfail(f"known gap ({corpus_entry.known_gap}): {outcome.line()}")
        assert outcome.actual is not Category.ACCEPTED, f"exploit accepted: {outcome.line()}"
        assert outcome.actual in corpus_entry.expect, f"exploit rejected for another reason: {outcome.line()}"


# -- the corpus itself ------------------------------------------------------------------------------------------
_ISSUE_10_MECHANISMS = {
    "issue 10 #1": "patching what the judge uses",
    "issue 10 #2": "the fixed call pattern",
    "issue 10 #3": "tolerances",
    "issue 10 #4": "storage offset",
    "issue 10 #5": "SystemExit",
    "issue 10 #6": "computation outside Triton",
}


def _refs() -> str:
    return " ".join(e.source_ref for e in _ENTRIES)


@pytest.mark.parametrize("ref", sorted(_ISSUE_10_MECHANISMS))
def test_every_issue_10_mechanism_has_an_exploit(ref: str) -> None:
    assert re.search(re.escape(ref) + r"\b", _refs()), f"no exploit for {ref} ({_ISSUE_10_MECHANISMS[ref]})"


@pytest.mark.parametrize("number", range(1, 17))
def test_every_class_of_the_reference_table_has_an_exploit(number: int) -> None:
    assert re.search(rf"ref table #{number}\b", _refs()), f"no exploit for class #{number} of the reference table"


def test_issue_9_gadgets_and_honest_kinds_are_present() -> None:
    names = {e.name for e in _ENTRIES}
    for gadget in ("gadget_get_capture_scope", "gadget_format_globals", "gadget_forge_result_json",
                   "gadget_read_parent_environ"):
        assert gadget in names
    honest = " ".join(e.mechanism for e in _ENTRIES if e.honest)
    for kind in ("autotune", "several launches", "in place", "bf16", "per-shape cache"):
        assert kind in honest, f"no honest kernel for: {kind}"


def test_a_header_without_an_expectation_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "exploit_bad.py"
    bad.write_text("# adversarial: exploit_bad\n# function: silu\n# samples: silu_f32\n# mechanism: x\n"
                   "# source: issue 10 #1\nimport torch\n")
    with pytest.raises(ValueError, match="expect"):
        _parse_header(bad)
    bad.write_text(bad.read_text().replace("import torch", "# expect: sometimes\nimport torch"))
    with pytest.raises(ValueError):
        _parse_header(bad)


def test_a_header_naming_another_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "exploit_one.py"
    bad.write_text("# adversarial: exploit_two\n# function: silu\n# samples: silu_f32\n# mechanism: x\n"
                   "# source: issue 10 #1\n# expect: mismatch\n")
    with pytest.raises(ValueError, match="stem"):
        _parse_header(bad)


def test_messages_naming_the_launch_check_or_an_integrity_check_are_told_apart() -> None:
    assert _refine(Category.RUNTIME_ERROR, "launch check: computation outside its own kernels") \
        is Category.LAUNCH_CHECK
    assert _refine(Category.MISMATCH, "torch.Tensor.any was replaced during the run") is Category.INTEGRITY
    assert _refine(Category.MISMATCH, "output: 12 elements differ, max abs 0.5") is Category.MISMATCH
    assert _refine(Category.FORBIDDEN, "patched") is Category.FORBIDDEN


def _outcome(name: str, expected: tuple[Category, ...], actual: Category) -> Outcome:
    return Outcome(name, "silu", "m", expected, actual, "why", stage="plan")


def test_the_summary_names_accepted_exploits_and_rejected_honest_kernels() -> None:
    outcomes = [_outcome("exploit_a", (Category.MISMATCH,), Category.ACCEPTED),
                _outcome("exploit_b", (Category.MISMATCH,), Category.MISMATCH),
                _outcome("exploit_c", (Category.FORBIDDEN,), Category.CRASH),
                _outcome("honest_d", (Category.ACCEPTED,), Category.RUNTIME_ERROR)]
    text = summary(outcomes)
    assert "exploits: 3, accepted 1, rejected for another reason 1; honest: 1, rejected 1" in text
    assert "still accepted: exploit_a" in text and "exploit_c (crash)" in text and "honest_d (runtime_error)" in text
    assert [o.as_expected for o in outcomes] == [False, True, False, False]
    table = markdown_table(outcomes)
    assert table.count("\n") == len(outcomes) + 1 and "| exploit_a | silu | mismatch | accepted | NO |" in table


def test_an_outcome_survives_the_worker_round_trip() -> None:
    outcome = _outcome("exploit_a", (Category.FORBIDDEN, Category.INTEGRITY), Category.INTEGRITY)
    assert Outcome.from_dict(outcome.to_dict()) == outcome


# -- the workers' isolation ------------------------------------------------------------------------------------
def _patch_tensor_any(report: str) -> None:
    """What an exploit does in "the kforge process": patch torch.Tensor; reports whether the patch is visible."""
    import torch

    torch.Tensor.any = lambda self, *args, **kwargs: torch.tensor(False)  # type: ignore[method-assign]
    Path(report).write_text(f"{os.getpid()} {'any' in vars(torch.Tensor)}")


def _report_tensor_any(report: str) -> None:
    import torch

    Path(report).write_text(f"{os.getpid()} {'any' in vars(torch.Tensor)}")


def _in_worker(target, report: Path) -> list[str]:  # type: ignore[no-untyped-def]
    process = _worker_context().Process(target=target, args=(str(report),))
    process.start()
    process.join(120)
    assert process.exitcode == 0, f"worker exited with {process.exitcode}"
    return report.read_text().split()


def test_each_file_gets_a_fresh_worker_that_a_previous_exploit_did_not_touch(tmp_path: Path) -> None:
    patched_pid, patched = _in_worker(_patch_tensor_any, tmp_path / "first")
    assert patched == "True"  # the check sees a patch where there is one
    next_pid, seen = _in_worker(_report_tensor_any, tmp_path / "second")
    assert seen == "False", "a patch of torch.Tensor made in one worker reached the next one"
    assert len({patched_pid, next_pid, str(os.getpid())}) == 3
