"""Evals on a CUDA device (skipped without one): the third baseline, eager replayed from a CUDA graph, is measured
where the clock is host-inclusive and left empty where every number is already a graph replay."""

from __future__ import annotations

import pytest
import torch

from evals import EvalOptions, run_eval
from forge.checking import KernelUtils

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("timing", ["eager", "device"])
def test_cuda_graphs_baseline_only_with_the_host_inclusive_clock(tmp_path, timing: str) -> None:
    frame = run_eval("smoke", "compile", out_dir=tmp_path / "run",
                     options=EvalOptions(device="cuda", quick=True, progress=False, plots=False, workers=0,
                                         kernel_utils=KernelUtils(timing=timing)))
    assert frame["correct"].all(), frame[["problem_id", "failure_reason"]]
    if timing == "eager":
        assert (frame["cuda_graphs_ms"] > 0).all()
        ratio = frame["cuda_graphs_ms"] / frame["latency_ms"]
        assert ((ratio - frame["speedup_cuda_graphs"]).abs() < 1e-9).all()
    else:
        assert frame["cuda_graphs_ms"].isna().all()
    assert (frame["harness_s"] > 0).all()


def test_kernelbench_inputs_are_drawn_on_the_device_and_repeat_for_a_seed(tmp_path) -> None:
    from evals.problems.kernelbench import module_problem_from_source

    source = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
        "def get_inputs():\n    return [torch.rand(64, 1024)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    problem = module_problem_from_source(source, problem_id="relu", suite="t")
    cpu_state, cuda_state = torch.get_rng_state(), torch.cuda.get_rng_state()
    _, first = problem.instantiate("cuda", 42)
    _, again = problem.instantiate("cuda", 42)
    _, other = problem.instantiate("cuda", 43)
    assert first[0].is_cuda and torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])
    assert torch.equal(torch.get_rng_state(), cpu_state) and torch.equal(torch.cuda.get_rng_state(), cuda_state)
