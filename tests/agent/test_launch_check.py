"""The run-time launch check with real Triton kernels (interpreted on CPU), loaded through `TritonLanguage.load`.

Honest kernels (a per-shape cache, several launches, autotune, heuristics) pass; a wrapper that launches nothing,
or computes with tensor operators, PyTorch functions or host reads beside a no-op launch, fails, including when
its output is right. The autotuned kernel also passes the oracle on CPU (one config on the interpreter). The
`cuda` tests cover the cached-launch and compiled-kernel paths, which the interpreter does not have.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from agent.languages import get_language
from agent.screening import format_violations
from forge.checking import validate
from forge.checking.launch_check import WATCH, LaunchMonitor, LaunchRecord, launch_issues
from forge.outcome import Outcome
from forge.samples import Sample

LANGUAGE = get_language("triton")

HEADER = """
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x / (1.0 + tl.exp(-x))).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
"""

PER_SHAPE_CACHE = HEADER + """
_CACHE = {}


def _config(x):
    key = (tuple(x.shape), x.dtype)
    cfg = _CACHE.get(key)
    if cfg is None:
        cfg = (_silu_kernel, (triton.cdiv(x.numel(), 64),), {"BLOCK": 64})
        _CACHE[key] = cfg
    return cfg


def kernel_function(input, inplace=False):
    x = input.contiguous()
    y = torch.empty_like(x)
    kern, grid, meta = _config(x)
    kern[grid](x, y, x.numel(), **meta)
    return y
"""

TWO_LAUNCHES = HEADER + """
def kernel_function(input, inplace=False):
    x = input.contiguous()
    tmp = torch.empty_like(x)
    y = torch.empty_like(x)
    n = x.numel()
    _copy_kernel[(triton.cdiv(n, 64),)](x, tmp, n, BLOCK=64)
    _silu_kernel[(triton.cdiv(n, 64),)](tmp, y, n, BLOCK=64)
    return y
"""

AUTOTUNED = HEADER + """
@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 128}, num_warps=4)],
                 key=["n"])
@triton.jit
def _silu_tuned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x / (1.0 + tl.exp(-x))).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, inplace=False):
    x = input.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    _silu_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y
"""

HEURISTICS = HEADER + """
@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(min(args["n"], 256))})
@triton.jit
def _silu_heur(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x / (1.0 + tl.exp(-x))).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, inplace=False):
    x = input.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    _silu_heur[(triton.cdiv(n, 256),)](x, y, n)
    return y
"""

# Launches nothing and returns PyTorch's result, computed with tensor operators (which the screen allows).
NO_LAUNCH_OPERATORS = HEADER + """
def kernel_function(input, inplace=False):
    return input / (1 + math.e ** (-input))
"""

# A no-op launch beside tensor math.
NOOP_LAUNCH_OPERATORS = HEADER + """
def kernel_function(input, inplace=False):
    y = torch.empty_like(input)
    _copy_kernel[(1,)](input, y, 0, BLOCK=16)
    return input / (1 + math.e ** (-input))
"""

# Not screenable (torch.nn.functional), checked as if it had slipped through: the run-time check is independent.
FUNCTIONAL_FALLBACK = HEADER + """
import torch.nn.functional as F


def kernel_function(input, inplace=False):
    y = torch.empty_like(input)
    _copy_kernel[(1,)](input, y, 0, BLOCK=16)
    return F.silu(input)
"""

HOST_MATH = HEADER + """
def kernel_function(input, inplace=False):
    values = [v / (1.0 + math.exp(-v)) for v in input.reshape(-1).tolist()]
    host = torch.tensor(values, dtype=input.dtype, device=input.device)
    y = torch.empty_like(input)
    n = y.numel()
    _copy_kernel[(triton.cdiv(n, 64),)](host, y, n, BLOCK=64)
    return y.view(input.shape)
"""

# The math hides in an autotune pre-hook, which Triton's autotuner calls back inside the launch.
PRE_HOOK_MATH = HEADER + """
@triton.autotune(configs=[triton.Config({"BLOCK": 64}, pre_hook=lambda nargs: nargs["y_ptr"].copy_(
    nargs["x_ptr"] / (1 + math.e ** (-nargs["x_ptr"]))))], key=["n"])
@triton.jit
def _nothing(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


def kernel_function(input, inplace=False):
    x = input.contiguous()
    y = torch.empty_like(x)
    _nothing[(1,)](x, y, x.numel())
    return y
"""


def _load(tmp_path: Path, source: str, *, screened: bool = True) -> Callable[..., Any]:
    source = textwrap.dedent(source)
    if screened:
        violations = LANGUAGE.screen(source, "silu")
        assert violations == [], format_violations(violations)
    path = tmp_path / f"cand_{uuid.uuid4().hex[:8]}.py"
    path.write_text(source)
    return LANGUAGE.load(path, path.stem)


class Watched:
    """The candidate as the sandbox child calls it: every call inside `monitor.watch`, its record kept."""

    def __init__(self, fn: Callable[..., Any], monitor: LaunchMonitor) -> None:
        self.fn, self.monitor, self.records = fn, monitor, []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.monitor.watch((args, kwargs)) as record:
            out = self.fn(*args, **kwargs)
        self.records.append(record)
        return out


def _run(fn: Callable[..., Any], *args: Any) -> tuple[Any, LaunchRecord]:
    with LANGUAGE.launch_monitor().watch(args) as record:
        out = fn(*args)
    return out, record


def test_triton_has_a_launch_monitor_and_the_base_language_none() -> None:
    from agent.languages.base import KernelLanguage

    assert isinstance(LANGUAGE.launch_monitor(), LaunchMonitor)
    assert KernelLanguage.launch_monitor(LANGUAGE) is None


def test_a_kernel_picked_from_a_per_shape_cache_passes(tmp_path: Path) -> None:
    fn = _load(tmp_path, PER_SHAPE_CACHE)
    x = torch.randn(3, 50)
    for _ in range(2):  # the second call takes the cached config
        out, record = _run(fn, x)
        torch.testing.assert_close(out, F.silu(x))
        assert record.launches == 1 and record.kernels == ("_silu_kernel",)
        assert record.compute_ops == () and record.host_reads == ()
        assert launch_issues([record]) == []


def test_several_launches_are_counted(tmp_path: Path) -> None:
    fn = _load(tmp_path, TWO_LAUNCHES)
    x = torch.randn(100)
    out, record = _run(fn, x)
    torch.testing.assert_close(out, F.silu(x))
    assert record.launches == 2 and record.kernels == ("_copy_kernel", "_silu_kernel")
    assert launch_issues([record]) == []


def test_a_heuristics_kernel_counts_once(tmp_path: Path) -> None:
    fn = _load(tmp_path, HEURISTICS)
    x = torch.randn(70)
    out, record = _run(fn, x)
    torch.testing.assert_close(out, F.silu(x))
    assert record.launches == 1 and record.kernels == ("_silu_heur",)
    assert launch_issues([record]) == []


def test_the_autotuned_honest_kernel_passes_the_oracle_and_the_launch_check_on_cpu(tmp_path: Path) -> None:
    fn = _load(tmp_path, AUTOTUNED)
    watched = Watched(fn, LANGUAGE.launch_monitor())
    samples = [Sample((torch.randn(4, 33),), {}), Sample((torch.randn(257),), {})]
    assert validate(F.silu, watched, samples) == []
    assert len(watched.records) >= len(samples)
    assert all(r.launches == 1 and r.kernels == ("_silu_tuned",) for r in watched.records)
    assert launch_issues(watched.records) == []


def test_the_interpreter_runs_the_first_autotune_config(tmp_path: Path) -> None:
    fn = _load(tmp_path, AUTOTUNED)
    tuned = fn.__globals__["_silu_tuned"]
    x = torch.randn(300)
    torch.testing.assert_close(fn(x), F.silu(x))
    assert tuned.best_config.kwargs == {"BLOCK": 32}
    assert len(tuned.configs) == 2  # restored after the call


def test_an_empty_call_needs_no_launch(tmp_path: Path) -> None:
    fn = _load(tmp_path, AUTOTUNED)
    out, record = _run(fn, torch.empty(0, 8))
    assert out.shape == (0, 8) and record.launches == 0 and record.empty_call
    assert launch_issues([record]) == []


def test_a_wrapper_that_launches_nothing_and_returns_pytorchs_result_fails(tmp_path: Path) -> None:
    fn = _load(tmp_path, NO_LAUNCH_OPERATORS)  # passes the screen
    watched = Watched(fn, LANGUAGE.launch_monitor())
    assert validate(F.silu, watched, [Sample((torch.randn(64),), {})]) == []  # the values are right
    issues = launch_issues(watched.records)
    assert [i.kind for i in issues] == [Outcome.FORBIDDEN, Outcome.FORBIDDEN]
    assert "computation outside the candidate's own kernels" in issues[0]
    assert "aten.pow.Scalar" in issues[0] and "aten.div.Tensor" in issues[0]
    assert f"in {len(watched.records)} of {len(watched.records)} calls" in issues[0]
    assert "no kernel of the candidate was launched" in issues[1]


def test_a_noop_launch_beside_tensor_math_fails(tmp_path: Path) -> None:
    fn = _load(tmp_path, NOOP_LAUNCH_OPERATORS)
    x = torch.randn(64)
    out, record = _run(fn, x)
    torch.testing.assert_close(out, F.silu(x))
    assert record.launches == 1
    assert {"aten.neg.default", "aten.pow.Scalar", "aten.add.Tensor", "aten.div.Tensor"} <= set(record.compute_ops)
    (issue,) = launch_issues([record])
    assert issue.startswith("launch check: computation outside")


def test_pytorch_functional_reached_at_run_time_fails(tmp_path: Path) -> None:
    fn = _load(tmp_path, FUNCTIONAL_FALLBACK, screened=False)
    assert LANGUAGE.screen(textwrap.dedent(FUNCTIONAL_FALLBACK), "silu") != []
    _, record = _run(fn, torch.randn(64))
    assert record.compute_ops == ("aten.silu.default",)
    assert launch_issues([record])


def test_values_computed_on_the_host_fail(tmp_path: Path) -> None:
    fn = _load(tmp_path, HOST_MATH)
    x = torch.randn(2, 16)
    out, record = _run(fn, x)
    torch.testing.assert_close(out, F.silu(x))
    assert record.host_reads == ("Tensor.tolist",) and record.compute_ops == ()
    (issue,) = launch_issues([record])
    assert "read tensor values on the host" in issue


def test_math_in_an_autotune_pre_hook_is_the_candidates(tmp_path: Path) -> None:
    fn = _load(tmp_path, PRE_HOOK_MATH)
    x = torch.randn(64)
    out, record = _run(fn, x)
    torch.testing.assert_close(out, F.silu(x))
    assert record.launches == 1
    assert "aten.pow.Scalar" in record.compute_ops
    assert launch_issues([record])


def test_a_call_that_raises_leaves_an_incomplete_record_and_no_watch(tmp_path: Path) -> None:
    fn = _load(tmp_path, PER_SHAPE_CACHE)
    monitor = LANGUAGE.launch_monitor()
    with pytest.raises(AttributeError), monitor.watch() as record:
        fn("not a tensor")
    assert not record.completed and WATCH.record is None
    assert launch_issues([record]) == []


def test_copies_and_conversions_are_reported_not_refused(tmp_path: Path) -> None:
    fn = _load(tmp_path, PER_SHAPE_CACHE)
    x = torch.randn(8, 6).t()  # .contiguous() copies
    out, record = _run(lambda t: fn(t).to(torch.float64), x)
    assert record.copy_ops == ("aten.clone.default", "aten._to_copy.default")
    assert launch_issues([record]) == []


_CORPUS_ARGS: dict[str, Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "silu": lambda: ((torch.randn(4, 64),), {}),
    "relu": lambda: ((torch.randn(4, 64),), {}),
    "rms_norm": lambda: ((torch.randn(4, 64), (64,), torch.randn(64)), {"eps": 1e-6}),
    "softmax": lambda: ((torch.randn(4, 64),), {"dim": -1}),
    "layer_norm": lambda: ((torch.randn(4, 64), (64,), torch.randn(64), torch.randn(64)), {}),
    "group_norm": lambda: ((torch.randn(2, 8, 16), 4, torch.randn(8), torch.randn(8)), {}),
}


def _runnable_honest_corpus() -> list[tuple[str, str, str]]:
    from tests.agent.test_screening import HONEST

    # Triton kernels only: the corpus's CUDA kernels (cassettes recorded with --language cuda) cannot launch on a
    # CPU; tests/agent/test_cuda_launch_check.py covers the CUDA launch check.
    return [(label, fn, src) for label, fn, src in HONEST if fn in _CORPUS_ARGS and "HANG" not in label
            and "COMPILE_ERROR" not in label and "load_cuda(" not in src]


CORPUS = _runnable_honest_corpus()


@pytest.mark.parametrize(("label", "function", "source"), CORPUS, ids=[label for label, _, _ in CORPUS])
def test_every_honest_kernel_of_the_project_passes_the_launch_check(tmp_path: Path, label: str, function: str,
                                                                      source: str) -> None:
    fn = _load(tmp_path, source, screened=False)  # screened in test_screening
    args, kwargs = _CORPUS_ARGS[function]()
    with LANGUAGE.launch_monitor().watch((args, kwargs)) as record:
        fn(*args, **kwargs)
    assert record.launches >= 1 and launch_issues([record]) == [], (label, record)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

RELAUNCH_COMPILED = HEADER + """
def kernel_function(input, inplace=False):
    x = input.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    compiled = _copy_kernel[(triton.cdiv(n, 64),)](x, y, n, BLOCK=64)
    compiled[(triton.cdiv(n, 64), 1, 1)](y, y, n, 64)
    _silu_kernel[(triton.cdiv(n, 64),)](y, y, n, BLOCK=64)
    return y
"""


@pytest.mark.cuda
@needs_cuda
def test_cuda_cached_and_compiled_launches_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for source, launches in ((PER_SHAPE_CACHE, 1), (TWO_LAUNCHES, 2), (AUTOTUNED, 1), (RELAUNCH_COMPILED, 3)):
        fn = _load(tmp_path, source)
        x = torch.randn(4, 100, device="cuda")
        for _ in range(3):  # the first launch compiles (JIT path), the next ones hit the launch cache
            out, record = _run(fn, x)
            torch.cuda.synchronize()
            torch.testing.assert_close(out, F.silu(x))
            assert record.launches == launches, (source, record)
            assert record.compute_ops == () and launch_issues([record]) == []
