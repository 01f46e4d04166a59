"""Prompt rendering with real samples: every template, the views that fill them, overrides, hashing, semantics."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from agent.examples import EXAMPLES_DIR
from agent.prompting import (
    Failure,
    KernelTask,
    ModuleTask,
    Performance,
    PromptRenderer,
    PromptTemplateError,
    SampleEntry,
    describe_value,
    format_time_ms,
    worst_mismatches,
)
from agent.roofline import estimate
from agent.semantics import entry_signature, parameter_names, semantics_summary, signature_text
from forge.functional import functional_names, original_function
from forge.outcome import Outcome
from forge.samples import Sample, TensorSpec
from prompts import PROMPTS_DIR

BUILTIN_TEMPLATES = ["system.j2", "generate.j2", "fix.j2", "optimize.j2", "generate_module.j2", "fix_module.j2",
                     "optimize_module.j2", "_performance.j2"]


# ---------------------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------------------
def _layer_norm_samples() -> list[tuple[int, Sample, float]]:
    g = torch.Generator().manual_seed(0)
    fp32 = torch.randn(8, 96, generator=g)
    bf16 = torch.randn(4, 3, 64, generator=g).to(torch.bfloat16)
    storage = torch.randn(20 * 160, generator=g)
    strided = storage[7:].as_strided((20, 96), (160, 1))  # non-contiguous rows, storage offset 7
    w96, b96 = torch.randn(96, generator=g), torch.randn(96, generator=g)
    w64 = torch.randn(64, generator=g).to(torch.bfloat16)
    return [
        (120, Sample((fp32, [96]), {"weight": w96, "bias": b96, "eps": 1e-6}), 0.5),
        (40, Sample((bf16, (64,), w64), {}), 0.3),
        (7, Sample((strided, [96], w96, b96, 1e-5), {}), 0.2),
    ]


@pytest.fixture
def task() -> KernelTask:
    return KernelTask.from_samples("layer_norm", _layer_norm_samples(), language="triton")


@pytest.fixture
def renderer() -> PromptRenderer:
    return PromptRenderer()


def _module_task() -> ModuleTask:
    source = (EXAMPLES_DIR / "module_example_reference.py").read_text()
    return ModuleTask.from_source(source, name="scaled_leaky_relu", dtype=torch.bfloat16, language="triton")


# ---------------------------------------------------------------------------------------------------------
# KernelTask
# ---------------------------------------------------------------------------------------------------------
def test_task_from_samples_fills_device_counts_and_shares(task):
    assert task.device_name == "CPU (Triton interpreter)"
    assert task.compute_capability is None
    assert [e.count for e in task.samples] == [120, 40, 7]
    assert [e.time_share for e in task.samples] == [0.5, 0.3, 0.2]
    assert task.language == "triton"


def test_task_accepts_plain_samples_pairs_and_explicit_shares():
    s1 = Sample((torch.randn(3),), {})
    s2 = Sample((torch.randn(5),), {})
    task = KernelTask.from_samples("relu", [s1, (4, s2)], time_shares=[0.25, 0.75], language="triton")
    assert [(e.count, e.time_share) for e in task.samples] == [(None, 0.25), (4, 0.75)]
    direct = KernelTask("relu", [SampleEntry(s1, 2)], "NVIDIA H200", (9, 0), language="triton")
    assert direct.compute_capability == (9, 0)


def test_task_rejects_bad_input():
    s = Sample((torch.randn(3),), {})
    with pytest.raises(ValueError, match="not a replaceable"):
        KernelTask("not_a_function", [s], language="triton")
    with pytest.raises(ValueError, match="at least one sample"):
        KernelTask("relu", [], language="triton")
    with pytest.raises(ValueError, match="time_share"):
        KernelTask("relu", [(1, s, 30.0)], language="triton")
    with pytest.raises(ValueError, match="unsupported kernel language 'fortran'; registered languages: cuda, triton"):
        KernelTask("relu", [s], language="fortran")
    with pytest.raises(ValueError, match="one per sample"):
        KernelTask.from_samples("relu", [s], time_shares=[0.5, 0.5], language="triton")
    with pytest.raises(TypeError, match="Sample"):
        KernelTask("relu", [torch.randn(3)], language="triton")


def test_signature_key_depends_on_layouts_not_values():
    a = KernelTask("relu", [Sample((torch.randn(4, 8),), {})], language="triton")
    b = KernelTask("relu", [Sample((torch.randn(4, 8),), {})], language="triton")
    c = KernelTask("relu", [Sample((torch.randn(4, 8).t(),), {})], language="triton")
    d = KernelTask("relu", [Sample((torch.randn(4, 8),), {})], "NVIDIA H200", (9, 0), language="triton")
    assert a.signature_key() == b.signature_key()
    assert len({a.signature_key(), c.signature_key(), d.signature_key()}) == 3


# ---------------------------------------------------------------------------------------------------------
# generate / system
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda: torch.randn(4, 6).t(), "a permuted/transposed view of dense memory"),
        (lambda: torch.randn(2, 3, 4).permute(2, 0, 1), "a permuted/transposed view of dense memory"),
        (lambda: torch.randn(4, 6)[:, :3], "a strided view (e.g. a slice)"),
        (lambda: torch.randn(6).expand(4, 6), "broadcast view: stride 0 on dim(s) 0"),
    ],
)
def test_a_non_contiguous_argument_is_described_by_its_kind_of_layout(make, kind):
    text = describe_value(make())
    assert "NON-CONTIGUOUS" in text and kind in text


def test_generate_prompt_carries_every_signature_and_the_rules(task, renderer):
    text = renderer.generate(task)
    assert "torch.nn.functional.layer_norm" in text
    assert signature_text("layer_norm") in text
    assert "def kernel_function(input, normalized_shape, weight=None, bias=None, eps=1e-05):" in text
    assert "biased variance" in text
    # every tensor's dtype, shape and stride
    for _, sample, _ in _layer_norm_samples():
        for value in list(sample.args) + list(sample.kwargs.values()):
            if isinstance(value, torch.Tensor):
                assert f"tensor {str(value.dtype).removeprefix('torch.')}, shape {tuple(value.shape)}, " \
                       f"stride {tuple(value.stride())}" in text
    assert "NON-CONTIGUOUS" in text and "storage offset 7" in text
    # non-tensor values, positional and keyword
    assert "`eps` (keyword): 1e-06 (float)" in text
    assert "`eps` (positional 4): 1e-05 (float)" in text
    assert "`normalized_shape` (positional 1): (64,) (tuple)" in text
    # counts, shares, outputs
    assert "called 120 time(s), 50.0% of this function's time" in text
    assert "called 7 time(s), 20.0%" in text
    assert "returns: tensor bfloat16, shape (4, 3, 64)" in text
    # device and rules
    assert "CPU (Triton interpreter)" in text
    for rule in ("@triton.jit", "torch.empty", 'input_precision="ieee"', "allow_tf32=False", "torch.ops",
                 "streams", "ONE ```python"):
        assert rule in text, rule
    # the example, verbatim
    assert (EXAMPLES_DIR / "triton_example.py").read_text().rstrip() in text


def test_generate_warns_about_host_overhead_for_decode_sizes(renderer):
    decode = Sample((TensorSpec((2, 4096), torch.bfloat16), [4096], TensorSpec((4096,), torch.bfloat16)), {})
    prefill = Sample((TensorSpec((8192, 4096), torch.bfloat16), [4096], TensorSpec((4096,), torch.bfloat16)), {})
    small = renderer.generate(KernelTask("rms_norm", [decode, prefill], "NVIDIA H200", (9, 0), language="triton"))
    assert "Signature(s) 1 are tiny" in small
    assert "tiny: launch-bound" in small
    assert "compute capability 9.0 (sm_90)" in small
    large = renderer.generate(KernelTask("rms_norm", [prefill], "NVIDIA H200", (9, 0), language="triton"))
    assert "are tiny" not in large
    for text in (small, large):
        assert "Host-side overhead" in text and ".contiguous()" in text


def test_system_prompt_states_role_and_hard_rules(task, renderer):
    text = renderer.system(task)
    assert "Triton" in text and "@triton.jit" in text
    assert "TF32" in text and "torch.nn.functional" in text and "ONE ```python" in text
    assert "modules" in renderer.system(_module_task())


# ---------------------------------------------------------------------------------------------------------
# fix
# ---------------------------------------------------------------------------------------------------------
PREVIOUS = """import torch
import triton


def kernel_function(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    return torch.nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)
"""


def test_fix_prompt_carries_compile_log_mismatches_and_violations(task, renderer):
    expected = torch.randn(4, 6)
    actual = expected.clone()
    actual[2, 3] += 0.5
    actual[0, 1] = float("nan")
    rows = worst_mismatches(expected, actual, limit=5, sample=2)
    failure = {
        "status": "forbidden",
        "message": "screening refused the file",
        "details": {
            "compile_log": "triton.compiler.errors.CompilationError: at 12:8:\n    x = tl.load(ptr + offs)\n"
                           "ValueError: Cannot make_shape_compatible",
            "errors": ["Tensor-likes are not close!\nMismatched elements: 2 / 24 (8.3%)\nAffected tensor: output"],
            "mismatches": rows,
            "violations": [SimpleNamespace(construct="torch.nn.functional.layer_norm", line=6,
                                           message="is a PyTorch functional op")],
        },
    }
    text = renderer.fix(task, PREVIOUS, failure)
    assert "Status: forbidden" in text and "forbidden constructs" in text
    assert "screening refused the file" in text
    assert "CompilationError: at 12:8" in text and "Cannot make_shape_compatible" in text
    assert "Mismatched elements: 2 / 24" in text
    assert "| sample | index | expected | actual | abs_diff | rel_diff |" in text
    assert f"| 2 | (2, 3) | {expected[2, 3].item():.6g} | {actual[2, 3].item():.6g} |" in text
    assert "| 2 | (0, 1) |" in text and "| nan |" in text
    assert "line 6: `torch.nn.functional.layer_norm` — is a PyTorch functional op" in text
    assert "`return torch.nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)`" in text
    assert PREVIOUS.rstrip() in text
    # the task is restated
    assert "`eps` (positional 4): 1e-05 (float)" in text and "complete corrected" in text


@pytest.mark.parametrize(
    ("failure", "expected_kind", "needle"),
    [
        ({"status": "timeout", "details": {"timeout_s": 30}}, "timeout", "did not finish within 30 s"),
        ({"status": "crash", "details": {"signal": -11}}, "crash", "signal 11 (SIGSEGV)"),
        ({"status": "no_code", "details": {"reply": "Sure! Use torch."}}, "no_code", "Sure! Use torch."),
        ({"status": "truncated"}, "truncated", "shorter complete file"),
        ({"status": "runtime_error", "details": {"exception": "IndexError: out of range",
                                                 "traceback": "\n".join(f"frame {i}" for i in range(100))}},
         "runtime", "frame 99"),
        (SimpleNamespace(status=Outcome.MISMATCH, message="", details=SimpleNamespace(errors=["values differ"])),
         "mismatch", "values differ"),
    ],
)
def test_fix_prompt_for_each_failure_kind(task, renderer, failure, expected_kind, needle):
    assert Failure.of(failure).kind == expected_kind
    text = renderer.fix(task, None if expected_kind in ("no_code", "truncated") else PREVIOUS, failure)
    assert needle in text
    assert "frame 0\n" not in text  # tracebacks are cut to their tail


def test_fix_prompt_reads_sandbox_style_results(task, renderer):
    runtime = {
        "status": "runtime_error",
        "message": "IndexError during validation: index 9 is out of bounds",
        "details": {"phase": "validation", "exception": {
            "type": "builtins.IndexError", "message": "index 9 is out of bounds",
            "traceback": "Traceback (most recent call last):\n  File \"kernel.py\", line 12\nIndexError: index 9"}},
    }
    text = renderer.fix(task, PREVIOUS, runtime)
    assert "IndexError: index 9 is out of bounds" in text and 'File "kernel.py", line 12' in text
    crash = SimpleNamespace(status="crash", message="child killed by SIGSEGV", stderr="full stderr",
                            details={"signal": "SIGSEGV", "signal_number": 11, "stderr_tail": "Segmentation fault"})
    view = Failure.of(crash)
    assert view.kind == "crash" and view.signal == 11
    text = renderer.fix(task, PREVIOUS, crash)
    assert "killed by signal 11 (SIGSEGV)" in text and "Segmentation fault" in text
    syntax = {"status": "compile_error", "details": {"compile_log": "invalid syntax", "violations": [
        {"construct": "syntax", "line": 3, "message": "invalid syntax", "kind": "syntax"}]}}
    text = renderer.fix(task, PREVIOUS, syntax)
    assert "Problems found by screening" in text and "Forbidden constructs" not in text


def test_failure_view_takes_exception_objects_and_reads_the_kind_from_the_outcome_only():
    try:
        raise ZeroDivisionError("division by zero in grid")
    except ZeroDivisionError as exc:
        caught = exc
    view = Failure.of({"status": Outcome.RUNTIME_ERROR, "details": {"exception": caught, "unknown_key": 1}})
    assert view.kind == "runtime"
    assert view.exception == "ZeroDivisionError: division by zero in grid"
    assert "raise ZeroDivisionError" in view.traceback
    assert Failure.of("compile_error").kind == "compile"
    assert {Failure.of({"status": outcome}).kind for outcome in Outcome} >= {"compile", "runtime", "mismatch",
                                                                             "timeout", "crash", "forbidden",
                                                                             "harness"}
    # Nothing is inferred from words: a status outside the vocabulary, or details that look like a crash, stay
    # "other" (the old keyword classifier read "killed" in a status as a crash and "load" as a compile error).
    assert Failure.of(SimpleNamespace(status="weird")).kind == "other"
    assert Failure.of({"status": "killed while loading", "details": {"signal": 9}}).kind == "other"


def test_worst_mismatches_orders_by_error_and_skips_matches():
    expected = torch.tensor([[1.0, 2.0], [3.0, float("inf")]])
    actual = torch.tensor([[1.0, 2.5], [1.0, float("inf")]])
    rows = worst_mismatches(expected, actual)
    assert [r["index"] for r in rows] == [(1, 0), (0, 1)]
    assert rows[0]["abs_diff"] == pytest.approx(2.0) and rows[0]["rel_diff"] == pytest.approx(2 / 3)
    assert worst_mismatches(expected, expected.clone()) == []
    with pytest.raises(ValueError, match="different shapes"):
        worst_mismatches(expected, actual.t().reshape(4))


# ---------------------------------------------------------------------------------------------------------
# optimize
# ---------------------------------------------------------------------------------------------------------
def test_optimize_prompt_carries_latency_baseline_roofline_and_launch_numbers(renderer):
    sample = Sample((TensorSpec((2, 4096), torch.bfloat16), [4096], TensorSpec((4096,), torch.bfloat16)), {})
    task = KernelTask("rms_norm", [sample], "NVIDIA H200", (9, 0), language="triton")
    roofline = estimate("rms_norm", task.sample_list, task.device_name)
    perf = Performance(latency_ms=0.0421, baseline_ms=0.0118, launch_overhead_us=5.2, roofline=roofline)
    code = "def kernel_function(input, normalized_shape, weight=None, eps=None):\n    pass\n"
    text = renderer.optimize(task, code, perf)
    assert "| your kernel | 42.1 us |" in text
    assert "| PyTorch eager | 11.8 us | speedup 0.28x" in text
    assert format_time_ms(roofline.floor_ms) in text
    assert "5.2 us per call" in text and f"{0.0421e3 / 5.2:.1f}x the launch cost" in text
    assert "below the launch cost" in text and "wrapper" in text
    assert "slower than PyTorch eager (0.28x)" in text
    assert code.rstrip() in text


def test_performance_interpretation_memory_bound_and_launch_bound():
    big = Sample((TensorSpec((8192, 8192), torch.bfloat16),), {})
    roofline = estimate("silu", [big], "NVIDIA H200")
    memory_bound = Performance(latency_ms=roofline.floor_ms / 0.35, baseline_ms=roofline.floor_ms / 0.2,
                               launch_overhead_us=5.0, roofline=roofline)
    notes = memory_bound.interpretation(calls=1)
    assert any("at 35% of the bandwidth floor: memory-bound" in n for n in notes)
    assert any("faster than PyTorch" in n for n in notes)
    launch_bound = Performance(latency_ms=0.0045, launch_overhead_us=5.0)
    notes = launch_bound.interpretation(calls=1)
    assert notes[0].startswith("latency is 0.9x the cost of launching an empty kernel")
    assert "host-side Python overhead" in notes[0]


def test_compute_bound_advice_is_in_the_task_language(renderer):
    """The optimize prompt's compute-bound advice names the language's tools: `tl.dot` for Triton, tensor cores
    through `<mma.h>` for CUDA C++ (issue 12: a CUDA conversation was told to tune num_warps)."""
    a, b = TensorSpec((4096, 4096), torch.bfloat16), TensorSpec((4096, 4096), torch.bfloat16)
    roofline = estimate("linear", [Sample((a, b), {})], "NVIDIA H200")
    assert roofline.bound == "compute"
    perf = Performance(latency_ms=roofline.floor_ms / 0.3, baseline_ms=roofline.floor_ms / 0.5, roofline=roofline)
    triton, cuda = perf.interpretation(calls=1, language="triton"), perf.interpretation(calls=1, language="cuda")
    assert any("compute-bound — use tl.dot" in n for n in triton) and not any("tl.dot" in n for n in cuda)
    neutral = perf.interpretation(calls=1)  # no language: advice that names no language's tools
    assert any("compute-bound — use the GPU's matrix units" in n for n in neutral)
    assert not any("tl.dot" in n or "mma.h" in n for n in neutral)
    assert any("compute-bound — use tensor cores" in n and "mma.h" in n for n in cuda)
    task = KernelTask("linear", [Sample((a, b), {})], "NVIDIA H200", (9, 0), language="cuda")
    text = renderer.optimize(task, "def kernel_function(input, weight, bias=None):\n    pass\n", perf)
    assert "use tensor cores" in text and "num_warps" not in text


def test_performance_reads_benchmark_results():
    record = SimpleNamespace(latency_ms={"median_ms": 0.05, "q25_ms": 0.04}, baseline_ms=SimpleNamespace(median_ms=0.1),
                             launch_overhead_us=4.0)
    perf = Performance.of(record)
    assert (perf.latency_ms, perf.baseline_ms, perf.launch_overhead_us) == (0.05, 0.1, 4.0)
    assert perf.speedup == pytest.approx(2.0)
    with pytest.raises(ValueError, match="median_ms"):
        Performance.of({"latency_ms": {"mean": 1.0}})


def test_performance_rejects_bad_numbers():
    with pytest.raises(ValueError, match="latency_ms"):
        Performance.of({"baseline_ms": 1.0})
    with pytest.raises(ValueError, match="positive"):
        Performance(latency_ms=-1.0)
    with pytest.raises(TypeError, match="RooflineEstimate"):
        Performance(latency_ms=1.0, roofline={"floor_ms": 1.0})


# ---------------------------------------------------------------------------------------------------------
# module problems
# ---------------------------------------------------------------------------------------------------------
def test_module_prompts_carry_source_inputs_and_example(renderer):
    task = _module_task()
    text = renderer.generate_module(task)
    assert task.source.strip() in text
    assert "forward argument 0: tensor bfloat16, shape (16, 256), stride (256, 1), contiguous" in text
    assert "constructor argument 0: 256 (int)" in text and "constructor argument 1: 0.1 (float)" in text
    assert "casts the model and every floating input to bfloat16" in text
    assert (EXAMPLES_DIR / "module_example.py").read_text().rstrip() in text
    assert "class ModelNew" in text and "same order" in text
    fix = renderer.fix_module(task, "class ModelNew: pass\n", {"status": "compile_error",
                                                                "details": {"compile_log": "SyntaxError: bad"}})
    assert "SyntaxError: bad" in fix and "class ModelNew: pass" in fix and task.source.strip() in fix


def test_optimize_module_prompt_shows_the_measured_forward_against_model(renderer, task):
    module = _module_task()
    code = "class ModelNew: pass\n"
    text = renderer.optimize_module(module, code, {"latency_ms": {"median_ms": 0.5, "mode": "device"},
                                                   "baseline_ms": {"median_ms": 0.8, "mode": "device"}})
    assert text.startswith("# Make your `ModelNew` for the module problem `scaled_leaky_relu` faster")
    assert "clock: device time (CUDA-graph replay)" in text
    assert "| your ModelNew | 500 us | |" in text
    assert "| PyTorch eager (`Model`) | 800 us | speedup 1.60x" in text and "1.60x faster than PyTorch eager" in text
    assert code.rstrip() in text and module.source.strip() in text
    assert "casts the model and every floating input to bfloat16" in text
    slower = renderer.optimize_module(module, code, Performance(latency_ms=1.6, baseline_ms=0.8))
    assert "slower than PyTorch eager (0.50x)" in slower and "empty kernel launch" not in slower
    with pytest.raises(TypeError, match="ModuleTask"):
        renderer.optimize_module(task, code, Performance(latency_ms=1.0))
    with pytest.raises(ValueError, match="latency_ms"):
        renderer.optimize_module(module, code, {"baseline_ms": 1.0})


def test_override_of_the_performance_block_applies_to_both_optimize_prompts(tmp_path, task):
    (tmp_path / "_performance.j2").write_text("HOUSE TABLE: {{ subject }} took {{ performance.latency }}\n")
    custom = PromptRenderer(tmp_path)
    assert "HOUSE TABLE: your kernel took 1 ms" in custom.optimize(task, PREVIOUS, Performance(latency_ms=1.0))
    assert "HOUSE TABLE: your ModelNew took 1 ms" in custom.optimize_module(_module_task(), "class ModelNew: pass\n",
                                                                           Performance(latency_ms=1.0))


def test_module_task_from_source_errors_are_clear():
    with pytest.raises(ValueError, match="class Model"):
        ModuleTask.from_source("x = 1\n", language="triton")
    with pytest.raises(ValueError, match="get_inputs"):
        ModuleTask.from_source("class Model:\n    pass\n", language="triton")


# ---------------------------------------------------------------------------------------------------------
# overrides, strictness, hashing
# ---------------------------------------------------------------------------------------------------------
def test_every_builtin_template_exists():
    for name in BUILTIN_TEMPLATES:
        assert (PROMPTS_DIR / name).is_file(), name


def test_override_replaces_one_template_only(tmp_path, task):
    (tmp_path / "system.j2").write_text("CUSTOM SYSTEM for {{ task.function }}\n")
    custom = PromptRenderer(tmp_path)
    assert custom.system(task) == "CUSTOM SYSTEM for layer_norm\n"
    assert custom.generate(task) == PromptRenderer().generate(task)


def test_override_of_a_partial_applies_to_every_prompt(tmp_path, task):
    (tmp_path / "_rules.j2").write_text("HOUSE RULES\n")
    custom = PromptRenderer(tmp_path)
    assert "HOUSE RULES" in custom.generate(task)
    assert "HOUSE RULES" in custom.fix(task, PREVIOUS, {"status": "timeout"})


def test_broken_override_gives_an_error_naming_the_template(tmp_path, task):
    (tmp_path / "generate.j2").write_text("line one\n{{ task.no_such_field }}\n")
    with pytest.raises(PromptTemplateError, match=r"generate\.j2:2.*no_such_field"):
        PromptRenderer(tmp_path).generate(task)
    (tmp_path / "generate.j2").unlink()
    (tmp_path / "_signatures.j2").write_text("{{ signatures_typo }}")
    with pytest.raises(PromptTemplateError, match=r"_signatures\.j2"):
        PromptRenderer(tmp_path).generate(task)
    (tmp_path / "_signatures.j2").write_text("{% for s in signatures %}")
    with pytest.raises(PromptTemplateError, match=r"_signatures\.j2.*syntax error"):
        PromptRenderer(tmp_path).generate(task)


def test_missing_override_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        PromptRenderer(tmp_path / "nope")


def test_template_hash_is_stable_and_tracks_overrides(tmp_path):
    builtin = PromptRenderer().template_hash("triton")
    assert builtin == PromptRenderer().template_hash("triton")
    assert len(builtin) == 64
    assert PromptRenderer(tmp_path).template_hash("triton") == builtin  # empty override folder: same templates
    (tmp_path / "fix.j2").write_text("v1 {{ task.function }}")
    first = PromptRenderer(tmp_path).template_hash("triton")
    (tmp_path / "fix.j2").write_text("v2 {{ task.function }}")
    second = PromptRenderer(tmp_path).template_hash("triton")
    assert len({builtin, first, second}) == 3
    (tmp_path / "triton_example.py").write_text("def kernel_function(x):\n    return x\n")
    assert PromptRenderer(tmp_path).template_hash("triton") != second


def test_example_override_is_used_in_the_prompt(tmp_path, task):
    (tmp_path / "triton_example.py").write_text("# MY EXAMPLE\n")
    assert "# MY EXAMPLE" in PromptRenderer(tmp_path).generate(task)


# ---------------------------------------------------------------------------------------------------------
# semantics
# ---------------------------------------------------------------------------------------------------------
def test_builtin_signatures_match_their_docstrings():
    expected = {
        "linear": ["input", "weight", "bias"],
        "scaled_dot_product_attention": ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                                         "enable_gqa"],
        "conv2d": ["input", "weight", "bias", "stride", "padding", "dilation", "groups"],
        "gelu": ["input", "approximate"],
    }
    for name, params in expected.items():
        assert parameter_names(name) == params
        doc_first_line = inspect.getdoc(original_function(name)).splitlines()[0]
        for param in params[:3]:
            assert param in doc_first_line
    assert signature_text("linear") == "linear(input, weight, bias=None) -> Tensor"
    assert entry_signature("gelu") == "kernel_function(input, approximate='none')"


@pytest.mark.parametrize(
    ("name", "sample"),
    [
        ("linear", Sample((torch.randn(2, 3), torch.randn(4, 3)), {"bias": None})),
        ("layer_norm", Sample((torch.randn(2, 3), [3]), {"eps": 1e-6})),
        ("softmax", Sample((torch.randn(2, 3),), {"dim": -1})),
        ("scaled_dot_product_attention",
         Sample((torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)), {"is_causal": True})),
        ("conv2d", Sample((torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), None, 1, 1), {})),
    ],
)
def test_entry_signature_is_valid_python_that_binds_real_calls(name, sample):
    namespace: dict = {}
    exec(f"def {entry_signature(name)}:\n    return None\n", namespace)  # noqa: S102
    bound = inspect.signature(namespace["kernel_function"]).bind(*sample.args, **sample.kwargs)
    assert bound.arguments
    original_function(name)(*sample.args, **sample.kwargs)  # the same call is valid for PyTorch


def test_semantics_for_common_ops_state_their_numerics():
    sdpa = semantics_summary("scaled_dot_product_attention")
    for needle in ("top-left", "enable_gqa", "1/sqrt(E)", "bool", "float mask"):
        assert needle in sdpa
    assert "biased" in semantics_summary("layer_norm") and "inside the sqrt" in semantics_summary("layer_norm")
    assert "tanh" in semantics_summary("gelu") and "erf" in semantics_summary("gelu")
    assert "-100" in semantics_summary("cross_entropy") and "label_smoothing" in semantics_summary("cross_entropy")
    assert "identity" in semantics_summary("dropout")
    assert "dtype" in semantics_summary("softmax")
    assert "in-place" in semantics_summary("relu_")


def test_semantics_claims_hold_numerically():
    x = (torch.randn(4, 64) * 0.01).to(torch.bfloat16)
    xf = x.float()
    manual = (xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps)).to(torch.bfloat16)
    torch.testing.assert_close(F.rms_norm(x, [64]), manual)  # eps=None is fp32's eps, as the summary says
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(4)
    mask = torch.ones(2, 3, dtype=torch.bool).tril()  # top-left aligned: query i sees keys j <= i
    manual = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True), manual)


def test_every_functional_name_has_a_signature_and_a_summary():
    for name in functional_names():
        assert signature_text(name).startswith(name)
        assert entry_signature(name).startswith("kernel_function(")
        assert semantics_summary(name).strip()


def test_signature_text_has_no_version_dependent_annotations() -> None:
    """Prompts must be byte-identical across torch releases (cassettes and the kernel cache key on them)."""
    from agent.semantics import signature_text

    for name in ("softmax", "rms_norm", "layer_norm", "silu", "gelu", "cross_entropy"):
        text = signature_text(name)
        assert ": " not in text, text  # no annotations (hand-written builtin signatures are fixed text)


def test_optimize_prompt_compares_like_with_like(renderer):
    """Device time goes against the device roofline, host time against the host launch cost; under device timing
    there is no launch row at all (the issue: a kernel at 53% of the roofline was told host overhead dominates)."""
    big = Sample((TensorSpec((2048, 4096), torch.bfloat16),), {})
    task = KernelTask("silu", [big], "NVIDIA H200", (9, 0), language="triton")
    roofline = estimate("silu", task.sample_list, task.device_name)
    code = "def kernel_function(input, inplace=False):\n    pass\n"
    # Eager clock: host-inclusive 40 us, of which the device time is the roofline floor / 0.53.
    eager = Performance(latency_ms=0.040, baseline_ms=0.045, launch_overhead_us=21.0, roofline=roofline,
                        device_latency_ms=roofline.floor_ms / 0.53, timing="eager")
    text = renderer.optimize(task, code, eager)
    assert "clock: host-inclusive" in text
    assert f"| your kernel, device time only | {format_time_ms(roofline.floor_ms / 0.53)} |" in text
    assert "runs at 53% of the floor" in text  # the roofline fraction uses device time, not host time
    assert "21 us per call" in text  # host latency vs host launch cost
    # Device clock: same kernel under CUDA graphs; the launch cost is not compared with device time.
    device = Performance(latency_ms=roofline.floor_ms / 0.53, baseline_ms=roofline.floor_ms / 0.4,
                         launch_overhead_us=21.0, roofline=roofline, timing="device")
    text = renderer.optimize(task, code, device)
    assert "clock: device time (CUDA-graph replay)" in text
    assert "empty kernel launch" not in text and "host-side Python overhead" not in text
    assert "runs at 53% of the floor" in text
    with pytest.raises(ValueError, match="timing must be 'eager' or 'device'"):
        Performance(latency_ms=1.0, timing="wall")


def test_fix_prompt_builds_the_mismatch_table_from_the_oracles_issues(task, renderer):
    import torch as _torch

    from forge.checking import validate as _validate
    from forge.samples import Sample as _Sample

    x = _torch.randn(4, 8, generator=_torch.Generator().manual_seed(3))
    issues = _validate(_torch.relu, lambda t: _torch.relu(t) + 0.25, [_Sample((x,), {})], fresh_inputs_per_sample=0)
    failure = {"status": "mismatch", "message": "wrong", "details": {"issues": [i.to_dict() for i in issues]}}
    text = renderer.fix(task, PREVIOUS, failure)
    assert "| sample | input | output | index | expected | actual | abs_diff | allowed |" in text
    worst = issues[0].rows[0]
    assert f"| 0 | captured | output | {worst.index} | {worst.expected:.6g} | {worst.got:.6g} | 0.25 |" in text


def test_a_harness_error_is_its_own_kind_and_not_the_kernels_fault():
    view = Failure.of({"status": "harness_error", "message": "harness error: the reference ran out of memory"})
    assert view.kind == "harness" and not view.blames_candidate and "not a fault of your kernel" in view.headline
    assert Failure.of({"status": "crash"}).blames_candidate


def test_each_language_brings_its_own_prompt_fragments(tmp_path):
    """The built-in templates include the language's rules, system rules, speed notes and example; Triton's and
    CUDA's prompts differ exactly there, and an override folder can replace one language's fragment."""
    s = Sample((torch.randn(4, 8),), {})
    triton, cuda = (KernelTask.from_samples("silu", [s], language=name) for name in ("triton", "cuda"))
    renderer = PromptRenderer()
    assert "`@triton.jit`" in renderer.system(triton) and "CUDA_SRC" not in renderer.generate(triton)
    system, generate = renderer.system(cuda), renderer.generate(cuda)
    assert system.startswith("You write CUDA C++ kernels") is False and "You write CUDA C++ kernels" in system
    assert "@triton.jit" not in system + generate and "kernels = load_cuda(CUDA_SRC)" in generate
    assert renderer.template_hash("cuda") != renderer.template_hash("triton")
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "rules.j2").write_text("1. **Only rule.** Write CUDA.\n")
    overridden = PromptRenderer(tmp_path)
    assert "1. **Only rule.** Write CUDA." in overridden.generate(cuda)
    assert "1. **Only rule.**" not in overridden.generate(triton)
    assert overridden.template_hash("cuda") != renderer.template_hash("cuda")
