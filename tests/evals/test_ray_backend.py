"""The Ray backend on a local Ray instance with CPU workers (skipped when Ray is not installed)."""

from __future__ import annotations

import pytest

from evals import load_suite
from evals.runner import EvalOptions, run_eval
from evals.sources import CompileSource
from tests.evals.test_runner import ScriptedSource

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    from evals.ray_backend import _python_path

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": _python_path()}})
    yield ray
    ray.shutdown()


def test_problems_run_as_ray_tasks_and_a_crashed_task_is_recorded(local_ray, tmp_path) -> None:
    problems = [p for p in load_suite("smoke") if p.id in {"smoke.relu", "smoke.silu", "smoke.softmax"}]
    behaviours = {"smoke.silu": "segfault", "smoke.softmax": "wrong"}
    frame = run_eval(problems, ScriptedSource(behaviours), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", backend="ray", quick=True, progress=False, plots=False))
    rows = frame.set_index("problem_id")
    assert bool(rows.loc["smoke.relu", "correct"]), rows.loc["smoke.relu", "failure_reason"]
    assert rows.loc["smoke.silu", "failure_reason"].startswith("crash: ray worker died")
    assert rows.loc["smoke.softmax", "failure_reason"].startswith("incorrect")
    assert frame.attrs["summary"]["overall"]["problems"] == 3
    assert (tmp_path / "run" / "report.md").is_file()


def test_compile_source_through_ray(local_ray, tmp_path) -> None:
    problems = [p for p in load_suite("smoke") if p.id == "smoke.rms_norm"]
    frame = run_eval(problems, CompileSource(), out_dir=tmp_path / "run",
                     options=EvalOptions(device="cpu", backend="ray", quick=True, progress=False, plots=False))
    assert bool(frame.loc[0, "correct"]) and frame.loc[0, "latency_ms"] > 0


def test_missing_ray_gives_the_install_command(monkeypatch) -> None:
    import builtins

    from evals.ray_backend import import_ray

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ImportError, match=r"pip install kernel-forge\[ray\]"):
        import_ray()
