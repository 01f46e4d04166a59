"""The judge's seed and size rules for module problems (`forge.judging.modules.check_module`), run in process on a
tiny KernelBench-format problem: every seed, one seed for large inputs, for a slow reference (the reference's time
only: a slow candidate gains nothing), and for large outputs."""

from __future__ import annotations

import time

import pytest

from forge.checking import KernelUtils
from forge.checking.expectation import tensor_bytes
from forge.judging import MODULE_SEEDS, ModuleSource, modules
from forge.judging.modules import ScaledCheck, check_module

QUICK = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)

PROBLEM = ModuleSource('''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super(Model, self).__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return [8]
''', name="tiny")


@pytest.fixture
def built() -> list[int]:
    return []


def _builder(built: list[int], delay_s: float = 0.0):
    def build(seed: int):
        built.append(seed)
        model = PROBLEM.build(PROBLEM.load().Model, "cpu", seed)

        def forward(*args):
            time.sleep(delay_s)
            return model(*args)

        return forward

    return build


def _check(build):
    return check_module(PROBLEM, build, QUICK.validate, "cpu", seeds=MODULE_SEEDS)


def test_every_seed_is_checked_and_large_inputs_get_one(built, monkeypatch) -> None:
    check = _check(_builder(built))
    assert check.ok and check.scaled is None and built == list(MODULE_SEEDS)
    monkeypatch.setattr(modules, "LARGE_MODULE_INPUT_BYTES", 0)
    built.clear()
    check = _check(_builder(built))
    assert check.ok and check.scaled is ScaledCheck.LARGE_INPUTS and built == [MODULE_SEEDS[0]]
    assert "checked on seed 42 only" in check.scaled.note(MODULE_SEEDS[0])


def test_a_slow_reference_stops_at_the_first_seed_and_a_slow_candidate_does_not(built, monkeypatch) -> None:
    monkeypatch.setattr(modules, "SLOW_MODULE_SEED_S", 0.0)
    check = _check(_builder(built))
    assert check.ok and check.scaled is ScaledCheck.SLOW_REFERENCE and built == [MODULE_SEEDS[0]]
    monkeypatch.setattr(modules, "SLOW_MODULE_SEED_S", 0.5)
    built.clear()
    check = _check(_builder(built, delay_s=0.02))  # slow on every call: no fewer seeds for it
    assert check.ok and check.scaled is None and len(set(built)) == len(MODULE_SEEDS)


def test_large_outputs_stop_the_check_after_the_first_seed(built, monkeypatch) -> None:
    _, inputs = PROBLEM.instantiate("cpu", MODULE_SEEDS[0])
    monkeypatch.setattr(modules, "LARGE_MODULE_INPUT_BYTES", tensor_bytes(inputs))  # inputs alone: not over it
    check = _check(_builder(built))
    assert check.ok and check.scaled is ScaledCheck.LARGE_OUTPUTS and built == [MODULE_SEEDS[0]]


def test_a_constructor_that_raises_is_a_compile_error_and_a_wrong_forward_a_mismatch(built) -> None:
    def raising(seed: int):
        raise ValueError("no such layer")

    check = _check(raising)
    assert not check.ok and not check.built and check.outcome.value == "compile_error"
    assert "seed 42: building ModelNew raised ValueError: no such layer" in str(check.errors[0])

    def wrong(seed: int):
        model = _builder(built)(seed)
        return lambda *args: model(*args) * 1.01

    check = _check(wrong)
    assert not check.ok and check.built and check.outcome.value == "mismatch"
    assert str(check.errors[0]).startswith("seed 42: ")
