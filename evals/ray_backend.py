"""Ray backend for clusters: every problem is a Ray task that asks for one GPU (one CPU when there are none).

`run_ray` joins the cluster at `address` (or `RAY_ADDRESS`), else starts a local Ray instance for the run and
stops it afterwards. Each task gets a fresh copy of the source (`EvalSource.for_worker`, numbered per task),
runs `setup`, evaluates every pending sample of its problem in order and returns the records; the driver writes
them as tasks finish. GPU tasks run with `max_calls=1`, so every GPU task gets a fresh worker process (a CUDA fault
cannot leak into the next problem). A task whose worker dies is recorded as a crash for its samples; tasks are
not retried. Ray is imported lazily: install it with `pip install kernel-forge[ray]`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from evals.failures import Failure
from evals.sources.base import EvalSource
from evals.sources.evaluation import failure_record
from evals.workers import RecordSink, WorkItem
from forge.checking import KernelUtils

__all__ = ["import_ray", "run_ray"]

logger = logging.getLogger(__name__)


def import_ray() -> Any:
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("the Ray backend needs Ray: pip install kernel-forge[ray] (or pip install 'ray>=2.9')") \
            from exc
    return ray


def _evaluate_item(source: EvalSource, item: WorkItem, device: str, kernel_utils: KernelUtils) -> list[dict]:
    """Body of one Ray task: evaluate every pending sample of one problem."""
    if device.startswith("cpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    target = torch.device(device)
    source.setup(target, kernel_utils)
    records = []
    try:
        for index in item.sample_indices:
            record = source.evaluate(item.problem, index, target, kernel_utils)
            record["worker_pid"] = os.getpid()
            record["ray_node"] = os.environ.get("RAY_NODE_ID") or None
            records.append(record)
    finally:
        source.close()
    return records


def _python_path() -> str:
    """PYTHONPATH for local Ray workers: this process's import path, so `evals` and the caller's modules import."""
    here = str(Path(__file__).resolve().parent.parent)
    entries = [here, *[p for p in sys.path if p and Path(p).is_dir()]]
    seen: list[str] = []
    for entry in entries:
        if entry not in seen:
            seen.append(entry)
    return os.pathsep.join(seen)


def run_ray(items: Sequence[WorkItem], source: EvalSource, *, device: torch.device | str,
            kernel_utils: KernelUtils, on_record: RecordSink, run_dir: Path | None = None,
            address: str | None = None, num_cpus: int | None = None) -> None:
    """Evaluate `items` as Ray tasks (see the module docstring); `on_record` gets each record in this process."""
    ray = import_ray()
    if not items:
        return
    target = torch.device(device)
    use_gpu = target.type == "cuda"
    started_here = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is None:
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": _python_path()}}
            if num_cpus is not None:
                options["num_cpus"] = num_cpus
        ray.init(address=address, **options)
        started_here = True
    try:
        if use_gpu:
            remote = ray.remote(num_gpus=1, num_cpus=1, max_calls=1, max_retries=0)(_evaluate_item)
            task_device = "cuda:0"  # Ray sets CUDA_VISIBLE_DEVICES to the task's GPU
        else:
            remote = ray.remote(num_cpus=1, max_retries=0)(_evaluate_item)
            task_device = str(target)
        refs: dict[Any, WorkItem] = {}
        for number, item in enumerate(items):
            ref = remote.remote(source.for_worker(number, run_dir), item, task_device, kernel_utils)
            refs[ref] = item
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            for ref in done:
                item = refs[ref]
                try:
                    records = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a dead worker or a failed task
                    failure, detail = _task_failure(exc)
                    logger.warning("%s: %s: %s", item.problem.label(), failure.label, detail)
                    records = [failure_record(item.problem, index, source.name, failure, detail, device=task_device)
                               for index in item.sample_indices]
                for record in records:
                    on_record(record)
    finally:
        if started_here:
            ray.shutdown()


def _task_failure(exc: BaseException) -> tuple[Failure, str]:
    """A failed Ray task: a crash when Ray says its worker died (Ray's own exception types and text), else ours."""
    name = type(exc).__name__
    text = " ".join(str(exc).split())[:400]
    if "WorkerCrashed" in name or "died" in text.lower() or "ActorDied" in name:
        return Failure.CRASH, f"ray worker died ({name}: {text})"
    return Failure.HARNESS_ERROR, f"ray task failed ({name}: {text})"
