"""KernelBench-format module problems: loading folders, seeded instantiation, input dtypes and fresh draws."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from evals import ModuleProblem, SuiteFormatError, load_kernelbench_folder, load_suite

RELU = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Simple model that performs a ReLU activation."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 4
dim = 64


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
'''

CROSS_ENTROPY = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Cross-entropy loss for multi-class classification."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


batch_size = 8
num_classes = 10


def get_inputs():
    return [torch.rand(batch_size, num_classes), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
'''

LINEAR = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.rand(3, 16), 2.0]


def get_init_inputs():
    return [16, 8]
'''

LINEAR_CANDIDATE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return x @ self.fc.weight.t() + self.fc.bias
'''

TRITON_RELU_CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
        return out
'''


def _kernelbench(tmp_path: Path) -> Path:
    root = tmp_path / "KernelBench"
    (root / "level1").mkdir(parents=True)
    (root / "level2").mkdir()
    (root / "level1" / "19_ReLU.py").write_text(RELU)
    (root / "level1" / "95_CrossEntropyLoss.py").write_text(CROSS_ENTROPY)
    (root / "level1" / "2_Linear.py").write_text(LINEAR)
    (root / "level1" / "__init__.py").write_text("")
    (root / "level2" / "1_LinearAgain.py").write_text(LINEAR)
    return root


def _by_id(problems):
    return {p.id: p for p in problems}


def test_load_level_folder(tmp_path):
    root = _kernelbench(tmp_path)
    problems = load_kernelbench_folder(root / "level1")
    assert [p.id for p in problems] == ["level1/2_Linear", "level1/19_ReLU", "level1/95_CrossEntropyLoss"]
    relu = problems[1]
    assert isinstance(relu, ModuleProblem) and relu.kind == "module"
    assert (relu.level, relu.number, relu.name, relu.suite) == (1, 19, "ReLU", "kernelbench-level1")
    assert relu.source == RELU and relu.path == str(root / "level1" / "19_ReLU.py")
    assert relu.description == "Simple model that performs a ReLU activation."
    assert relu.provenance.model == "KernelBench level 1" and relu.provenance.layer == "ReLU"
    assert relu.to_json()["kind"] == "module"


def test_load_root_folder_all_levels_or_one(tmp_path):
    root = _kernelbench(tmp_path)
    ids = [p.id for p in load_kernelbench_folder(root)]
    assert ids == ["level1/2_Linear", "level1/19_ReLU", "level1/95_CrossEntropyLoss", "level2/1_LinearAgain"]
    assert [p.id for p in load_kernelbench_folder(root, level=2)] == ["level2/1_LinearAgain"]
    assert [p.id for p in load_suite(root / "level2")] == ["level2/1_LinearAgain"]
    with pytest.raises(SuiteFormatError, match="no level3 folder"):
        load_kernelbench_folder(root, level=3)
    with pytest.raises(SuiteFormatError, match="level 1 but level=2"):
        load_kernelbench_folder(root / "level1", level=2)


def test_folder_without_level_name_uses_level_argument(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_relu.py").write_text(RELU)
    (problem,) = load_kernelbench_folder(folder)
    assert (problem.id, problem.level, problem.number, problem.suite) == ("my_relu", None, None, "mine")
    (problem,) = load_kernelbench_folder(folder, level=1)
    assert problem.id == "level1/my_relu"


def test_bad_files_name_the_file_and_what_is_missing(tmp_path):
    folder = tmp_path / "level1"
    folder.mkdir()
    (folder / "1_NoInit.py").write_text(RELU.replace("def get_init_inputs", "def other"))
    with pytest.raises(SuiteFormatError) as info:
        load_kernelbench_folder(folder)
    assert info.value.field == "get_init_inputs" and "1_NoInit.py" in str(info.value)
    (folder / "1_NoInit.py").write_text("class Model(:\n")
    with pytest.raises(SuiteFormatError, match="1_NoInit.py.*not valid Python"):
        load_kernelbench_folder(folder)
    (folder / "1_NoInit.py").unlink()
    with pytest.raises(SuiteFormatError, match="no KernelBench problem files"):
        load_kernelbench_folder(folder)
    with pytest.raises(NotADirectoryError, match="does not exist"):
        load_kernelbench_folder(tmp_path / "missing")


def test_a_file_that_is_not_utf8_names_the_file_and_the_fix(tmp_path):
    folder = tmp_path / "level1"
    folder.mkdir()
    (folder / "19_ReLU.py").write_text(RELU)
    latin1 = RELU.replace("Simple model", "Modèle simple").encode("latin-1")
    (folder / "7_Latin1.py").write_bytes(latin1)
    with pytest.raises(SuiteFormatError) as info:
        load_kernelbench_folder(folder)
    message = str(info.value)
    assert info.value.path == str(folder / "7_Latin1.py") and message.startswith(str(folder / "7_Latin1.py"))
    assert "not UTF-8" in message and "0xe8" in message and "line 7" in message and "UTF-8" in message
    assert "\n" not in message
    with pytest.raises(SuiteFormatError, match="7_Latin1.py"):
        load_suite(folder)  # the path `kforge eval FOLDER` takes
    (folder / "7_Latin1.py").write_bytes(latin1.decode("latin-1").encode("utf-8"))
    assert len(load_kernelbench_folder(folder)) == 2  # re-saved as UTF-8, it loads


def test_an_unreadable_problem_file_names_the_file(tmp_path):
    folder = tmp_path / "level1"
    (folder / "3_Folder.py").mkdir(parents=True)  # a folder named like a problem file
    with pytest.raises(SuiteFormatError, match="3_Folder.py.*cannot read the file"):
        load_kernelbench_folder(folder)


def test_integer_targets_keep_their_dtype(tmp_path):
    problem = _by_id(load_kernelbench_folder(_kernelbench(tmp_path) / "level1"))["level1/95_CrossEntropyLoss"]
    model, (predictions, targets) = problem.instantiate("cpu", seed=1, dtype=torch.float64)
    assert predictions.dtype == torch.float64 and targets.dtype == torch.int64
    loss = model(predictions, targets)
    assert loss.dtype == torch.float64 and torch.isfinite(loss)
    # A float cast of the targets, as the upstream harness does, breaks the reference: the reason for this rule.
    with pytest.raises(RuntimeError):
        model(predictions, targets.to(torch.float64))


def test_same_seed_gives_identical_weights_and_inputs(tmp_path):
    problem = _by_id(load_kernelbench_folder(_kernelbench(tmp_path) / "level1"))["level1/2_Linear"]
    model_a, inputs_a = problem.instantiate("cpu", seed=7)
    model_b, inputs_b = problem.instantiate("cpu", seed=7)
    model_c, _ = problem.instantiate("cpu", seed=8)
    assert torch.equal(model_a.fc.weight, model_b.fc.weight) and torch.equal(model_a.fc.bias, model_b.fc.bias)
    assert not torch.equal(model_a.fc.weight, model_c.fc.weight)
    assert torch.equal(inputs_a[0], inputs_b[0]) and inputs_a[1] == inputs_b[1] == 2.0
    # Each load is a fresh module: the two models' classes are different objects.
    assert type(model_a) is not type(model_b)


def test_instantiate_does_not_disturb_the_global_rng(tmp_path):
    problem = _by_id(load_kernelbench_folder(_kernelbench(tmp_path) / "level1"))["level1/2_Linear"]
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    problem.instantiate("cpu", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_candidate_built_under_the_same_seed_matches(tmp_path):
    problem = _by_id(load_kernelbench_folder(_kernelbench(tmp_path) / "level1"))["level1/2_Linear"]
    model, inputs = problem.instantiate("cpu", seed=5)
    candidate = problem.instantiate_candidate(LINEAR_CANDIDATE, "cpu", seed=5)
    assert torch.equal(candidate.fc.weight, model.fc.weight)
    torch.testing.assert_close(candidate(inputs[0]), model(inputs[0]))
    other = problem.instantiate_candidate(LINEAR_CANDIDATE, "cpu", seed=6)
    assert not torch.equal(other.fc.weight, model.fc.weight)
    with pytest.raises(ValueError, match="defines no class 'ModelNew'"):
        problem.instantiate_candidate(RELU, "cpu", seed=5)


def test_triton_candidate_loads_from_a_real_file(tmp_path):
    problem = _by_id(load_kernelbench_folder(_kernelbench(tmp_path) / "level1"))["level1/19_ReLU"]
    model, _ = problem.instantiate("cpu", seed=0)
    (x,) = problem.make_inputs(seed=0, fresh=True)  # normal draws: negative values exercise the ReLU
    assert (x < 0).any()
    candidate = problem.instantiate_candidate(TRITON_RELU_CANDIDATE, "cpu", seed=0)
    torch.testing.assert_close(candidate(x), model(x))


def test_make_inputs_original_and_fresh(tmp_path):
    problem = _by_id(load_kernelbench_folder(_kernelbench(tmp_path) / "level1"))["level1/95_CrossEntropyLoss"]
    first = problem.make_inputs(seed=3)
    again = problem.make_inputs(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    predictions, targets = first
    assert predictions.min() >= 0 and predictions.max() < 1  # the file's torch.rand
    fresh_predictions, fresh_targets = problem.make_inputs(seed=3, fresh=True)
    assert fresh_predictions.shape == predictions.shape and fresh_predictions.dtype == predictions.dtype
    assert (fresh_predictions < 0).any() and (fresh_predictions > 1).any()  # standard normal, not uniform [0,1)
    assert fresh_targets.dtype == torch.int64 and fresh_targets.shape == targets.shape
    assert int(fresh_targets.min()) >= int(targets.min()) and int(fresh_targets.max()) <= int(targets.max())
    assert not torch.equal(fresh_predictions, predictions)
    assert all(torch.equal(a, b) for a, b in zip(problem.make_inputs(seed=3, fresh=True),
                                                  (fresh_predictions, fresh_targets), strict=True))


def test_module_state_does_not_leak_between_loads(tmp_path):
    folder = tmp_path / "level1"
    folder.mkdir()
    (folder / "1_Counter.py").write_text(textwrap.dedent('''
        import torch
        import torch.nn as nn
        CALLS = []

        class Model(nn.Module):
            def forward(self, x):
                return x

        def get_inputs():
            CALLS.append(1)
            return [torch.full((1,), float(len(CALLS)))]

        def get_init_inputs():
            return []
    '''))
    (problem,) = load_kernelbench_folder(folder)
    assert problem.make_inputs(seed=0)[0].item() == 1.0
    assert problem.make_inputs(seed=0)[0].item() == 1.0
