"""Cached launches of generated Triton kernels (`agent.languages.triton.launch`).

On CPU the cache logic runs against real `JITFunction` objects (their parameters, hooks and global guards) whose
JIT path is replaced by a recorder standing in for compile-and-launch; the interpreted path is checked to pass
through untouched. The `cuda` tests launch real kernels and compare every cached launch with PyTorch.
"""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import triton.language  # noqa: F401 - first import under the conftest's TRITON_INTERPRET=1 (see _import)

from agent.languages.triton import TritonLanguage
from agent.languages.triton.hooks import install_triton_hooks, remove_triton_hooks
from agent.languages.triton.launch import (
    CachedLauncher,
    TritonRuntimeHooks,
    _compile_keyer,
    _key,
    cached_launchers,
    install_cached_launchers,
    remove_cached_launchers,
)
from forge.checking.launch_check import WATCH, LaunchMonitor
from forge.source_files import import_source_file
from tests.agent.kernels import SILU_OK

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

KERNELS = '''
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

SCALE = tl.constexpr(2)


@triton.jit
def scaled(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, EVEN: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x * alpha * SCALE, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def tuned(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0) + 1.0, mask=mask)


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def even(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0) * 3.0, mask=mask)


imported = JITFunction  # a non-kernel global
'''


def _import(tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch, *, interpret: bool) -> Any:
    # Triton is imported at the top of this file: imported first here with TRITON_INTERPRET=0, its own @jit library
    # (tl.sum...) would stay compiled-mode for the session and break every interpreted kernel that uses it later.
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpret else "0")
    path = tmp_path / f"k_{uuid.uuid4().hex[:8]}.py"
    path.write_text(textwrap.dedent(source))
    return import_source_file(path, path.stem)


class FakeRuntime:
    """The per-call reads of `TritonRuntimeHooks`, settable by the test."""

    def __init__(self) -> None:
        self.current_device = 0
        self.idle = True
        self.knobs: tuple[Any, ...] = (False, "")

    def state(self) -> tuple[Any, ...] | None:
        return (self.current_device, *self.knobs) if self.idle else None

    def stream(self, device: int) -> int:
        return 1000 + device


class Recorder:
    """Stands in for `JITFunction.run` (compile + launch) and for the compiled kernel's launcher."""

    def __init__(self, loaded: bool = True) -> None:
        self.jit_calls: list[tuple[tuple, dict]] = []
        self.launches: list[tuple] = []
        self.loaded = loaded

    def jit_run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        self.jit_calls.append((args, dict(kwargs, grid=grid, warmup=warmup)))
        return SimpleNamespace(function="fn-handle" if self.loaded else None, packed_metadata=("meta",),
                               run=self.launch)

    def launch(self, *launch_args: Any) -> None:
        self.launches.append(launch_args)


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    return _import(tmp_path, KERNELS, monkeypatch, interpret=False)


def _cached(jit_fn: Any, recorder: Recorder, runtime: FakeRuntime, **options: Any) -> CachedLauncher:
    jit_fn.run = recorder.jit_run
    return CachedLauncher(jit_fn, runtime=runtime, **options)


def _tensors(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(64, dtype=dtype), torch.zeros(64, dtype=dtype)


def test_second_identical_launch_skips_the_jit_and_passes_every_parameter(kernels: Any) -> None:
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    x, out = _tensors()
    for _ in range(3):
        launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32, num_warps=4)
    assert len(recorder.jit_calls) == 1
    assert len(recorder.launches) == 2  # the two hits; the miss launched inside the JIT path
    # grid padded to 3 dims, the current stream, the handle, the packed metadata, no hooks, then all parameters in
    # order: positional ones, the BLOCK keyword, EVEN's default. num_warps is an option, not an argument.
    assert recorder.launches[0] == (2, 1, 1, 1000, "fn-handle", ("meta",), None, None, None, x, out, 64, 0.5, 32,
                                    False)
    assert launcher.stats().hits == 2 and launcher.stats().misses == 1 and launcher.stats().entries == 1


@pytest.mark.parametrize(
    "change",
    ["dtype", "misaligned", "int_value", "int_to_bool", "float_to_int", "constexpr", "option", "device", "knob",
     "keyword_layout", "int_one"],
)
def test_a_change_that_could_respecialise_goes_through_the_jit(kernels: Any, change: str) -> None:
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    x, out = _tensors()
    base_args: tuple[Any, ...] = (x, out, 64, 0.5)
    base_kwargs: dict[str, Any] = {"BLOCK": 32, "num_warps": 4}
    launcher(*base_args, grid=(2,), warmup=False, **base_kwargs)
    args, kwargs = list(base_args), dict(base_kwargs)
    if change == "dtype":
        args[0] = x.to(torch.float16)
    elif change == "misaligned":
        args[0] = x[1:]  # 4 bytes past a 16-byte boundary: Triton drops its alignment assumption
    elif change == "int_value":
        args[2] = 48
    elif change == "int_one":
        args[2] = 1  # Triton specialises ints equal to 1
    elif change == "int_to_bool":
        args[2] = True
    elif change == "float_to_int":
        args[3] = 0
    elif change == "constexpr":
        kwargs["BLOCK"] = 64
    elif change == "option":
        kwargs["num_warps"] = 8
    elif change == "device":
        runtime.current_device = 1
    elif change == "knob":
        runtime.knobs = (True, "")
    elif change == "keyword_layout":
        args, kwargs = args[:3], {"alpha": 0.5, **kwargs}
    launcher(*args, grid=(2,), warmup=False, **kwargs)
    assert len(recorder.jit_calls) == 2 and not recorder.launches
    launcher(*args, grid=(2,), warmup=False, **kwargs)  # and that new key is cached in turn
    assert len(recorder.jit_calls) == 2 and len(recorder.launches) == 1


@pytest.mark.parametrize(("first", "second"), [(1, True), (1.0, 1), (0, False), (2.0, 2)])
def test_equal_scalars_of_another_type_are_another_key(kernels: Any, first: Any, second: Any) -> None:
    """1 == True == 1.0 in Python, but Triton types them i32 / i1 / fp32: a key on the value alone would mix them."""
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    x, out = _tensors()
    launcher(x, out, first, 0.5, grid=(2,), warmup=False, BLOCK=32)
    launcher(x, out, second, 0.5, grid=(2,), warmup=False, BLOCK=32)
    assert len(recorder.jit_calls) == 2 and not recorder.launches


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((torch.zeros(4), 3, 0.5, True, None, "s", torch.float16), {}),
     ((torch.zeros(4),), {"BLOCK": 64, "num_warps": 4, "out": torch.zeros(2, dtype=torch.int8)}),
     ((), {"odd-name'\"": 1})],
)
def test_compiled_keyer_gives_the_generic_key(args: tuple, kwargs: dict) -> None:
    keyer = _compile_keyer(args, kwargs)
    assert keyer is not None and keyer((1, False), args, kwargs) == _key((1, False), args, kwargs) is not None


@pytest.mark.parametrize(
    ("first", "second"),
    [((torch.zeros(4), 3), (torch.zeros(4), True)), ((torch.zeros(4), 3), (3, torch.zeros(4))),
     ((torch.zeros(4), 3.0), (torch.zeros(4), 3))],
)
def test_compiled_keyer_refuses_other_kinds(first: tuple, second: tuple) -> None:
    keyer = _compile_keyer(first, {})
    assert keyer is not None and keyer((0,), second, {}) is None
    assert _key((0,), second, {}) != _key((0,), first, {})  # and the generic key tells them apart


def test_keyer_only_for_plain_tensors_and_scalars() -> None:
    weight = torch.nn.Parameter(torch.zeros(4))
    assert _compile_keyer((weight,), {}) is None and _key((0,), (weight,), {}) is not None  # generic path
    assert _compile_keyer(((1, 2),), {}) is None and _key((0,), ((1, 2),), {}) is None  # uncacheable


def test_same_specialisation_with_other_buffers_hits(kernels: Any) -> None:
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    launcher(*_tensors(), 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    x2, out2 = _tensors()
    launcher(x2, out2, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    assert len(recorder.jit_calls) == 1 and recorder.launches[0][9:11] == (x2, out2)


@pytest.mark.parametrize("case", ["warmup", "pre_run_hook", "launch_hook", "uncacheable_arg"])
def test_bypasses_never_use_the_cache(kernels: Any, case: str) -> None:
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    x, out = _tensors()
    alpha: Any = 0.5
    warmup = case == "warmup"
    if case == "pre_run_hook":
        kernels.scaled.add_pre_run_hook(lambda *a, **k: None)
    elif case == "launch_hook":
        runtime.idle = False
    elif case == "uncacheable_arg":
        alpha = (0.5, 0.25)
    for _ in range(3):
        launcher(x, out, 64, alpha, grid=(2,), warmup=warmup, BLOCK=32)
    assert len(recorder.jit_calls) == 3 and not recorder.launches
    assert launcher.stats().bypasses == 3 and launcher.stats().entries == 0


def test_changed_global_goes_back_to_the_jit_guard(kernels: Any) -> None:
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    kernels.scaled.used_global_vals[("SCALE", id(vars(kernels)))] = (2, vars(kernels))  # what compiling records
    x, out = _tensors()
    launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    assert len(recorder.jit_calls) == 1
    kernels.SCALE = 3
    launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    assert len(recorder.jit_calls) == 2  # the JIT path raises Triton's "global variable changed" error here


def test_callable_grid_sees_every_parameter_by_name(kernels: Any) -> None:
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    seen: list[dict] = []

    def grid(meta: dict) -> tuple[int, int]:
        seen.append(meta)
        return (meta["n"] // meta["BLOCK"], 3)

    x, out = _tensors()
    launcher(x, out, 64, 0.5, grid=grid, warmup=False, BLOCK=16)
    launcher(x, out, 64, 0.5, grid=grid, warmup=False, BLOCK=16)
    assert recorder.launches[0][:3] == (4, 3, 1)
    assert seen == [{"x_ptr": x, "out_ptr": out, "n": 64, "alpha": 0.5, "BLOCK": 16, "EVEN": False}]


def test_kernel_not_loaded_is_not_cached_and_the_cache_is_bounded(kernels: Any) -> None:
    recorder = Recorder(loaded=False)
    launcher = _cached(kernels.scaled, recorder, FakeRuntime())
    x, out = _tensors()
    launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    assert len(recorder.jit_calls) == 2 and launcher.stats().entries == 0

    recorder = Recorder()
    launcher = _cached(kernels.scaled, recorder, FakeRuntime(), max_entries=2)
    for n in (10, 20, 30, 30):
        launcher(x, out, n, 0.5, grid=(2,), warmup=False, BLOCK=32)
    assert launcher.stats().entries == 2 and len(recorder.jit_calls) == 4  # n=30 never got an entry


def test_runtime_state_is_none_while_a_launch_hook_is_active() -> None:
    from triton import knobs

    hooks = TritonRuntimeHooks(current_device=lambda: 3)
    idle = hooks.state()
    assert idle is not None and idle[0] == 3 and False in idle[1:]  # device, then knobs such as debug=False
    fired: list[Any] = []
    knobs.runtime.launch_enter_hook.add(fired.append)
    try:
        assert hooks.state() is None
    finally:
        knobs.runtime.launch_enter_hook.remove(fired.append)
    assert hooks.state() == idle
    chain = knobs.runtime.launch_exit_hook
    knobs.runtime.launch_exit_hook = fired.append  # the older API: a plain callable
    try:
        assert hooks.state() is None
    finally:
        knobs.runtime.launch_exit_hook = chain


def test_runtime_state_carries_the_compile_knobs() -> None:
    from triton import knobs

    hooks = TritonRuntimeHooks(current_device=lambda: 0)
    before, saved = hooks.state(), knobs.runtime.debug
    knobs.runtime.debug = not saved
    try:
        assert hooks.state() != before
    finally:
        knobs.runtime.debug = saved
    assert hooks.state() == before


def test_install_wraps_the_module_kernels_also_inside_autotune_and_heuristics(kernels: Any) -> None:
    assert install_cached_launchers(kernels) == 3
    launchers = cached_launchers(kernels)
    assert sorted(launchers) == ["even", "scaled", "tuned"]
    assert kernels.tuned.fn.run is launchers["tuned"] and kernels.even.fn.run is launchers["even"]
    assert install_cached_launchers(kernels) == 0  # idempotent
    assert remove_cached_launchers(kernels) == 3 and cached_launchers(kernels) == {}
    assert "run" not in vars(kernels.scaled)  # JITFunction.run again


def test_install_leaves_kernels_of_other_modules_alone(kernels: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    other = _import(tmp_path, f"from {kernels.__name__} import scaled\n", monkeypatch, interpret=False)
    assert install_cached_launchers(other) == 0
    assert "run" not in vars(kernels.scaled)


def test_interpreted_kernels_pass_through_and_still_compute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    path = tmp_path / "silu_interp.py"
    path.write_text(SILU_OK)
    name = f"silu_interp_{uuid.uuid4().hex[:8]}"
    entry = TritonLanguage().load(path, name)
    assert cached_launchers(sys.modules[name]) == {}
    x = torch.randn(3000)
    torch.testing.assert_close(entry(x), F.silu(x))


def test_language_load_installs_cached_launchers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    path = tmp_path / "silu_jit.py"
    path.write_text(SILU_OK)
    name = f"silu_jit_{uuid.uuid4().hex[:8]}"
    TritonLanguage().load(path, name)
    assert list(cached_launchers(sys.modules[name])) == ["_silu"]


def test_language_load_without_the_cache_when_switched_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("KFORGE_TRITON_LAUNCH_CACHE", "0")
    path = tmp_path / "silu_off.py"
    path.write_text(SILU_OK)
    name = f"silu_off_{uuid.uuid4().hex[:8]}"
    TritonLanguage().load(path, name)
    assert cached_launchers(sys.modules[name]) == {}


def test_the_launch_cache_switch_is_a_flag_and_refuses_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.languages.triton.launch import launch_cache_enabled
    from forge.errors import SettingError

    monkeypatch.delenv("KFORGE_TRITON_LAUNCH_CACHE", raising=False)
    assert launch_cache_enabled()
    monkeypatch.setenv("KFORGE_TRITON_LAUNCH_CACHE", "Off")
    assert not launch_cache_enabled()
    monkeypatch.setenv("KFORGE_TRITON_LAUNCH_CACHE", "sometimes")
    with pytest.raises(SettingError, match="KFORGE_TRITON_LAUNCH_CACHE='sometimes' is not a flag"):
        launch_cache_enabled()


# -- the run-time launch check ------------------------------------------------------------------------------------
def test_cache_hits_count_as_launches_for_the_launch_check(kernels: Any) -> None:
    recorder, runtime = Recorder(), FakeRuntime()
    launcher = _cached(kernels.scaled, recorder, runtime)
    x, out = _tensors()
    with LaunchMonitor("triton").watch() as record:
        for _ in range(3):
            launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
    # the two hits count here; the miss went through the stand-in JIT path (the real one counts itself, see below)
    assert len(recorder.launches) == 2 and record.launches == 2 and record.kernels == ("scaled",)
    with LaunchMonitor("triton").watch() as record:
        WATCH.depth = 1  # inside another launch (an autotuner benchmarking): part of that launch
        launcher(x, out, 64, 0.5, grid=(2,), warmup=False, BLOCK=32)
        WATCH.depth = 0
    assert len(recorder.launches) == 3 and record.launches == 0


def test_launchers_made_before_the_hooks_fall_back_to_the_counting_jit_path(kernels: Any) -> None:
    remove_triton_hooks()  # as in a process that loaded the candidate before asking for the monitor
    install_cached_launchers(kernels)
    try:
        launchers = cached_launchers(kernels).values()
        assert all(not hasattr(launcher.slow_run.__func__, "__kforge_counting__") for launcher in launchers)
        TritonLanguage().launch_monitor()
        assert all(hasattr(launcher.slow_run.__func__, "__kforge_counting__") for launcher in launchers)
        remove_triton_hooks()
        assert all(not hasattr(launcher.slow_run.__func__, "__kforge_counting__") for launcher in launchers)
    finally:
        remove_cached_launchers(kernels)
        install_triton_hooks()


@pytest.mark.skipif(torch.cuda.is_available(), reason="relies on the compile failing without a GPU driver")
def test_the_jit_path_counts_its_launch(kernels: Any) -> None:
    install_triton_hooks()
    x, out = _tensors()
    with LaunchMonitor("triton").watch() as record:
        with pytest.raises(RuntimeError, match="active drivers"):  # no GPU driver: the compile fails after counting
            kernels.scaled[(1,)](x, out, 64, 0.5, BLOCK=32)
    assert record.launches == 1 and record.kernels == ("scaled",)


# -- on a GPU: real compiles and launches ----------------------------------------------------------------------
def _cassette_silu() -> str:
    from agent.replies import extract_code

    cassette = Path(__file__).resolve().parents[2] / "evals" / "cassettes" / "demo_h200.jsonl"
    for line in cassette.read_text().splitlines():
        record = json.loads(line)
        if record["tag"] == "silu":
            return extract_code(record["response"]["text"]).code
    raise AssertionError("no silu reply in the cassette")


@pytest.mark.cuda
@needs_cuda
def test_cuda_cached_launches_match_pytorch(kernels: Any) -> None:
    install_cached_launchers(kernels)
    launcher = cached_launchers(kernels)["scaled"]
    base = torch.randn(4096 + 8, device="cuda")
    for n, offset, alpha in [(4096, 0, 0.5), (4096, 0, 0.5), (4000, 1, 0.5), (4000, 1, 0.5), (1, 0, 2.0),
                             (4096, 4, 0.25), (4096, 0, 0.5)]:
        x = base[offset:offset + n]
        out = torch.full_like(x, float("nan"))
        kernels.scaled[(triton_cdiv(n, 256),)](x, out, n, alpha, BLOCK=256)
        torch.testing.assert_close(out, x * alpha * 2)
    assert launcher.stats().hits >= 3 and launcher.stats().entries == 4


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.cuda
@needs_cuda
def test_cuda_autotuned_and_heuristic_kernels_through_the_cache(kernels: Any) -> None:
    install_cached_launchers(kernels)
    for n in (1000, 1024, 1000):
        x = torch.randn(n, device="cuda")
        out = torch.empty_like(x)
        kernels.tuned[lambda meta, n=n: (triton_cdiv(n, meta["BLOCK"]),)](x, out, n)
        torch.testing.assert_close(out, x + 1)
        kernels.even[(triton_cdiv(n, 128),)](x, out, n, BLOCK=128)
        torch.testing.assert_close(out, x * 3)
    assert cached_launchers(kernels)["even"].stats().hits >= 1


@pytest.mark.cuda
@needs_cuda
def test_cuda_launch_hook_still_fires(kernels: Any) -> None:
    from triton import knobs

    install_cached_launchers(kernels)
    x = torch.randn(256, device="cuda")
    out = torch.empty_like(x)
    kernels.scaled[(1,)](x, out, 256, 1.0, BLOCK=256)
    fired: list[Any] = []
    knobs.runtime.launch_enter_hook.add(fired.append)
    try:
        kernels.scaled[(1,)](x, out, 256, 1.0, BLOCK=256)
    finally:
        knobs.runtime.launch_enter_hook.remove(fired.append)
    assert len(fired) == 1


@pytest.mark.cuda
@needs_cuda
def test_cuda_generated_silu_provider_uses_the_cache(tmp_path: Path) -> None:
    from agent.provider import GeneratedKernelProvider
    from forge.samples import Sample

    x = torch.randn(4, 512, 2816, device="cuda", dtype=torch.bfloat16)
    provider = GeneratedKernelProvider("silu", _cassette_silu(), language="triton", cache_dir=tmp_path)
    assert provider.prepare([Sample((x,), {})])
    for _ in range(3):
        torch.testing.assert_close(provider(x), F.silu(x))
    stats = provider.launch_stats()
    assert stats["_silu_kernel"].hits == 2 and stats["_silu_kernel"].misses == 1
