"""Local scale-out: worker processes that evaluate problems, one per visible GPU by default, replaced when they die.

Each worker is started with the `spawn` method and its environment set before it starts (so before it imports
torch): on CUDA `CUDA_VISIBLE_DEVICES` pins it to one GPU (round-robin over the visible GPUs when there are more
workers than GPUs), on CPU `TRITON_INTERPRET=1` lets Triton kernels run on CPU tensors. The parent hands out one
`WorkItem` (a problem and its pending sample indices) at a time through a private pipe per worker and writes
every record it gets back through `on_record`, so results are saved as they come.

A worker is the isolation boundary for what candidates do in it: when it dies (a segfault, a kill, an exit) the
sample it was on is recorded as `"crash: worker died with signal SIGSEGV"` (or `"... exited with code N"`), the
item's other samples go back to the queue, and a fresh worker takes its place. A CUDA fault may leave the CUDA
context unusable, so after a record whose failure is `cuda_error` the worker exits on purpose and is replaced. With
`timeout_s`, a sample that runs longer is recorded as `timeout` and its worker killed and replaced.

`workers=0` evaluates in the calling process instead (no isolation; for debugging).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evals.failures import Failure
from evals.problems import Problem
from evals.sources.base import EvalSource
from evals.sources.evaluation import failure_record
from forge.checking import KernelUtils
from forge.errors import KernelForgeError

__all__ = [
    "EXIT_CUDA_ERROR",
    "WorkItem",
    "WorkerPlan",
    "WorkerStartupError",
    "group_work",
    "plan_workers",
    "run_in_process",
    "run_workers",
    "visible_gpus",
]

logger = logging.getLogger(__name__)

EXIT_CUDA_ERROR = 86  # exit code of a worker that quit on purpose after a CUDA fault
_POLL_S = 0.25
_JOIN_S = 10.0
_ENV_LOCK = threading.Lock()

RecordSink = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class WorkItem:
    """One problem and the sample indices of it still to evaluate (kept together so that one process generates
    all samples of a problem, in order: cassette replay then serves them their recorded replies in order)."""

    problem: Problem
    sample_indices: tuple[int, ...]


def group_work(pending: Sequence[tuple[Problem, int]]) -> list[WorkItem]:
    """`(problem, sample_index)` pairs -> one `WorkItem` per problem, in first-seen order."""
    order: list[tuple[str, str]] = []
    grouped: dict[tuple[str, str], tuple[Problem, list[int]]] = {}
    for problem, index in pending:
        key = (problem.suite, problem.id)
        if key not in grouped:
            grouped[key] = (problem, [])
            order.append(key)
        grouped[key][1].append(int(index))
    return [WorkItem(grouped[k][0], tuple(grouped[k][1])) for k in order]


# ---------------------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerPlan:
    """Where one worker runs: the device string it evaluates on and the environment it starts with."""

    device: str
    env: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        pin = self.env.get("CUDA_VISIBLE_DEVICES")
        return f"{self.device} (GPU {pin})" if pin is not None else self.device


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as `CUDA_VISIBLE_DEVICES` entries (its own list when set, else indices)."""
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if declared is not None and declared.strip():
        entries = [e.strip() for e in declared.split(",") if e.strip()]
        return entries[:count] if count else []
    return [str(i) for i in range(count)]


def plan_workers(device: str | torch.device, workers: int | None) -> list[WorkerPlan]:
    """One plan per worker: on CUDA one per visible GPU by default (`device="cuda:N"` uses GPU N only), on CPU
    `workers` processes (default 1)."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an int >= 1 (or 0 for in-process evaluation), got {workers!r}")
    target = torch.device(device)
    if target.type == "cuda":
        gpus = visible_gpus()
        if not gpus:
            raise RuntimeError(f"device {device!r} was asked for but no CUDA GPU is visible; use --device cpu")
        if target.index is not None:
            if target.index >= len(gpus):
                raise ValueError(f"device {device!r}: only {len(gpus)} GPU(s) are visible ({', '.join(gpus)})")
            gpus = [gpus[target.index]]
        count = workers if workers is not None else len(gpus)
        # Expandable segments: at KernelBench's shipped sizes 40 GB sat reserved but unusable (fragmentation) when
        # the float64 GroupNorm reference asked for 56 GB on an H200; the user's own setting wins.
        alloc = {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")}
        return [WorkerPlan("cuda:0", {"CUDA_VISIBLE_DEVICES": gpus[k % len(gpus)], **alloc}) for k in range(count)]
    env = {"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")} if target.type == "cpu" else {}
    return [WorkerPlan(str(target), env) for _ in range(workers if workers is not None else 1)]


@contextlib.contextmanager
def _environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """Set variables for the duration of a process start (spawned children copy the environment at start)."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in overrides}
        os.environ.update(overrides)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# ---------------------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------------------
def _worker_main(conn: multiprocessing.connection.Connection, source: EvalSource, device: str,
                 kernel_utils: KernelUtils) -> None:
    """Entry point of a worker process: set up the source, then evaluate items until told to stop (None)."""
    logging.getLogger().setLevel(logging.WARNING)
    try:
        source.setup(torch.device(device), kernel_utils)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which stops the run
        conn.send(("fatal", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=10)}"))
        conn.close()
        return
    conn.send(("ready", os.getpid()))
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        while True:
            try:
                item = conn.recv()
            except EOFError:
                break
            if item is None:
                break
            for index in item.sample_indices:
                conn.send(("start", index))
                record = source.evaluate(item.problem, index, device, kernel_utils)
                record["worker_pid"] = os.getpid()
                if pinned is not None and device.startswith("cuda"):
                    record["worker_gpu"] = pinned
                conn.send(("record", record))
                if record.get("failure") == Failure.DEVICE_FAULT.value:
                    # The CUDA context may be broken for good: leave, the parent starts a fresh worker.
                    conn.close()
                    os._exit(EXIT_CUDA_ERROR)
            conn.send(("idle", None))
    finally:
        source.close()
    conn.close()


# ---------------------------------------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------------------------------------
class WorkerStartupError(KernelForgeError, RuntimeError):
    """A worker could not start (the source's setup failed); the run cannot go on."""


@dataclass
class _Slot:
    number: int
    plan: WorkerPlan
    process: Any
    conn: multiprocessing.connection.Connection
    ready: bool = False
    fatal: str | None = None
    item: WorkItem | None = None
    remaining: list[int] = field(default_factory=list)
    current: int | None = None
    started_at: float = 0.0
    pid: int | None = None


class _Pool:
    def __init__(self, source: EvalSource, plans: list[WorkerPlan], kernel_utils: KernelUtils, on_record: RecordSink,
                 timeout_s: float | None, run_dir: Path | None) -> None:
        self.source = source
        self.plans = plans
        self.kernel_utils = kernel_utils
        self.on_record = on_record
        self.timeout_s = timeout_s
        self.run_dir = run_dir
        self.context = multiprocessing.get_context("spawn")
        self.numbers = itertools.count()
        self.slots: list[_Slot] = []
        self.pending: deque[WorkItem] = deque()

    # -- workers --------------------------------------------------------------------------------------------
    def start(self, plan: WorkerPlan) -> _Slot:
        number = next(self.numbers)
        parent_end, child_end = self.context.Pipe(duplex=True)
        worker_source = self.source.for_worker(number, self.run_dir)
        process = self.context.Process(target=_worker_main, args=(child_end, worker_source, plan.device,
                                                                  self.kernel_utils),
                                       name=f"kforge-eval-worker-{number}", daemon=False)  # may spawn children
        with _environment(plan.env):
            process.start()
        child_end.close()
        slot = _Slot(number, plan, process, parent_end, pid=process.pid)
        self.slots.append(slot)
        logger.info("eval worker %d (pid %d) started on %s", number, process.pid, plan.describe())
        return slot

    def stop_all(self, graceful: bool) -> None:
        for slot in self.slots:
            if graceful:
                with contextlib.suppress(OSError, BrokenPipeError):
                    slot.conn.send(None)
        deadline = time.monotonic() + (_JOIN_S if graceful else 0.0)
        for slot in self.slots:
            slot.process.join(max(deadline - time.monotonic(), 0.0))
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(_JOIN_S)
            slot.conn.close()
        self.slots.clear()

    # -- messages -------------------------------------------------------------------------------------------
    def drain(self, slot: _Slot) -> bool:
        """Handle every message waiting from `slot`; False once its pipe is closed (the worker is gone)."""
        try:
            while slot.conn.poll():
                kind, payload = slot.conn.recv()
                if kind == "ready":
                    slot.ready = True
                elif kind == "fatal":
                    slot.fatal = str(payload)
                elif kind == "start":
                    slot.current = int(payload)
                    if slot.current in slot.remaining:
                        slot.remaining.remove(slot.current)
                    slot.started_at = time.monotonic()
                elif kind == "record":
                    slot.current = None
                    self.on_record(payload)
                elif kind == "idle":
                    slot.item, slot.remaining, slot.current = None, [], None
        except (EOFError, OSError):
            return False
        return True

    def assign(self) -> None:
        for slot in self.slots:
            if slot.ready and slot.item is None and self.pending:
                item = self.pending.popleft()
                slot.item, slot.remaining, slot.current = item, list(item.sample_indices), None
                slot.conn.send(item)

    # -- deaths ---------------------------------------------------------------------------------------------
    def bury(self, slot: _Slot, timed_out: bool = False) -> None:
        """Record what a dead (or killed) worker was doing, requeue the rest of its item, replace it."""
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(_JOIN_S)
        self.drain(slot)
        code = slot.process.exitcode
        self.slots.remove(slot)
        slot.conn.close()
        if not slot.ready:
            detail = slot.fatal or f"it exited with code {code} before it was ready"
            raise WorkerStartupError(f"eval worker on {slot.plan.describe()} could not start "
                                     f"({self.source.name}): {detail}")
        if slot.item is not None:
            problem = slot.item.problem
            if slot.current is not None:
                if timed_out:
                    failure, detail = Failure.TIMEOUT, f"no result within {self.timeout_s:g} s; the worker was killed"
                elif code is not None and code < 0:
                    failure, detail = Failure.CRASH, f"worker died with signal {_signal_name(-code)}"
                else:
                    failure, detail = Failure.CRASH, f"worker exited with code {code}"
                logger.warning("%s sample %d: %s: %s", problem.label(), slot.current, failure.label, detail)
                self.on_record(failure_record(
                    problem, slot.current, self.source.name, failure, detail, device=slot.plan.device,
                    wall_s=time.monotonic() - slot.started_at, worker_pid=slot.pid))
            if slot.remaining:
                self.pending.appendleft(WorkItem(problem, tuple(slot.remaining)))
        elif code not in (0, EXIT_CUDA_ERROR):
            logger.warning("idle eval worker %d exited with code %s", slot.number, code)
        if self.pending:
            self.start(slot.plan)

    # -- main loop ------------------------------------------------------------------------------------------
    def run(self, items: Sequence[WorkItem]) -> None:
        self.pending.extend(items)
        graceful = False
        try:
            for plan in self.plans[: max(1, min(len(self.plans), len(items)))]:
                self.start(plan)
            while self.pending or any(slot.item is not None for slot in self.slots):
                self.assign()
                waitables = [s.conn for s in self.slots] + [s.process.sentinel for s in self.slots]
                multiprocessing.connection.wait(waitables, timeout=_POLL_S)
                for slot in list(self.slots):
                    open_ = self.drain(slot)
                    if not open_ or not slot.process.is_alive():
                        self.bury(slot)
                    elif (self.timeout_s is not None and slot.current is not None
                          and time.monotonic() - slot.started_at > self.timeout_s):
                        self.bury(slot, timed_out=True)
                if not self.slots and self.pending:
                    self.start(self.plans[0])
            graceful = True
        finally:
            self.stop_all(graceful)


def run_workers(items: Sequence[WorkItem], source: EvalSource, *, plans: Sequence[WorkerPlan],
                kernel_utils: KernelUtils, on_record: RecordSink, timeout_s: float | None = None,
                run_dir: Path | None = None) -> None:
    """Evaluate `items` in worker processes started from `plans` (see the module docstring); `on_record` is called
    in this process with each record as it arrives. Raises `WorkerStartupError` when a worker cannot start."""
    if not items:
        return
    if not plans:
        raise ValueError("run_workers needs at least one WorkerPlan")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
    _Pool(source, list(plans), kernel_utils, on_record, timeout_s, run_dir).run(items)


def run_in_process(items: Sequence[WorkItem], source: EvalSource, *, device: str | torch.device,
                   kernel_utils: KernelUtils, on_record: RecordSink, run_dir: Path | None = None) -> None:
    """Evaluate `items` one after another in this process (no isolation: a crashing candidate ends the run)."""
    if not items:
        return
    local = source.for_worker(0, run_dir)
    target = torch.device(device)
    local.setup(target, kernel_utils)
    try:
        for item in items:
            for index in item.sample_indices:
                record = local.evaluate(item.problem, index, target, kernel_utils)
                record["worker_pid"] = os.getpid()
                on_record(record)
    finally:
        local.close()


def _signal_name(number: int) -> str:
    """`11` -> `"SIGSEGV"`."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
