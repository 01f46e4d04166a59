"""Static screening of candidate kernels: every banned construct class and aliasing trick is refused with its name and
line; clean Triton files pass; the structural requirements (entry point, jit kernel) hold. Whether the kernels are
launched is no longer judged statically (by name) but at run time (tests/agent/test_launch_check.py)."""

from __future__ import annotations

import functools
import re
import textwrap

import pytest

from agent.languages import KernelLanguage, TritonLanguage, get_language, language_names, register_language
from agent.screening import Violation, format_violations, has_syntax_error, screen_source

CLEAN = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


    def kernel_function(input, inplace=False):
        x = input.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        # INSERT
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        _relu_kernel[grid](x, y, n, BLOCK=128)
        return y.view(input.shape)
    """
)


def with_body(snippet: str, header: str = "") -> str:
    """The clean kernel with `snippet` inside kernel_function and `header` after the imports."""
    body = textwrap.indent(textwrap.dedent(snippet).strip("\n"), "    ")
    source = CLEAN.replace("    # INSERT", body)
    return source.replace("import triton.language as tl\n", "import triton.language as tl\n" + header + "\n", 1)


def constructs(source: str, function_name: str = "relu") -> list[str]:
    return [v.construct for v in screen_source(source, function_name, "triton")]


def assert_refused(source: str, construct: str, function_name: str = "relu", line: int | None = None) -> Violation:
    violations = screen_source(source, function_name, "triton")
    matching = [v for v in violations if v.construct == construct]
    assert matching, f"expected a violation for {construct!r}, got {format_violations(violations) or 'none'}"
    found = matching[0]
    assert found.kind == "forbidden"
    assert found.line > 0
    if line is not None:
        assert found.line == line
    bare = construct.lstrip(".").removesuffix("()")
    assert bare in found.message, f"message does not name {bare!r}: {found.message}"
    return found


def line_of(source: str, needle: str) -> int:
    for number, text in enumerate(source.splitlines(), start=1):
        if needle in text:
            return number
    raise AssertionError(f"{needle!r} not in source")


# ---------------------------------------------------------------------------------------------------------
# Clean sources pass
# ---------------------------------------------------------------------------------------------------------
def test_clean_triton_kernel_passes() -> None:
    assert screen_source(CLEAN, "relu", "triton") == []


def test_clean_softmax_with_autotune_helper_and_metadata_passes() -> None:
    source = textwrap.dedent(
        """
        import math
        import functools
        import torch
        import torch.nn.functional as F  # imported but unused: every use would be refused
        import triton
        import triton.language as tl
        from triton.runtime import driver


        @triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1)], key=["n_cols"])
        @triton.heuristics({"EVEN": lambda args: args["n_cols"] % 2 == 0})
        @triton.jit
        def _softmax_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            row = tl.program_id(0)
            offs = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * stride + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
            x = x - x.max(axis=0)
            num = tl.exp(x)
            acc = num @ tl.trans(num[None, :])
            tl.store(y_ptr + row * stride + offs, num / num.sum(axis=0), mask=offs < n_cols)


        def _launch(x, y):
            rows, cols = x.shape
            _softmax_kernel[(rows,)](x, y, x.stride(0), cols)


        @functools.lru_cache(maxsize=None)
        def _block(n: int) -> int:
            return triton.next_power_of_2(max(n, 16))


        def kernel_function(input, dim=-1, _stacklevel=3, dtype=None):
            x = input.contiguous().view(-1, input.shape[-1])
            y = torch.empty_like(x, dtype=torch.float32)
            lowest = torch.finfo(x.dtype).min
            info = torch.iinfo(torch.int32)
            assert info.max > 0 and lowest < 0 and math.isfinite(1.0)
            if x.is_cuda:
                sms = torch.cuda.get_device_properties(x.device).multi_processor_count
                props = driver.active.utils.get_device_properties(x.device.index)
                del sms, props
            with torch.no_grad():
                _launch(x, y)
            return y.to(input.dtype).view(input.shape)
        """
    )
    assert screen_source(source, "softmax", "triton") == []


def test_jit_wrapped_by_call_and_launched_through_a_variable_passes() -> None:
    source = CLEAN.replace("@triton.jit\n", "").replace(
        "def kernel_function", "relu_k = triton.jit(_relu_kernel)\n\n\ndef kernel_function"
    ).replace("_relu_kernel[grid]", "k = relu_k\n    k[grid]")
    assert screen_source(source, "relu", "triton") == []


def test_parameters_may_shadow_builtins_that_are_banned_elsewhere() -> None:
    source = with_body("input = input.contiguous()\ncompile = 1\nopen = compile + 1")
    assert screen_source(source, "relu", "triton") == []


# ---------------------------------------------------------------------------------------------------------
# PyTorch fallbacks and aliasing tricks
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "snippet", "construct", "function_name"),
    [
        ("import torch.nn.functional as F", "y = F.relu(x)", "torch.nn.functional.relu", "relu"),
        ("", "y = torch.nn.functional.relu(x)", "torch.nn.functional.relu", "relu"),
        ("import torch.nn.functional as F", "y = F.gelu(x)", "torch.nn.functional.gelu", "relu"),
        ("", "y = torch.relu(x)", "torch.relu", "relu"),
        ("", "y = x.relu()", ".relu", "relu"),
        ("", "y = x.clamp_min(0)", ".clamp_min", "relu"),
        ("", "y = torch.Tensor.relu(x)", "torch.Tensor.relu", "relu"),
        ("import torch.nn.functional as G", "y = G.softmax(x, -1)", "torch.nn.functional.softmax", "softmax"),
        ("from torch.nn.functional import softmax as s", "y = s(x, -1)", "torch.nn.functional.softmax", "softmax"),
        ("from torch.nn import functional as Fn", "y = Fn.softmax(x, -1)", "torch.nn.functional.softmax", "softmax"),
        ("from torch import softmax", "y = softmax(x, -1)", "torch.softmax", "softmax"),
        ("", "t = torch\ny = t.softmax(x, -1)", "torch.softmax", "softmax"),
        ("", "t = torch\nu = t\ny = u.nn.functional.softmax(x, -1)", "torch.nn.functional.softmax", "softmax"),
        ("", "y = getattr(torch, 'softmax')(x, -1)", "torch.softmax", "softmax"),
        ("", "y = getattr(x, 'softmax')(-1)", ".softmax", "softmax"),
        ("", "f = x.softmax\ny = f(-1)", ".softmax", "softmax"),
        ("", "y = x.softmax(-1)", ".softmax", "softmax"),
        ("", "y = x.layer_norm((4,))", ".layer_norm", "layer_norm"),
        ("", "y = torch.layer_norm(x, (4,))", "torch.layer_norm", "layer_norm"),
        ("", "y = torch.matmul(x, x)", "torch.matmul", "linear"),
        ("", "y = torch.mm(x, x)", "torch.mm", "linear"),
        ("", "y = torch.bmm(x, x)", "torch.bmm", "linear"),
        ("", "y = torch.addmm(x, x, x)", "torch.addmm", "linear"),
        ("", "y = torch.einsum('ij,jk->ik', x, x)", "torch.einsum", "linear"),
        ("", "y = torch.conv2d(x, x)", "torch.conv2d", "conv2d"),
        ("", "y = x.matmul(x)", ".matmul", "linear"),
        ("", "y = x @ x", "@", "linear"),
        ("", "y = torch.ops.aten.relu(x)", "torch.ops.aten.relu", "relu"),
        ("", "y = torch.nn.ReLU()(x)", "torch.nn.ReLU", "relu"),
        ("", "y = torch.compile(kernel_function)", "torch.compile", "relu"),
        ("", "y = torch.jit.script(kernel_function)", "torch.jit.script", "relu"),
        ("", "y = torch.where(x > 0, x, 0.0)", "torch.where", "relu"),
    ],
)
def test_pytorch_fallbacks_and_aliases_are_refused(header: str, snippet: str, construct: str,
                                                   function_name: str) -> None:
    source = with_body(snippet, header)
    assert_refused(source, construct, function_name)
    flagged_lines = {v.line for v in screen_source(source, function_name, "triton") if v.construct == construct}
    written_lines = {line_of(source, text) for text in [*snippet.splitlines(), *header.splitlines()]}
    assert flagged_lines and flagged_lines <= written_lines


def test_reference_op_is_named_as_such() -> None:
    found = assert_refused(with_body("y = torch.relu(x)"), "torch.relu", "relu")
    assert "reference op" in found.message


def test_getattr_with_a_computed_name_is_refused() -> None:
    assert_refused(with_body("name = 'soft' + 'max'\ny = getattr(torch, name)(x, -1)"), "getattr", "softmax")
    assert_refused(with_body("y = getattr(x, 'soft' + 'max')(-1)"), "getattr", "softmax")
    assert_refused(with_body("g = getattr\ny = g(torch, 'relu')(x)"), "getattr", "relu")


@pytest.mark.parametrize(
    ("header", "snippet", "construct"),
    [
        ("import torch as T", "y = T.nn.functional.relu(x)", "torch.nn.functional.relu"),
        ("from torch import nn", "y = nn.functional.relu(x)", "torch.nn.functional.relu"),
        ("from torch import nn as N", "y = N.ReLU()(x)", "torch.nn.ReLU"),
        ("", "y = torch.Tensor.__dict__['relu'](x)", ".__dict__"),
        ("", "y = type(x).relu(x)", ".relu"),
        ("", "y = [torch][0].ops.aten.relu(x)", "torch"),
        ("", "y = (lambda m: m.ops.aten.gelu)(torch)(x)", "torch"),
        ("class Holder:\n    m = torch\n", "y = Holder.m.ops.aten.gelu(x)", "torch"),
        ("", "m = torch if x is not None else None", "torch"),
        ("", "(m := torch)\ny = m.relu(x)", "torch.relu"),
        ("import typing", "mods = typing.sys.modules", "typing.sys.modules"),
        ("import typing", "hints = typing.get_type_hints(kernel_function)", "typing.get_type_hints"),
        ("import dataclasses", "ins = dataclasses.inspect", "dataclasses.inspect"),
        ("", "b = tl.core.builtins", "triton.language.core.builtins"),
        ("from typing import sys as s", "mods = s.modules", "typing.sys"),
        ("import torch._dynamo", "pass", "torch._dynamo"),
        ("", "mods = torch.sys.modules", "torch.sys.modules"),
        ("", "y = x.__matmul__(x)", ".__matmul__"),
        ("", "y = x.apply_(abs)", ".apply_"),
        ("", "fn = torch.autograd.Function", "torch.autograd.Function"),
        ("", "try:\n    pass\nexcept Exception as e:\n    fr = e.__traceback__", ".__traceback__"),
        ("import functools", "y = functools.reduce(getattr, ['nn', 'functional', 'relu'], torch)", "getattr"),
        ("", "dt = torch.float32\nz = dt.relu(x)", ".relu"),
    ],
)
def test_aliasing_and_reflection_bypasses_are_refused(header: str, snippet: str, construct: str) -> None:
    assert_refused(with_body(snippet, header), construct)


def test_attributes_of_allowed_values_are_judged_as_values() -> None:
    source = with_body("dt = torch.float32\nsize = dt.itemsize\nsigned = torch.float32.is_signed")
    assert screen_source(source, "relu", "triton") == []


def test_modules_passed_as_values_are_refused() -> None:
    source = with_body("y = helper(torch)", header="def helper(m):\n    return m.ops.aten.relu\n")
    assert_refused(source, "torch")


# ---------------------------------------------------------------------------------------------------------
# Escapes: processes, network, FFI, threads, introspection, dynamic code, files, streams, subclasses, patching
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "snippet", "construct"),
    [
        ("import subprocess", "subprocess.run(['ls'])", "import subprocess"),
        ("import subprocess", "subprocess.run(['ls'])", "subprocess.run"),
        ("import os", "os.system('ls')", "os.system"),
        ("import os", "os.popen('ls')", "os.popen"),
        ("import os", "os.execv('/bin/ls', ['ls'])", "os.execv"),
        ("import os", "os.fork()", "os.fork"),
        ("import os", "os.kill(0, 9)", "os.kill"),
        ("import os", "os.remove('f')", "os.remove"),
        ("import os", "k = os.environ.get('OPENAI_API_KEY')", "os.environ.get"),
        ("from os import system", "system('ls')", "from os import"),
        ("import socket", "socket.socket()", "import socket"),
        ("import urllib.request", "urllib.request.urlopen('http://x')", "import urllib.request"),
        ("import http.client", "pass", "import http.client"),
        ("import requests", "requests.get('http://x')", "import requests"),
        ("import ctypes", "ctypes.CDLL(None)", "import ctypes"),
        ("import cffi", "pass", "import cffi"),
        ("import threading", "threading.Thread(target=print).start()", "import threading"),
        ("import multiprocessing", "pass", "import multiprocessing"),
        ("from concurrent.futures import ThreadPoolExecutor", "pass", "from concurrent.futures import"),
        ("import sys", "f = sys._getframe(1)", "sys._getframe"),
        ("import inspect", "f = inspect.currentframe()", "import inspect"),
        ("import gc", "objs = gc.get_objects()", "import gc"),
        ("import importlib", "m = importlib.import_module('os')", "import importlib"),
        ("import shutil", "shutil.rmtree('/tmp/x')", "import shutil"),
        ("import pathlib", "pathlib.Path('f').write_text('x')", "import pathlib"),
        ("import time", "t = time.perf_counter()", "import time"),
        ("import numpy as np", "a = np.zeros(3)", "import numpy"),
        ("import json", "pass", "import json"),
        ("from . import helpers", "pass", "from . import"),
        ("from torch import *", "pass", "from torch import *"),
    ],
)
def test_escape_modules_are_refused(header: str, snippet: str, construct: str) -> None:
    assert_refused(with_body(snippet, header), construct)


@pytest.mark.parametrize(
    ("snippet", "construct"),
    [
        ("g = globals()", "globals()"),
        ("g = locals()", "locals()"),
        ("g = vars(x)", "vars()"),
        ("m = __import__('os')", "__import__()"),
        ("b = __builtins__", "__builtins__"),
        ("eval('1 + 1')", "eval()"),
        ("exec('y = 1')", "exec()"),
        ("c = compile('1', 'f', 'eval')", "compile()"),
        ("fh = open('/tmp/out', 'w')", "open()"),
        ("fh = open('/etc/passwd')", "open()"),
        ("setattr(torch, 'relu', print)", "setattr()"),
        ("delattr(x, 'y')", "delattr()"),
        ("frame = x.f_back", ".f_back"),
        ("frame = x.f_locals", ".f_locals"),
        ("frame = x.f_globals", ".f_globals"),
        ("code = kernel_function.__globals__", ".__globals__"),
        ("subs = ().__class__.__bases__[0].__subclasses__()", ".__subclasses__"),
        ("s = torch.cuda.Stream()", "torch.cuda.Stream"),
        ("ctx = torch.cuda.stream(None)", "torch.cuda.stream"),
        ("e = torch.cuda.Event(enable_timing=True)", "torch.cuda.Event"),
        ("torch.cuda.synchronize()", "torch.cuda.synchronize"),
        ("x.record_stream(None)", ".record_stream"),
        ("t = torch.Tensor._make_subclass(torch.Tensor, x)", ".__class__" if False else "._make_subclass"),
        ("t = x.as_subclass(torch.Tensor)", ".as_subclass"),
        ("torch.relu = print", "torch.relu"),
        ("triton.cdiv = print", "triton.cdiv"),
        ("tl.load = print", "triton.language.load"),
        ("y = triton.testing.do_bench(print)", "triton.testing.do_bench"),
        ("y = torch._C._nn.gelu(x)", "torch._C._nn.gelu"),
        ("torch.manual_seed(0)", "torch.manual_seed"),
    ],
)
def test_introspection_dynamic_code_files_streams_and_patching_are_refused(snippet: str, construct: str) -> None:
    assert_refused(with_body(snippet), construct)


def test_monkey_patching_time_is_refused_even_when_imported() -> None:
    source = with_body("time.perf_counter = lambda: 0.0", header="import time")
    assert_refused(source, "import time")
    assert_refused(source, "time.perf_counter")


def test_builtin_smuggled_through_defaults_or_rebinding_is_refused() -> None:
    assert_refused(with_body("pass", header="def helper(e=eval):\n    return e('1')\n"), "eval()")
    assert_refused(with_body("pass", header="eval = eval\n"), "eval()")
    assert_refused(with_body("ys = [ev for ev in [eval]]"), "eval()")


def test_tensor_subclass_and_torch_function_hooks_are_refused() -> None:
    header = textwrap.dedent(
        """
        class Lazy(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        """
    )
    source = with_body("pass", header)
    assert_refused(source, "torch.Tensor")
    assert_refused(source, "__torch_function__")
    dispatch = with_body("pass", "class M:\n    def __torch_dispatch__(self, *a):\n        return None\n")
    assert_refused(dispatch, "__torch_dispatch__")


def test_forbidden_names_inside_jit_kernels_are_refused_too() -> None:
    source = CLEAN.replace("tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)",
                           "tl.store(y_ptr + offs, torch.relu(x), mask=mask)")
    assert_refused(source, "torch.relu")


def test_every_violation_names_construct_and_line_and_renders() -> None:
    source = with_body("y = torch.relu(x)\nz = x.relu()", header="import os")
    violations = screen_source(source, "relu", "triton")
    assert {v.construct for v in violations} >= {"import os", "torch.relu", ".relu"}
    rendered = format_violations(violations)
    for v in violations:
        assert f"line {v.line}:" in rendered
        assert v.to_dict()["construct"] == v.construct


# ---------------------------------------------------------------------------------------------------------
# Structure and syntax
# ---------------------------------------------------------------------------------------------------------
def test_syntax_error_is_one_syntax_violation_with_the_parser_message() -> None:
    source = CLEAN.replace("def kernel_function(input, inplace=False):", "def kernel_function(input, inplace=False)")
    violations = screen_source(source, "relu", "triton")
    assert len(violations) == 1 and has_syntax_error(violations)
    assert violations[0].line == line_of(source, "def kernel_function(")
    assert "expected ':'" in violations[0].message


def test_missing_kernel_function_is_refused() -> None:
    source = CLEAN.replace("def kernel_function(", "def run(")
    violations = screen_source(source, "relu", "triton")
    assert [(v.construct, v.kind) for v in violations] == [("kernel_function", "structure")]
    assert "def kernel_function" in violations[0].message


def test_nested_kernel_function_does_not_count() -> None:
    source = CLEAN.replace("def kernel_function(", "def outer():\n    pass\n\n\ndef _kernel_function(") + (
        "\n\nclass Holder:\n    def kernel_function(self):\n        return None\n"
    )
    assert "kernel_function" in constructs(source)


def test_no_jit_kernel_is_refused() -> None:
    source = CLEAN.replace("@triton.jit\n", "")
    violations = screen_source(source, "relu", "triton")
    assert ("@triton.jit", "structure") in [(v.construct, v.kind) for v in violations]


def test_a_wrapper_that_launches_nothing_by_name_is_left_to_the_run_time_check() -> None:
    # Formerly refused by name ("never launches a @triton.jit kernel"); the run-time launch check refuses it when it
    # runs (tests/agent/test_launch_check.py), so screening only keeps its construct bans.
    source = CLEAN.replace("    _relu_kernel[grid](x, y, n, BLOCK=128)\n", "    y.zero_()\n")
    assert screen_source(source, "relu", "triton") == []
    moved = CLEAN.replace("    _relu_kernel[grid](x, y, n, BLOCK=128)\n", "") + (
        "\n\ndef unused(x, y):\n    _relu_kernel[(1,)](x, y, 1, BLOCK=128)\n"
    )
    assert screen_source(moved, "relu", "triton") == []


def test_the_construct_bans_still_hold_without_the_launch_rule() -> None:
    source = CLEAN.replace("    _relu_kernel[grid](x, y, n, BLOCK=128)\n", "    y.copy_(x.relu())\n")
    assert constructs(source) == [".relu"]


def test_launch_through_a_helper_counts() -> None:
    source = CLEAN.replace("    _relu_kernel[grid](x, y, n, BLOCK=128)\n", "    _go(x, y, n, grid)\n") + (
        "\n\ndef _go(x, y, n, grid):\n    _relu_kernel[grid](x, y, n, BLOCK=128)\n"
    )
    assert screen_source(source, "relu", "triton") == []


# ---------------------------------------------------------------------------------------------------------
# Language registry
# ---------------------------------------------------------------------------------------------------------
def test_language_registry(tmp_path) -> None:
    triton_lang = get_language("triton")
    assert isinstance(triton_lang, TritonLanguage)
    assert get_language(triton_lang) is triton_lang
    assert "triton" in language_names()
    assert triton_lang.file_suffix == ".py" and "python" in triton_lang.fence_tags
    assert set(triton_lang.device_types()) >= {"cuda", "cpu"}
    assert triton_lang.child_environment("cpu", tmp_path) == {"TRITON_INTERPRET": "1"}
    assert triton_lang.child_environment("cuda", tmp_path) == {}
    with pytest.raises(ValueError, match="unknown kernel language 'cobol'"):
        get_language("cobol")
    with pytest.raises(TypeError):
        register_language("triton")  # type: ignore[arg-type]


def test_screen_source_dispatches_to_a_registered_language(monkeypatch) -> None:
    from agent import languages

    monkeypatch.setattr(languages, "_LANGUAGES", dict(languages._LANGUAGES))  # the registration ends with the test

    class Strict(KernelLanguage):
        name = "strict-test"

        def screen(self, source: str, function_name: str | None = None) -> list[Violation]:
            return [Violation("everything", 1, "refused by the strict test language")]

        def device_types(self) -> tuple[str, ...]:
            return ("cpu",)

    register_language(Strict())
    assert [v.construct for v in screen_source(CLEAN, "relu", "strict-test")] == ["everything"]
    assert screen_source(CLEAN, "relu", Strict()) != []


def test_triton_load_imports_the_file_and_returns_the_entry(tmp_path) -> None:
    path = tmp_path / "k.py"
    path.write_text("def kernel_function(x):\n    return x + 1\n")
    entry = get_language("triton").load(path, "kforge_test_load_module")
    assert entry(1) == 2
    path.write_text("VALUE = 1\n")
    with pytest.raises(AttributeError, match="defines no `kernel_function`"):
        get_language("triton").load(path, "kforge_test_load_module2")


def test_module_screening_allows_layers_but_not_functional_or_escapes() -> None:
    from agent.languages import get_language

    language = get_language("triton")
    good = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        y = torch.empty_like(x)
        _relu[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""
    assert language.screen_module(good) == []
    functional = good.replace("        return y\n", "        return torch.nn.functional.relu(x)\n")
    assert any("torch.nn.functional" in v.construct for v in language.screen_module(functional))
    escape = good.replace("import torch\n", "import torch\nimport subprocess\n")
    assert any("subprocess" in v.construct for v in language.screen_module(escape))
    no_model = good.replace("class ModelNew", "class Other")
    assert any(v.construct == "ModelNew" for v in language.screen_module(no_model))
    # the function-kernel policy is unchanged: layers stay refused there
    assert language.screen(good, "relu")


# ---------------------------------------------------------------------------------------------------------
# Allow-list screening (issue 9): the gadgets that walked around the deny-list
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "snippet", "construct"),
    [
        # module globals through the Triton function object
        ("", "os = _relu_kernel.get_capture_scope()['__builtins__']['__import__']('os')", ".get_capture_scope"),
        ("", "os = _relu_kernel.get_capture_scope()['__builtins__']['__import__']('os')", "'__builtins__'"),
        ("", "os = _relu_kernel.get_capture_scope()['__builtins__']['__import__']('os')", "'__import__'"),
        # InterpretedFunction.rewrite() then a bare module name in the rewritten body
        ("", "f = _relu_kernel.rewrite()", ".rewrite"),
        ("def _evil():\n    return os.system('id')\n", "pass", "os"),
        # a bare module name never bound by an import
        ("", "os.system('id')", "os"),
        ("", "sys.modules['os'].system('id')", "sys"),
        # formatting reaches attributes
        ("", "leak = '{0.__globals__}'.format(kernel_function)", ".format"),
        ("", "leak = str.format('{0.__globals__}', kernel_function)", ".format"),
        ("", "leak = '{f.__globals__}'.format_map({'f': kernel_function})", ".format_map"),
        ("", "leak = format(kernel_function, '')", "format()"),
        # attribute assignment on objects reached through a call
        ("", "type(x).any = lambda *a: True", ".any"),
        ("", "type(x).__dict__['relu'](x)", ".__dict__"),
        ("", "m = type(x).mro()", ".mro"),
        ("", "x.storage().foo = 1", ".foo"),
        # the getattr family, including computed dunders
        ("", "g = getattr(x, '__glob' + 'als__')", "getattr"),
        ("", "g = getattr(x, '__glob' + 'als__')", "'__globals__'"),
        ("", "ok = hasattr(x, 'shape')", "hasattr()"),
        ("", "v = vars()", "vars()"),
        ("", "v = globals()['__builtins__']", "globals()"),
        ("", "v = kernel_function.__globals__", ".__globals__"),
        # subscripting with dunder strings
        ("", "b = {}.get('__builtins__')", "'__builtins__'"),
        ("", "b = kernel_function.__dict__", ".__dict__"),
        ("", "key = f\"__{'import'}__\"", "'__import__'"),
        # function objects' internals
        ("", "src = _relu_kernel.src", ".src"),
        ("", "fn = _relu_kernel.fn", ".fn"),
        ("", "cache = _relu_kernel.cache", ".cache"),
        ("", "o = object()", "object()"),
        # helpers of allowed modules outside their allow-list
        ("import functools", "h = functools.singledispatch", "functools.singledispatch"),
    ],
)
def test_allow_list_refuses_the_gadgets(header: str, snippet: str, construct: str) -> None:
    found = assert_refused(with_body(snippet, header), construct)
    assert found.message


def test_allowed_attributes_names_and_self_pass() -> None:
    source = with_body(
        """
        meta = {"BLOCK": 128}
        meta.update(num_warps=4)
        sizes = [d for d in x.shape if d > 0]
        info = torch.finfo(x.dtype)
        eps, big = info.eps, info.max
        dev = x.device.type + str(x.device.index)
        for key, value in sorted(meta.items()):
            del key, value
        assert isinstance(x, torch.Tensor) and len(sizes) == x.ndim and x.dtype.itemsize > 0
        assert type(sizes) is list
        """
    )
    assert screen_source(source, "relu", "triton") == []


def test_a_per_shape_kernel_cache_passes() -> None:
    source = CLEAN.replace("def kernel_function(input, inplace=False):", textwrap.dedent(
        """
        _CACHE = {}


        def _config(x):
            key = (tuple(x.shape), x.dtype)
            cfg = _CACHE.get(key)
            if cfg is None:
                cfg = (_relu_kernel, (triton.cdiv(x.numel(), 128),), {"BLOCK": 128, "num_warps": 4})
                _CACHE[key] = cfg
            return cfg


        def kernel_function(input, inplace=False):""").lstrip("\n"))
    source = source.replace("    _relu_kernel[grid](x, y, n, BLOCK=128)\n",
                            "    kern, grid, meta = _config(x)\n    kern[grid](x, y, n, **meta)\n")
    assert "kern[grid]" in source
    assert screen_source(source, "relu", "triton") == []


def test_a_kernel_returned_by_a_helper_and_launched_at_once_passes() -> None:
    # `_pick(x)[grid](...)`: no name of the launched object is a kernel; the static rule by name refused this.
    source = CLEAN.replace("def kernel_function(input, inplace=False):",
                           "def _pick(x):\n    return _relu_kernel\n\n\ndef kernel_function(input, inplace=False):")
    source = source.replace("    _relu_kernel[grid](x, y, n, BLOCK=128)\n", "    _pick(x)[grid](x, y, n, BLOCK=128)\n")
    assert screen_source(source, "relu", "triton") == []


def _honest_corpus() -> list[tuple[str, str, str]]:
    """(label, function, source) for every honest kernel the project holds: the agent's examples, the test kernels
    and every kernel in the recorded LLM replies (cassettes)."""
    import json
    from pathlib import Path

    from agent.replies import extract_code
    from tests.agent import kernels

    root = Path(__file__).resolve().parents[2]
    corpus = [("examples/triton_example.py", "silu", (root / "agent/examples/triton_example.py").read_text()),
              ("examples/module_example.py", "", (root / "agent/examples/module_example.py").read_text()),
              ("kernels.SILU_OK", "silu", kernels.SILU_OK), ("kernels.SILU_WRONG", "silu", kernels.SILU_WRONG),
              ("kernels.SILU_HANG", "silu", kernels.SILU_HANG),
              ("kernels.RMS_NORM_OK", "rms_norm", kernels.RMS_NORM_OK),
              ("kernels.SILU_COMPILE_ERROR", "silu", kernels.SILU_COMPILE_ERROR)]
    cassettes = [root / "evals/cassettes/demo_h200.jsonl", *sorted((root / "tests/evals/cassettes").glob("*.jsonl")),
                 *sorted((root / "agent/cassettes").glob("*.jsonl"))]
    for path in cassettes:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            record = json.loads(line)
            extracted = extract_code(record["response"]["text"])
            if extracted is not None:
                corpus.append((f"{path.name}:{number}", record["tag"], extracted.code))
    return corpus


HONEST = _honest_corpus()


@functools.cache
def _instance_attributes(demo: str, qualified: str) -> frozenset[str]:
    """What a `ModelNew` written for the first instance of `qualified` in `demo` (its H200 size, on meta tensors) may
    read on it (`forge.modules.attribute_names`), as the optimizer screens it; the demo's library must be installed."""
    from agent.demo_prompts import _meta_demo
    from forge.errors import UsageError
    from forge.modules import attribute_names, class_name

    try:
        model, _ = _meta_demo(demo, "cuda")
    except UsageError as exc:  # the demo's library is missing (timm needs a torchvision built for this torch)
        pytest.skip(str(exc))
    return attribute_names(next(m for m in model.modules() if class_name(m) == qualified))


@pytest.mark.parametrize(("label", "function", "source"), HONEST, ids=[label for label, _, _ in HONEST])
def test_every_honest_kernel_passes_the_allow_list(label: str, function: str, source: str) -> None:
    language = get_language("cuda" if "load_cuda(" in source else "triton")  # the CUDA demo cassettes (issue 12)
    if "class ModelNew" not in source:
        violations = language.screen(source, function)
    elif function.startswith("module:"):  # written for a live instance of a library demo: its names are readable
        demo = re.fullmatch(r"demo-(.+)-nvidia-h200\.jsonl:\d+", label).group(1)
        violations = language.screen_module(source, _instance_attributes(demo, function.removeprefix("module:")))
    else:
        violations = language.screen_module(source)
    assert violations == [], f"{label}:\n{format_violations(violations)}"


def test_the_honest_corpus_holds_the_cassette_kernels() -> None:
    labels = [label for label, _, _ in HONEST]
    assert sum("demo_h200" in label for label in labels) == 3
    assert sum("smoke" in label for label in labels) >= 6


# ---------------------------------------------------------------------------------------------------------
# Methods called with an object of the file's choice as `self` (the adversarial corpus's screening bypass)
# ---------------------------------------------------------------------------------------------------------
_PATCHER = """
class _Put:
    def update(self, value):
        self.sum = value

    def get(self):
        return self.get_capture_scope()

    @staticmethod
    def block(n):
        return 128 if n < 4096 else 1024

    LIMIT = 4096
"""


@pytest.mark.parametrize(("snippet", "construct"), [
    ("_Put.update(torch.Tensor, None)", "_Put.update"),
    ("scope = _Put.get(_relu_kernel)", "_Put.get"),
    ("f = _Put.get", "_Put.get"),
    ("type(_Put()).update(torch.Tensor, None)", "type(...)"),
    ("super(_Put, torch.Tensor).update(None)", "super"),
    # the class as a value may be instantiated, but its method names are readable on no untyped value
    ("c = _Put\nc.update(torch.Tensor, None)", ".update"),
    ("[_Put][0].update(torch.Tensor, None)", ".update"),
    ("f = lambda: _Put\nf().update(torch.Tensor, None)", ".update"),
    # type(...) beyond a comparison gives the class
    ("c = type(_Put())\nc.update(torch.Tensor, None)", "type"),
    ("t = type\nt(_Put()).update(torch.Tensor, None)", "type"),
    ("m = _Put.mro()", "_Put.mro"),
    # a rebound super
    ("s = super\ns(_Put, torch.Tensor).update(None)", "super"),
])
def test_methods_reached_unbound_are_refused(snippet: str, construct: str) -> None:
    """`self` may read and write any attribute only because it is the file's own instance: a method taken from the
    class (or through type(), super(cls, obj), the class as a value) runs with any object as self, e.g. patching
    torch.Tensor.sum."""
    assert_refused(with_body(snippet, _PATCHER), construct)


_UPDATE = "    def update(self, value):\n        self.sum = value\n"


@pytest.mark.parametrize(("header", "snippet", "construct"), [
    # a method aliased in its class body is the function itself, reachable through the class
    (f"class _Q:\n{_UPDATE}\n    get = update\n", "_Q.get(torch.Tensor, None)", "_Q.get"),
    (f"class _Q:\n{_UPDATE}\n    get = update\n", "pass", ".sum"),
    (f"class _Q:\n{_UPDATE}\n    get = classmethod(lambda cls, o, v: cls.update(o, v))\n",
     "_Q.get(torch.Tensor, None)", "_Q.get"),
    # a decorator of the file's own receives the function unbound: no `self` privilege then
    (f"_REG = []\n\n\ndef _keep(f):\n    _REG.append(f)\n    return f\n\n\nclass _D:\n    @_keep\n{_UPDATE}",
     "_REG[0](torch.Tensor, None)", ".sum"),
    # a staticmethod's first parameter is any argument
    ("class _S:\n    @staticmethod\n    def get(obj):\n        return obj.get_capture_scope()\n",
     "scope = _S.get(_relu_kernel)", ".get_capture_scope"),
    # hooks Python calls with the class
    (f"class _P:\n{_UPDATE}\n    def __init_subclass__(cls):\n        cls.update(torch.Tensor, None)\n",
     "pass", "__init_subclass__"),
    (f"class _P:\n{_UPDATE}\n    def __new__(cls):\n        return cls.update(torch.Tensor, None)\n", "pass",
     "__new__"),
    (f"class _P:\n{_UPDATE}\n    def __class_getitem__(cls, item):\n        return cls.update(item, None)\n",
     "pass", "__class_getitem__"),
    ("class _P:\n    def __get__(self, obj, owner):\n        return owner\n", "pass", "__get__"),
    ("class _M(type):\n    pass\n", "pass", "type"),
    ("class _Meta:\n    pass\n\n\nclass _P(metaclass=_Meta):\n    pass\n", "pass", "metaclass"),
    ("_SEEN = []\n\n\ndef _keep(c):\n    _SEEN.append(c)\n    return c\n\n\n@_keep\nclass _P:\n    pass\n", "pass",
     "@_keep"),
    # a str subclass's self has .format (and a computed base may be torch.Tensor)
    ("class _S(str):\n    def leak(self, f):\n        return self.format(f)\n", "pass", ".format"),
    ("class _S(str):\n    def leak(self, f):\n        return super().format(f)\n", "pass", ".format"),
    # through the class, __init__ is unbound too
    ("class _I:\n    def __init__(self, v=None):\n        self.sum = v\n", "_I.__init__(torch.Tensor, print)",
     "_I.__init__"),
    # a classmethod made by a call, reached through an instance
    (f"class _Q:\n{_UPDATE}\n    get = classmethod(lambda cls, o, v: cls.update(o, v))\n",
     "_Q().get(torch.Tensor, None)", "classmethod"),
    # == / in call the other operand's __eq__ with the class
    ("class _E:\n    def __eq__(self, other):\n        return other.update(torch.Tensor, None)\n",
     "ok = _E() == _Put", ".update"),
    ("class _E:\n    def __eq__(self, other):\n        return other.update(torch.Tensor, None)\n",
     "ok = type(_Put()) == _E()", "type"),
    # a class inside a class is the class itself as `self.Inner`
    ("class _O:\n    class Inner:\n        pass\n", "pass", "Inner"),
    # what `self.x` holds is not the file's own: no privilege past the first attribute
    ("class _H:\n    def __init__(self):\n        self.k = _relu_kernel\n\n    def get(self):\n"
     "        return self.k.get_capture_scope()\n", "s = _H().get()", ".get_capture_scope"),
    ("class _H:\n    def __init__(self):\n        self.t = torch.Tensor\n        self.t.sum = print\n", "h = _H()",
     ".sum"),
    ("class _H:\n    def __init__(self):\n        self.k = _relu_kernel\n        self.k.fn = print\n", "h = _H()",
     ".fn"),
    ("def _base():\n    return torch.Tensor\n\n\nclass _L(_base()):\n    pass\n", "pass", "_base()"),
])
def test_ways_to_get_a_method_or_class_unbound_are_refused(header: str, snippet: str, construct: str) -> None:
    assert_refused(with_body(snippet, _PATCHER + "\n\n" + header if "_Put" in snippet else header), construct)


def test_a_class_passed_as_a_value_may_be_instantiated_and_read_for_constants() -> None:
    """ResNet's `self._make_layer(BasicBlock, 64, 2)`: the class flows into a parameter, which is called and read
    for `expansion`; its method names are then readable on no untyped value."""
    header = textwrap.dedent("""
        class _Block:
            expansion = 4

            def __init__(self, width):
                self.width = width * self.expansion

            def grid(self, n):
                return (triton.cdiv(n, self.width),)


        def _make(block, width):
            return block(width), block.expansion
        """)
    honest = with_body("blk, e = _make(_Block, 32)\nassert blk.width == 32 * e", header)
    assert screen_source(honest, "relu", "triton") == []
    assert_refused(with_body("blk, e = _make(_Block, 32)\ng = blk.grid(4)", header), ".grid")
    assert_refused(with_body("b = _Block\nb.grid(torch.Tensor, 4)", header), ".grid")


def test_class_constants_and_static_methods_are_readable_through_the_class() -> None:
    source = with_body("n = _Put.LIMIT\nb = _Put.block(n)\nok = isinstance(_Put(), _Put) and type(x) is not _Put",
                       _PATCHER)
    assert screen_source(source, "relu", "triton") == []


def test_a_classmethod_is_refused_and_bound_calls_pass() -> None:
    header = "class _C:\n    @classmethod\n    def make(cls):\n        return cls.run(1)\n\n    def run(self):\n" \
             "        return self\n"
    classmethod_source = with_body("pass", header)
    assert_refused(classmethod_source, "classmethod")
    honest = with_body("p = _Put()\np.update(1)\nscope = p.get", _PATCHER)
    assert screen_source(honest, "relu", "triton") == []


# ---------------------------------------------------------------------------------------------------------
# Members of triton.language's enum classes are constants (tl.PropagateNan.ALL), device and host code alike
# ---------------------------------------------------------------------------------------------------------
_NAN_KERNEL = CLEAN.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)")


def test_enum_members_of_triton_language_pass_in_device_and_host_code() -> None:
    assert "tl.PropagateNan.ALL" in _NAN_KERNEL
    assert constructs(_NAN_KERNEL) == []
    host = _NAN_KERNEL.replace("    # INSERT",
                               "    none = tl.PropagateNan.NONE\n    from_core = tl.core.PropagateNan.ALL")
    assert constructs(host) == []
    # past the member, attributes are a value's: `.value` is on no host allow-list
    assert constructs(_NAN_KERNEL.replace("    # INSERT", "    value = tl.PropagateNan.ALL.value")) == [".value"]
    imported = host.replace("import triton.language as tl\n",
                            "import triton.language as tl\nfrom triton.language import PropagateNan as P\n", 1)
    imported = imported.replace("propagate_nan=tl.PropagateNan.ALL", "propagate_nan=P.ALL")
    assert constructs(imported) == []


def test_the_enum_members_are_derived_from_the_installed_triton() -> None:
    import enum

    import triton.language as tl

    from agent.languages.triton import triton_language_constant

    enums = {name: value for name, value in vars(tl).items() if isinstance(value, enum.EnumMeta)}
    assert "PropagateNan" in enums
    for name, cls in enums.items():
        for member in cls.__members__:
            assert triton_language_constant(f"triton.language.{name}.{member}"), (name, member)
    for qualname in ("triton.language.PropagateNan", "triton.language.PropagateNan.mro",
                     "triton.language.PropagateNan._missing_", "triton.language.PropagateNan.ALL.ALL",
                     "triton.language.tensor.T", "triton.runtime.driver.PropagateNan.ALL", "enum.Enum.ALL"):
        assert not triton_language_constant(qualname), qualname


@pytest.mark.parametrize(("snippet", "construct"), [
    ("m = tl.PropagateNan.mro()", ".mro"),
    ("m = tl.PropagateNan._missing_", "._missing_"),
    ("m = tl.PropagateNan.ALL.__class__", ".__class__"),
    ("m = tl.PropagateNan.__members__", ".__members__"),
    ("m = tl.PropagateNan.ALL.ALL", ".ALL"),
    ("m = tl.PropagateNan.ALL.format", ".format"),
])
def test_what_is_not_an_enum_member_stays_judged_as_an_attribute(snippet: str, construct: str) -> None:
    assert construct in constructs(_NAN_KERNEL.replace("    # INSERT", "    " + snippet))


def test_construction_compute_is_for_module_files_only() -> None:
    """A function-problem file has no construction: `torch.tril` in a class's `__init__` stays refused."""
    source = with_body("h = _Mask(4)", header="\n\nclass _Mask:\n    def __init__(self, n):\n"
                       "        self.m = torch.tril(torch.ones(n, n))\n")
    assert_refused(source, "torch.tril")
