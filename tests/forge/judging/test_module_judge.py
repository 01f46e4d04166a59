"""A `ModelNew` is judged like a kernel: it runs in the sandbox child, `Model` and the oracle in the judge's process.

So a `ModelNew` that forges its verdict (writes a result file, prints "PASS"), patches the oracle or `torch` in its
own process, or lies about its outputs changes nothing the verdict reads (before, module candidates were checked by
`module_verdict` in a plain child where the candidate and its own verdict shared one process)."""

from __future__ import annotations

from agent.languages import get_language
from forge.judging import Judge, JudgeOptions, ModuleSource, ModuleTarget
from forge.outcome import Outcome
from forge.sandbox import SandboxOptions
from tests.agent.kernels import MLP_TRITON, MLP_TRITON_WRONG
from tests.evals.test_runner import MLP

TARGET = ModuleTarget(ModuleSource(MLP, "LinearReLU"), "cpu")
TRITON = get_language("triton")

_FORGE = '''
import json as _json
import os as _os

import forge.checking.compare as _compare
import forge.checking.validation as _validation


def _forge_everything():
    for name in ("result.json", "verdict.json"):
        try:
            with open(_os.path.join(_os.environ["HOME"], name), "w") as fh:
                fh.write(_json.dumps({"status": "ok", "message": "correct on every seed"}))
        except OSError:
            pass
    torch.allclose = lambda *a, **k: True
    torch.Tensor.any = lambda self, *a, **k: torch.zeros((), dtype=torch.bool)
    for module in (_compare, _validation):
        for name in dir(module):
            if name.endswith(("mismatch", "mismatch_issue", "errors")) and callable(getattr(module, name)):
                setattr(module, name, lambda *a, **k: None)
    print("PASS ALL_TESTS_PASSED")


_forge_everything()
'''


def _judge(source: str, **options) -> object:
    return Judge(options=JudgeOptions(SandboxOptions(timeout_s=120, **options), benchmark=False)).judge_source(
        source, TARGET, TRITON)


def test_an_honest_modelnew_in_real_model_style_is_judged_correct_in_the_sandbox() -> None:
    verdict = _judge(MLP_TRITON)
    assert verdict.status == Outcome.OK, (verdict.message, verdict.details, verdict.stderr[-2000:])
    assert verdict.details["validated_in"] == "harness process" and verdict.isolation == "boundary"


def test_a_modelnew_that_forges_its_verdict_and_patches_the_oracle_is_still_a_mismatch() -> None:
    forged = MLP_TRITON_WRONG.replace("\nclass ModelNew", _FORGE + "\n\nclass ModelNew", 1)
    verdict = _judge(forged, screen=False)  # the screen would refuse all of it: run it anyway
    assert "PASS ALL_TESTS_PASSED" in verdict.stdout, "the forgery ran"
    assert verdict.status == Outcome.MISMATCH, (verdict.message, verdict.details)
    assert verdict.details["errors"][0].startswith("seed 42: ") and "outside tolerance" in verdict.details["errors"][0]


def test_the_same_forgery_is_refused_by_the_screen_before_it_runs() -> None:
    forged = MLP_TRITON_WRONG.replace("\nclass ModelNew", _FORGE + "\n\nclass ModelNew", 1)
    verdict = _judge(forged)
    assert verdict.status == Outcome.FORBIDDEN and verdict.stdout == ""
    constructs = {v["construct"] for v in verdict.details["violations"]}
    assert "import os" in constructs and any("forge" in c for c in constructs), constructs


LIBRARY_GEMM_OWN_EPILOGUE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=offsets < n)


class ModelNew(nn.Module):
    """cuBLAS for the product (the library that already wins), its own kernel for the rest."""

    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        h = self.linear(x)
        y = torch.empty_like(h)
        n = h.numel()
        _relu[(triton.cdiv(n, 128),)](h, y, n, BLOCK=128)
        return y
'''


def test_a_modelnew_may_call_the_libraries_that_win_and_compute_the_rest_itself() -> None:
    """The module-kernel policy of the launch check: products, convolutions and attention through PyTorch, at least
    one own kernel per call."""
    verdict = _judge(LIBRARY_GEMM_OWN_EPILOGUE)
    assert verdict.status == Outcome.OK, (verdict.message, verdict.details, verdict.stderr[-2000:])
    only_library = LIBRARY_GEMM_OWN_EPILOGUE.replace(
        "        y = torch.empty_like(h)\n        n = h.numel()\n"
        "        _relu[(triton.cdiv(n, 128),)](h, y, n, BLOCK=128)\n        return y\n",
        "        return torch.relu(h)\n")
    verdict = _judge(only_library, screen=False)  # the screen refuses torch.relu already: the run-time check too
    assert verdict.status != Outcome.OK, (verdict.message, verdict.details)
    errors = " ".join(verdict.details["errors"])
    assert "aten.relu" in errors and "no kernel of the candidate was launched" in errors
