"""Kernel libraries as static providers (`forge.providers.libraries`): the seam, the provider, plans, adapters.

A real stand-in library (a module written to a temporary folder with a Triton silu kernel, run by the Triton
interpreter on CPU) goes through the same registration, oracle and plan round trip as FlagGems and Liger-Kernel;
the FlagGems and Liger adapters' argument mapping is checked against stand-in modules built from torch ops, and
the tests that need the real libraries skip when they are absent (they need a GPU to run anyway).
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from forge import KernelOptimizationPlan
from forge.checking import validate
from forge.plan import PlanEntry, PlanLoadError
from forge.provider import KernelProvider
from forge.providers import default_providers
from forge.providers.libraries import (
    FLAGGEMS,
    LIGER,
    KernelLibrary,
    LibraryFunction,
    LibraryKernelProvider,
    LibraryUnavailable,
    get_library,
    installed_library_providers,
    kernel_libraries,
    library_providers,
    register_library,
    unregister_library,
)
from forge.providers.libraries.checks import all_of, floating_input, rejects_true
from forge.providers.libraries.flaggems import group_norm_refusal
from forge.samples import Sample

_STANDIN_SOURCE = '''
"""A stand-in kernel library: silu as a Triton kernel (and a subtly wrong variant)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _silu_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = x / (1.0 + tl.exp(-x)) * scale
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x, scale):
    x = x.contiguous()
    y = torch.empty_like(x)
    _silu_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), scale, BLOCK=256)
    return y


def silu(x):
    return _launch(x, 1.0)


def silu_off_by_a_percent(x):
    return _launch(x, 1.01)
'''


def _silu(module):
    op = module.silu

    def silu(input, inplace=False):  # noqa: A002 - F's names
        return op(input)

    return silu


def _wrong_silu(module):
    op = module.silu_off_by_a_percent

    def silu(input, inplace=False):  # noqa: A002 - F's names
        return op(input)

    return silu


def _library(name: str, module: str, build=_silu) -> KernelLibrary:
    return KernelLibrary(
        name=name, title=name.title(), module=module, install_hint=f"pip install {name}",
        functions=(LibraryFunction("silu", build, all_of(floating_input, rejects_true("inplace"))),),
        default_functions=("silu",), device_types=frozenset({"cpu", "cuda"}))


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelLibrary]:
    """A real library module on sys.path, registered as "standin"; unregistered afterwards."""
    module = f"kforge_standin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(_STANDIN_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    library = register_library(_library("standin", module))
    yield library
    unregister_library("standin")
    sys.modules.pop(module, None)


@pytest.fixture
def missing() -> Iterator[KernelLibrary]:
    library = register_library(_library("missinglib", "kforge_no_such_module_anywhere"))
    yield library
    unregister_library("missinglib")


def _silu_sample(*shape: int, dtype: torch.dtype = torch.float32, **kwargs) -> Sample:
    return Sample((torch.randn(*shape).to(dtype),), kwargs)


# -- the stand-in library through the oracle and plans ------------------------------------------------------
def test_standin_library_passes_the_oracle_and_a_wrong_one_fails(standin: KernelLibrary) -> None:
    samples = [_silu_sample(3, 100), _silu_sample(257, dtype=torch.float16, inplace=False)]
    provider = LibraryKernelProvider("standin", "silu")
    assert provider.prepare(samples) and provider.name == "Standin silu"
    assert validate(F.silu, provider, samples, fresh_inputs_per_sample=1) == []

    wrong = register_library(_library("standin", standin.module, build=_wrong_silu), replace=True)
    bad = LibraryKernelProvider(wrong, "silu")
    assert bad.prepare(samples)  # it runs...
    errors = validate(F.silu, bad, samples, fresh_inputs_per_sample=1)
    assert errors and "outside tolerance" in errors[0]  # ...but the oracle rejects it


def test_supports_check_refuses_calls_the_library_cannot_serve(standin: KernelLibrary) -> None:
    provider = LibraryKernelProvider("standin", "silu")
    assert provider.refusal(_silu_sample(8, inplace=True)) == "inplace=True is not supported"
    assert "float64" in provider.refusal(_silu_sample(8, dtype=torch.float64))
    assert "signature" in provider.refusal(Sample((torch.randn(4),), {"approximate": "tanh"}))
    assert not provider.prepare([_silu_sample(8), _silu_sample(8, inplace=True)])
    assert provider.prepare([_silu_sample(8)])


def test_library_that_runs_on_cuda_only_refuses_cpu_samples(standin: KernelLibrary) -> None:
    register_library(dataclasses.replace(standin, device_types=frozenset({"cuda"})), replace=True)
    provider = LibraryKernelProvider("standin", "silu")
    assert provider.refusal(_silu_sample(8)) == "Standin does not run on cpu"
    assert not provider.prepare([_silu_sample(8)])
    with pytest.raises(ValueError, match="does not run on cpu"):
        library_providers("cpu", ["standin"])


def test_plan_round_trip_and_apply(standin: KernelLibrary, tmp_path: Path) -> None:
    x = torch.randn(4, 64)
    provider = LibraryKernelProvider("standin", "silu")
    assert provider.prepare([Sample((x,), {})])
    assert provider.to_dict() == {"type": "kernel_library", "library": "standin", "function": "silu"}
    restored = KernelProvider.from_dict(provider.to_dict())
    assert isinstance(restored, LibraryKernelProvider) and restored.is_ready
    torch.testing.assert_close(restored(x), F.silu(x))

    called = Sample((x,), {"inplace": False})  # as nn.SiLU calls F.silu
    path = KernelOptimizationPlan(entries=(PlanEntry(provider, (called,)),)).save(tmp_path / "p.json")
    plan = KernelOptimizationPlan.load(path)
    model = torch.nn.Sequential(torch.nn.SiLU())
    with plan.apply(model) as runtime:
        out = model(x)
    torch.testing.assert_close(out, F.silu(x))
    assert runtime.stats["silu"].provider_calls == 1 and runtime.stats["silu"].fallback_calls == 0


def test_provider_pickles_by_name(standin: KernelLibrary) -> None:
    import pickle

    provider = LibraryKernelProvider("standin", "silu")
    assert provider.prepare([_silu_sample(16)])
    copy = pickle.loads(pickle.dumps(provider))
    assert copy.is_ready and copy.library is get_library("standin")
    torch.testing.assert_close(copy(torch.ones(5)), F.silu(torch.ones(5)))


# -- missing and broken libraries ---------------------------------------------------------------------------
def test_missing_library_is_one_clear_line_everywhere(missing: KernelLibrary) -> None:
    with pytest.raises(LibraryUnavailable, match=r"Missinglib is not installed .*pip install missinglib") as info:
        library_providers("cpu", ["missinglib"])
    assert "\n" not in str(info.value)
    assert not LibraryKernelProvider("missinglib", "silu").prepare([_silu_sample(4)])
    assert all(p.library.name != "missinglib" for p in installed_library_providers("cpu"))

    state = {"type": "kernel_library", "library": "missinglib", "function": "silu"}
    with pytest.raises(ValueError, match="pip install missinglib"):
        KernelProvider.from_dict(state)
    plan = {**KernelOptimizationPlan(entries=()).to_dict(), "environment": {},
            "entries": [{"function": "silu", "provider": state, "signatures": []}]}
    with pytest.raises(PlanLoadError, match="pip install missinglib"):
        KernelOptimizationPlan.from_dict(plan)


def test_library_whose_import_raises_is_unavailable_not_a_traceback(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"kforge_gpu_only_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text('raise RuntimeError("No device were detected on your machine !\\n more")')
    monkeypatch.syspath_prepend(str(tmp_path))
    library = register_library(_library("gpuonly", module))
    try:
        reason = library.unavailable_reason()
        assert reason is not None and "\n" not in reason
        assert "RuntimeError: No device were detected" in reason and "pip install gpuonly" in reason
        with pytest.raises(LibraryUnavailable):
            library_providers("cpu", ["gpuonly"])
    finally:
        unregister_library("gpuonly")
        sys.modules.pop(module, None)


# -- registry and defaults ----------------------------------------------------------------------------------
def test_registry_rules(standin: KernelLibrary) -> None:
    assert get_library("STANDIN") is standin
    with pytest.raises(ValueError, match="already registered"):
        register_library(_library("standin", "other_module"))
    with pytest.raises(ValueError, match="unknown kernel library 'nope'.*flaggems"):
        get_library("nope")
    with pytest.raises(ValueError, match="has no adapter for F.gelu"):
        LibraryKernelProvider("standin", "gelu")
    with pytest.raises(ValueError, match="lower-case identifier"):
        _library("Bad Name", "m")
    with pytest.raises(ValueError, match="default functions"):
        dataclasses.replace(_library("x", "m"), default_functions=("gelu",))
    with pytest.raises(ValueError, match="not a replaceable"):
        LibraryFunction("no_such_function", _silu)


def test_default_providers_offer_libraries_only_on_cuda(standin: KernelLibrary) -> None:
    assert [p.name for p in installed_library_providers("cpu") if p.library is standin] == ["Standin silu"]
    assert not any(isinstance(p, LibraryKernelProvider) for p in default_providers("cpu"))
    assert {"flaggems", "liger"} <= set(kernel_libraries())


# -- FlagGems / Liger adapters: argument mapping against torch stand-ins ------------------------------------
def _fake_flaggems() -> SimpleNamespace:
    def group_norm(x, w, b, n, c, hw, groups, eps):
        assert x.numel() == n * c * hw
        return F.group_norm(x, groups, w, b, eps), None, None

    return SimpleNamespace(
        layer_norm=lambda x, shape, w, b, eps: (F.layer_norm(x, shape, w, b, eps), None, None),
        rms_norm=lambda x, shape, w, eps: F.rms_norm(x, shape, w, eps),
        group_norm=group_norm,
        softmax=lambda x, dim, half_to_float: torch.softmax(x, dim),
        gelu=lambda x, approximate: F.gelu(x, approximate=approximate),
        silu=lambda x: F.silu(x),
    )


def _fake_liger() -> SimpleNamespace:
    def rms_norm(x, w, eps, offset, casting_mode, in_place):
        assert (offset, casting_mode, in_place) == (0.0, "gemma", False)
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    return SimpleNamespace(
        liger_layer_norm=lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        liger_rms_norm=rms_norm,
        liger_group_norm=lambda x, w, b, channels, groups, eps: F.group_norm(x, groups, w, b, eps),
        liger_softmax=lambda x: torch.softmax(x, -1),
    )


_CALLS = {
    "layer_norm": (lambda: (torch.randn(2, 5, 16), (16,), torch.randn(16), torch.randn(16)), {"eps": 1e-6}),
    "rms_norm": (lambda: (torch.randn(3, 16), [16], torch.randn(16)), {}),
    "group_norm": (lambda: (torch.randn(2, 8, 3, 3), 4, torch.randn(8), torch.randn(8)), {}),
    "softmax": (lambda: (torch.randn(2, 7),), {"dim": -1}),
    "gelu": (lambda: (torch.randn(9),), {"approximate": "tanh"}),
    "silu": (lambda: (torch.randn(9),), {}),
}


@pytest.mark.parametrize("library, fake", [(FLAGGEMS, _fake_flaggems), (LIGER, _fake_liger)], ids=["flaggems", "liger"])
def test_adapters_map_f_arguments_onto_the_library_call(library: KernelLibrary, fake) -> None:
    for function in library.function_names:
        make_args, kwargs = _CALLS[function]
        args = make_args()
        adapter = library.adapter(function).build(fake())
        expected = getattr(F, function)(*args, **kwargs)
        torch.testing.assert_close(adapter(*args, **kwargs), expected, msg=f"{library.name} {function}")


def test_adapter_checks_refuse_what_the_libraries_get_wrong_or_lack() -> None:
    def arguments(function: str, *args, **kwargs) -> dict:
        from forge.providers.libraries.base import bind_arguments

        library = FLAGGEMS if function.startswith("fg:") else LIGER
        name = function.split(":")[1]
        return bind_arguments(library.adapter(name).build(_fake_flaggems() if library is FLAGGEMS else
                                                          _fake_liger()), Sample(args, kwargs))

    sd_unet = arguments("fg:group_norm", torch.randn(1, 320, 2, 2).half(), 32)
    assert "10 channels per group is not a power of two" in group_norm_refusal(sd_unet)
    assert group_norm_refusal(arguments("fg:group_norm", torch.randn(1, 512, 2, 2).half(), 32)) is None
    assert "does not divide" in group_norm_refusal(arguments("fg:group_norm", torch.randn(1, 30, 2).half(), 4))

    ln = LIGER.adapter("layer_norm").supports
    assert "needs bias" in ln(arguments("lg:layer_norm", torch.randn(2, 8), (8,), torch.randn(8)))
    assert ln(arguments("lg:layer_norm", torch.randn(2, 8), (8,), torch.randn(8), torch.randn(8))) is None
    assert "last dimension" in ln(arguments("lg:layer_norm", torch.randn(2, 4, 8), (4, 8), torch.randn(4, 8),
                                            torch.randn(4, 8)))
    sm = LIGER.adapter("softmax").supports
    assert "not the last dimension" in sm(arguments("lg:softmax", torch.randn(2, 8), 0))
    assert "dtype conversion" in sm(arguments("lg:softmax", torch.randn(2, 8), -1, dtype=torch.float64))
    assert "float64" in FLAGGEMS.adapter("layer_norm").supports(
        arguments("fg:layer_norm", torch.randn(2, 8).double(), (8,)))
    fg_ln = FLAGGEMS.adapter("layer_norm").supports
    assert "not the input's trailing shape" in fg_ln(arguments("fg:layer_norm", torch.randn(2, 4, 8), (4,)))
    assert fg_ln(arguments("fg:layer_norm", torch.randn(2, 4, 8), (4, 8))) is None
    assert "implicit dim" in FLAGGEMS.adapter("softmax").supports(arguments("fg:softmax", torch.randn(2, 8)))
    assert "more than Liger's 65536" in sm(arguments("lg:softmax", torch.randn(1, 65537), -1))
    gn = LIGER.adapter("group_norm").supports
    assert "contiguous" in gn(arguments("lg:group_norm", torch.randn(8, 2, 3).transpose(0, 1), 2,
                                        torch.randn(2), torch.randn(2)))


# -- the real libraries, where installed ----------------------------------------------------------------------
@pytest.mark.parametrize("library", [FLAGGEMS, LIGER], ids=["flaggems", "liger"])
def test_real_library_loads_or_says_why_in_one_line(library: KernelLibrary) -> None:
    if not library.is_installed():
        pytest.skip(f"{library.title} is not installed")
    reason = library.unavailable_reason()
    if reason is not None:  # FlagGems cannot be imported without a GPU
        assert "\n" not in reason and library.install_hint in reason
        return
    module = library.load()
    for function in library.function_names:
        assert callable(library.adapter(function).build(module))  # the library's API still has what we call


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the libraries' kernels need CUDA")
@pytest.mark.parametrize("library", [FLAGGEMS, LIGER], ids=["flaggems", "liger"])
def test_real_library_layer_norm_and_softmax_pass_the_oracle_on_cuda(library: KernelLibrary) -> None:
    if library.unavailable_reason() is not None:
        pytest.skip(library.unavailable_reason())
    x, w, b = torch.randn(64, 768, device="cuda"), torch.randn(768, device="cuda"), torch.randn(768, device="cuda")
    for function, sample in (("layer_norm", Sample((x, (768,), w, b, 1e-5), {})),
                             ("softmax", Sample((x,), {"dim": -1}))):
        provider = LibraryKernelProvider(library, function)
        assert provider.prepare([sample])
        assert validate(getattr(F, function), provider, [sample], fresh_inputs_per_sample=1) == []
