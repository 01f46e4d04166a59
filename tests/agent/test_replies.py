"""extract_code / no_code_feedback on realistic LLM replies."""

from __future__ import annotations

import ast

import pytest

from agent.replies import extract_code, no_code_feedback

KERNEL = """import torch
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0), mask=mask)


def kernel_function(x):
    y = torch.empty_like(x)
    _relu[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
"""

LONG_HELPER = "import torch\n\n" + "\n".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(30))


def fenced(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code if code.endswith(chr(10)) else code + chr(10)}```"


def test_prose_and_several_blocks_pick_the_kernel_function_block():
    text = (
        "Let me think about the memory layout first.\n\n"
        + fenced(LONG_HELPER)
        + "\n\nThat helper is long but not the answer. Here is the kernel:\n\n"
        + fenced(KERNEL)
        + "\n\nRun it like this:\n\n"
        + fenced("$ python bench.py", "bash")
        + "\n"
    )
    got = extract_code(text)
    assert got is not None
    assert got.code == KERNEL and got.block_count == 3
    assert "kernel_function" in got.note
    ast.parse(got.code)


@pytest.mark.parametrize("tag", ["python", "py", "triton", "", "Python3"])
def test_accepted_fence_tags(tag):
    got = extract_code("Answer:\n" + fenced(KERNEL, tag))
    assert got is not None and got.code == KERNEL


def test_tilde_and_long_fences():
    assert extract_code("~~~python\n" + KERNEL + "~~~\n").code == KERNEL
    nested = "````python\n" + KERNEL + "# a fence inside: \n```\n````\n"
    got = extract_code(nested)
    assert got is not None and got.code.startswith("import torch") and got.code.rstrip().endswith("```")


def test_class_model_new_is_an_entry_point():
    module = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"
    got = extract_code(fenced(LONG_HELPER) + "\n" + fenced(module))
    assert got is not None and got.code == module and "ModelNew" in got.note


def test_complete_module_preferred_over_a_later_snippet():
    snippet = "def kernel_function(x):\n    return _relu_fast(x)\n"
    got = extract_code(fenced(KERNEL) + "\nOr shorter:\n" + fenced(snippet))
    assert got is not None and got.code == KERNEL


def test_last_full_version_wins():
    revised = KERNEL.replace("BLOCK=1024", "BLOCK=2048")
    got = extract_code("Original:\n" + fenced(KERNEL) + "\nFixed version:\n" + fenced(revised))
    assert got is not None and got.code == revised and "2 blocks define" in got.note


def test_longest_python_block_when_none_defines_an_entry_point():
    got = extract_code(fenced("x = 1\n") + "\n" + fenced(LONG_HELPER) + "\n" + fenced("SELECT 1;\n" * 50, "sql"))
    assert got is not None and got.code == LONG_HELPER and "longest" in got.note


def test_no_code():
    text = "I cannot write this kernel because the shapes are dynamic."
    assert extract_code(text) is None
    feedback = no_code_feedback(text)
    assert "no ```python fenced block defining `kernel_function`" in feedback


def test_empty_reply():
    assert extract_code("") is None and extract_code("  \n") is None
    assert "empty" in no_code_feedback("")


def test_unclosed_final_fence_is_refused_as_truncated():
    truncated = "Here is the kernel:\n```python\n" + KERNEL[:200]
    assert extract_code(truncated) is None
    assert "cut off" in no_code_feedback(truncated)
    # ...even when an earlier complete block exists: the final answer was cut off
    draft_then_cut = fenced(KERNEL) + "\nImproved:\n```python\n" + KERNEL[:100]
    assert extract_code(draft_then_cut) is None
    assert "cut off" in no_code_feedback(draft_then_cut)


def test_only_other_languages():
    text = "Use CUDA:\n" + fenced("__global__ void k() {}\n", "cuda")
    assert extract_code(text) is None
    assert "other languages (cuda)" in no_code_feedback(text)


def test_think_sections_are_ignored():
    text = "<think>maybe\n" + fenced("def kernel_function(x):\n    pass\n") + "\nno.</think>\nFinal:\n" + fenced(KERNEL)
    got = extract_code(text)
    assert got is not None and got.code == KERNEL and got.block_count == 1
    unfinished = "<think>I should use a block size of " + "very " * 50
    assert extract_code(unfinished) is None
    assert "<think>" in no_code_feedback(unfinished)


def test_unfenced_reply_accepted_only_when_it_is_python_defining_the_entry_point():
    got = extract_code(KERNEL)
    assert got is not None and got.code == KERNEL and got.block_count == 0
    assert extract_code("Sure! " + KERNEL) is None  # prose makes it invalid Python
    assert extract_code(LONG_HELPER) is None  # valid Python, but no entry point


def test_custom_entry_point_in_feedback():
    assert "`my_entry`" in no_code_feedback("nothing here", entry_point="my_entry")
