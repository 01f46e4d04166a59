"""`run_candidate`: screen a candidate (a kernel file or a `ModelNew` file), then run it in a disposable sandboxed child
and judge it here.

Flow: screen the source (violations: `forbidden`, a syntax error: `compile_error`; nothing runs). Otherwise write
the source, the target's data (function samples as CPU copies plus the device to move them to; a module problem's
trusted source, seeds and dtype) and the job into a fresh folder, and start
`python -m forge.sandbox.child <folder> <fd>` in its own session (so the whole process group can be killed), with
stdin closed, stdout/stderr to pipes this process drains, an allow-listed environment (`forge.sandbox.environment`),
resource limits sized from the case and applied by the child (`SandboxOptions`: memory, processes, CPU time, file
size, open files), inside the bubblewrap boundary (`forge.sandbox.isolation`: own user, PID, mount and network
namespaces, read-only system and run folder, private bounded scratch; killed with its parent; every process in it
killed when the child ends). Without the boundary nothing runs (`SandboxUnavailableError`) unless the user opted out
(`allow_unsafe`, `--unsafe-sandbox`, `KFORGE_UNSAFE_SANDBOX=1`).

The verdict is computed in this process (`forge.sandbox.harness.run_session`): the child only imports and runs the
candidate and answers calls over a socketpair created here (`forge.sandbox.wire`); the oracle (`validate`, the
probes, the launch check, a module problem's seeds) runs here on the outputs it sends back. No file of the child's
is read as a verdict. A watcher thread owns the time limit (the candidate's time: the child's start-up and import and
the time it holds the turn in calls, so the harness's own work never counts against it; SIGTERM, then SIGKILL to
the group; it then shuts the channel so the harness stops waiting), a backstop on the whole run, the cancel event,
`kill_all` and the task limit. When the child is lost before a verdict, its end is classified (a signal: `crash`
with its name; a limit signal such as SIGXCPU: `harness_error` naming the limit; an exit: `crash` with the stderr
tail; a reply the harness refused: `crash`, the child stopped). A segfault or GPU fault ends only the child.
`kill_all()` ends every live child of this process within a few seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from forge.checking.kernel_utils import KernelUtils
from forge.judging.language import language_ref
from forge.judging.targets import FunctionTarget, ModuleTarget
from forge.judging.verdict import HarnessLimit, Verdict
from forge.outcome import HarnessError
from forge.samples import Sample, TensorSpec, clone_value, iter_leaves, iter_tensors, map_values
from forge.sandbox import protocol
from forge.sandbox.environment import child_environment, scratch_folder
from forge.sandbox.harness import ChildClock, SessionResult, run_session
from forge.sandbox.isolation import Isolation, IsolationLevel, bwrap_command, resolve_isolation
from forge.sandbox.options import SandboxOptions
from forge.text import clip

__all__ = ["OUTPUT_LIMIT_CHARS", "ProcessRegistry", "case_bytes", "kill_all", "live_process_groups", "run_candidate",
           "screen_candidate"]

logger = logging.getLogger(__name__)

OUTPUT_LIMIT_CHARS = 8192
_POLL_S = 0.05
_TERM_GRACE_S = 1.5
_EXIT_GRACE_S = 5.0  # after the verdict, for the child to exit on its own
_LOST_GRACE_S = 1.0  # after the channel was lost, for a dying child to end by its own signal
_SOCKET_GRACE_S = 30.0  # beyond the backstop: the watcher shuts the channel when it kills the child


# ---------------------------------------------------------------------------------------------------------
# Live children
# ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Child:
    process: subprocess.Popen
    cancelled: bool = False


class ProcessRegistry:
    """Live sandbox children (each the leader of its own process group) that `kill_all` can end.

    A child stays registered until its waiting thread has killed the leftovers of its group; it is reaped only
    after that, so a group id is never signalled after the kernel could reuse it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[int, _Child] = {}

    def add(self, process: subprocess.Popen) -> _Child:
        child = _Child(process)
        with self._lock:
            self._children[process.pid] = child
        return child

    def discard(self, child: _Child) -> None:
        """Kill what is left of the child's group and unregister it (the caller reaps it afterwards)."""
        with self._lock:
            _signal_group(child.process.pid, signal.SIGKILL)
            self._children.pop(child.process.pid, None)

    def signal_all(self, sig: int, *, cancel: bool = False) -> int:
        with self._lock:
            for child in self._children.values():
                if cancel:
                    child.cancelled = True
                _signal_group(child.process.pid, sig)
            return len(self._children)

    def process_groups(self) -> list[int]:
        with self._lock:
            return list(self._children)

    def kill_all(self, timeout_s: float = 5.0) -> int:
        """SIGTERM every live child's group, SIGKILL after a short grace; wait until all are reaped.

        Returns how many children were live. The runs waiting on them return status `timeout` with
        `details["cancelled"] = True`.
        """
        count = self.signal_all(signal.SIGTERM, cancel=True)
        if not count:
            return 0
        deadline = time.monotonic() + max(timeout_s, 0.1)
        grace_end = time.monotonic() + min(_TERM_GRACE_S, timeout_s / 2)
        while self.process_groups() and time.monotonic() < grace_end:
            time.sleep(_POLL_S)
        if self.process_groups():
            self.signal_all(signal.SIGKILL, cancel=True)
        while self.process_groups() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return count


_ALL_CHILDREN = ProcessRegistry()


def kill_all(timeout_s: float = 5.0) -> int:
    """Kill every live sandbox child started by this process (e.g. when the generation timeout passes)."""
    return _ALL_CHILDREN.kill_all(timeout_s)


def live_process_groups() -> list[int]:
    """Process-group ids of the live sandbox children of this process."""
    return _ALL_CHILDREN.process_groups()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int) -> bool:
    """Whether the child has ended, without reaping it (its pid, and so its group id, stays reserved)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid != 0


# ---------------------------------------------------------------------------------------------------------
# run_candidate
# ---------------------------------------------------------------------------------------------------------
def run_candidate(
    source: str,
    target: FunctionTarget | ModuleTarget,
    language: Any,
    *,
    options: SandboxOptions | None = None,
    kernel_utils: Any = None,
    benchmark: bool = True,
    cancel_event: threading.Event | None = None,
    registry: ProcessRegistry | None = None,
) -> Verdict:
    """Screen `source`, then judge it in a sandboxed child against `target` (see the module docstring).

    `target`: a `FunctionTarget` (the file's `kernel_function` against `torch.nn.functional.<function>` on its
    samples, all on one device; CPU samples run Triton under `TRITON_INTERPRET=1`) or a `ModuleTarget` (the file's
    `ModelNew` against the problem's `Model` on its seeds). `language`: the candidate's kernel language (a
    `forge.judging.language.CandidateLanguage`, e.g. `agent.languages.get_language("triton")`). `kernel_utils`: a
    `forge.checking.KernelUtils` (default settings when None). `benchmark`: also time the candidate and the reference
    in the child (feedback for the model; function targets on `counts`' GCD distribution). `options`: limits and
    isolation (`SandboxOptions`; its limits are raised to fit the case, `SandboxOptions.sized_for`). `cancel_event`:
    set it to abort the run (the child is killed; status `timeout`, `details["cancelled"]`). `registry`: a
    `ProcessRegistry` that tracks this child besides the process-wide one (`SandboxPool`).
    """
    started = time.monotonic()
    options = options if options is not None else SandboxOptions()
    device = _device_of(target, language)
    iso = resolve_isolation(options.isolation, allow_unsafe=options.allow_unsafe)  # SandboxUnavailableError
    options = options.sized_for(case_bytes(target))

    def finish(status: str, message: str, **fields: Any) -> Verdict:
        return Verdict(status=status, message=message, isolation=iso.level, isolation_reason=iso.reason,
                       wall_s=time.monotonic() - started, **fields)  # type: ignore[arg-type]

    if options.screen:
        violations = screen_candidate(language, source, target)
        if violations:
            return _screening_result(violations, finish)
    if cancel_event is not None and cancel_event.is_set():
        return finish("timeout", "cancelled before the run started", details={"cancelled": True})

    folder, keep_folder = _make_folder(options.workdir, options.keep)
    try:
        source_file = protocol.CANDIDATE_STEM + language.file_suffix
        (folder / source_file).write_text(source, encoding="utf-8")
        _save_inputs(_child_inputs(target, device, kernel_utils), folder / protocol.INPUTS_FILE, target)
        job = {
            "kind": target.kind,
            "function_name": getattr(target, "function", None),
            "language": language.name,
            "language_ref": language_ref(language),
            "source_file": source_file,
            "device": device,
            "benchmark": bool(benchmark),
            "cpu_limit_s": options.cpu_seconds,
            "file_size_limit_bytes": options.file_size_bytes,
            "open_files_limit": int(options.open_files_limit),
            "memory_limit_bytes": options.memory_limit_bytes,
            "process_limit": options.process_limit,
            "max_reply_bytes": options.reply_bytes,
        }
        protocol.write_json_atomic(folder / protocol.JOB_FILE, job)
        scratch = scratch_folder(iso, folder)
        shared = [Path(p) for p in language.shared_caches()]
        env = child_environment(scratch, language_env=language.child_environment(torch.device(device).type, scratch),
                                extra_env=options.extra_env)
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            argv = _child_argv(iso, folder, scratch, shared, child_end.fileno(), options,
                               gpu=torch.device(device).type == "cuda")
            # Root is exempt from RLIMIT_NPROC (and the boundary's uid maps to root): the parent enforces the limit.
            task_limit = options.process_limit if iso.safe and os.geteuid() == 0 else None
            process, output = _start_child(argv, folder, env, child_end.fileno())
            child_end.close()
            clock = ChildClock()
            parent_end.settimeout(options.timeout_s * options.backstop_factor + _SOCKET_GRACE_S)
            box: dict[str, _Outcome] = {}
            watcher = threading.Thread(
                target=lambda: box.setdefault("outcome", _run_child(process, options, clock, cancel_event, registry,
                                                                    task_limit, on_kill=parent_end)),
                name=f"kforge-sandbox-{process.pid}", daemon=True)
            watcher.start()
            try:
                session = run_session(parent_end, target=target, utils=kernel_utils or KernelUtils(), device=device,
                                      benchmark=benchmark, max_bytes=job["max_reply_bytes"], clock=clock)
            except BaseException:  # a bug of ours or the user's Ctrl-C: the child goes with it
                _signal_group(process.pid, signal.SIGKILL)
                watcher.join()
                raise
            # After a verdict the child gets a grace to exit on its own; after a lost channel (a crash, or a reply
            # the harness refused) a short one, so a dying child is still classified by its own signal.
            if _end_soon(process, watcher, _EXIT_GRACE_S if session.verdict is not None else _LOST_GRACE_S):
                session.killed = session.verdict is None
            watcher.join()
            output.join()
            if keep_folder:  # the kept folder holds what the child printed (the tails)
                for name, file in (("stdout", protocol.STDOUT_FILE), ("stderr", protocol.STDERR_FILE)):
                    (folder / file).write_text(output.text(name), encoding="utf-8")
        finally:
            child_end.close()
            parent_end.close()
        fields = _classify(box["outcome"], output, options, session, exit_codes_carry_signals=iso.safe)
        status, message = fields.pop("status"), fields.pop("message")
        source_path = str(folder / source_file) if keep_folder else None
        return finish(status, message, source_path=source_path, **fields)
    finally:
        if not keep_folder:
            shutil.rmtree(folder, ignore_errors=True)


def screen_candidate(language: Any, source: str, target: FunctionTarget | ModuleTarget) -> list[Any]:
    """The language's static screen for this kind of candidate (a kernel file or a `ModelNew` file)."""
    if target.kind == "instance":  # a ModelNew for a live instance may read its submodules' and settings' names
        from forge.modules import attribute_names

        return list(language.screen_module(source, attribute_names(target.module)))
    if target.kind == "module":
        return list(language.screen_module(source))
    return list(language.screen(source, target.function))


def case_bytes(target: FunctionTarget | ModuleTarget) -> int:
    """Bytes the largest call of the case moves: its inputs plus its expected outputs (computed on meta tensors;
    estimated as the inputs again where the reference cannot run on meta)."""
    if target.kind == "module":
        return _module_case_bytes(target)
    largest = 0
    for sample in target.samples:
        inputs = sum(_leaf_bytes(v) for v in iter_leaves((sample.args, sample.kwargs)))
        largest = max(largest, inputs + _meta_output_bytes(target.reference_fn, sample, fallback=inputs))
    return largest


def _leaf_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, TensorSpec):
        return value.nbytes
    return 0


def _meta_output_bytes(fn: Any, sample: Sample, *, fallback: int) -> int:
    def meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if isinstance(value, TensorSpec):
            return torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device="meta")
        return value

    try:
        with torch.no_grad():
            out = fn(*map_values(tuple(sample.args), meta), **map_values(dict(sample.kwargs), meta))
    except Exception:  # noqa: BLE001 - not every reference runs on meta tensors: estimate
        return fallback
    return sum(t.numel() * t.element_size() for t in iter_tensors(out))


def _module_case_bytes(target: ModuleTarget) -> int:
    try:
        with torch.device("meta"):
            model, inputs = target.source.instantiate("meta", target.seeds[0], dtype=target.dtype)
            with torch.no_grad():
                out = model(*inputs)
    except Exception:  # noqa: BLE001 - the problem does not build on meta: size from nothing, keep the defaults
        return 0
    moved = sum(t.numel() * t.element_size() for t in iter_tensors((inputs, out)))
    params = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return moved + params


def _child_inputs(target: FunctionTarget | ModuleTarget, device: str, kernel_utils: Any) -> dict[str, Any]:
    """What the child loads before any candidate code runs (trusted data, written by this process)."""
    settings = _timing_settings(kernel_utils)
    if target.kind == "module":
        return {"problem_source": target.source.source, "problem_name": target.source.name,
                "seeds": list(target.seeds), "dtype": target.dtype, "kernel_utils": settings}
    inputs = {"samples": [(clone_value(tuple(s.args), device="cpu"), clone_value(dict(s.kwargs), device="cpu"))
                          for s in target.samples],
              "counts": list(target.counts) if target.counts is not None else None, "kernel_utils": settings}
    if target.kind == "instance":  # the original instance, for ModelNew(original); torch.save pickles it
        inputs["instance"] = target.module
    return inputs


def _save_inputs(inputs: dict[str, Any], path: Path, target: FunctionTarget | ModuleTarget) -> None:
    """`torch.save` of what the child loads; an instance that cannot be pickled is the harness's limit, named."""
    try:
        torch.save(inputs, path)
    except Exception as exc:  # noqa: BLE001 - e.g. a module holding a lock, a lambda or a class in __main__
        if target.kind != "instance":
            raise
        raise HarnessError(f"cannot send {target.function} to the sandbox child: torch.save of the instance failed "
                           f"({type(exc).__name__}: {clip(str(exc), 200)}); its class must be importable by name and "
                           "its attributes picklable") from exc


def _child_argv(iso: Isolation, folder: Path, scratch: Path, shared: list[Path], channel_fd: int,
                options: SandboxOptions, *, gpu: bool) -> list[str]:
    """`python -m forge.sandbox.child <folder> <fd>`, inside the boundary (or the explicitly accepted weaker level);
    the channel is an inherited descriptor (bubblewrap passes inherited descriptors through)."""
    argv = [sys.executable, "-m", "forge.sandbox.child", str(folder), str(channel_fd)]
    if iso.level is IsolationLevel.BOUNDARY:
        assert iso.tool is not None
        return bwrap_command(iso.tool, argv, folder=folder, scratch=scratch, scratch_bytes=options.scratch_bytes,
                             readonly=shared, gpu=gpu)
    if iso.level is IsolationLevel.NETWORK:
        return [*iso.prefix, *argv]
    return argv


def _timing_settings(kernel_utils: Any) -> KernelUtils | None:
    """The settings the child needs for its timing feedback, as a plain `KernelUtils`: a subclass (the caller's own
    checks, which run here) may live in a module the boundary does not show the child."""
    if kernel_utils is None:
        return None
    names = [f.name for f in dataclasses.fields(KernelUtils)]
    return KernelUtils(**{name: getattr(kernel_utils, name) for name in names})


def _screening_result(violations: list[Any], finish: Any) -> Verdict:
    listed = [v.to_dict() for v in violations]
    syntax = [v for v in violations if v.kind == "syntax"]
    if syntax:
        return finish("compile_error", syntax[0].message,
                      details={"phase": "screening", "violations": listed, "compile_log": syntax[0].message})
    shown = [f"{v.construct} ({f'line {v.line}' if v.line else 'file'})" for v in violations[:5]]
    more = f" and {len(violations) - 5} more" if len(violations) > 5 else ""
    message = f"refused by screening: {'; '.join(shown)}{more}"
    return finish("forbidden", message, details={"phase": "screening", "violations": listed})


def _device_of(target: FunctionTarget | ModuleTarget, language: Any) -> str:
    if target.kind == "module":
        device = target.device
    else:
        devices: set[str] = set()
        for sample in target.samples:
            for value in iter_leaves((sample.args, sample.kwargs)):
                if isinstance(value, torch.Tensor):
                    devices.add(str(value.device))
                elif isinstance(value, TensorSpec):
                    devices.add(str(torch.device(value.device)))
        if len(devices) > 1:
            raise ValueError(f"samples live on several devices ({', '.join(sorted(devices))}); use one device per run")
        device = devices.pop() if devices else "cpu"
    if torch.device(device).type not in language.device_types():
        raise ValueError(f"{language.name} kernels cannot run on {device}; supported device types: "
                         f"{', '.join(language.device_types())}")
    return device


def _make_folder(workdir: str | os.PathLike[str] | None, keep: bool) -> tuple[Path, bool]:
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="kforge-sandbox-")), keep
    folder = Path(workdir)
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"sandbox workdir {folder} is not empty; pass a new or empty folder per run")
    folder.mkdir(parents=True, exist_ok=True)
    return folder, True


# ---------------------------------------------------------------------------------------------------------
# The child process
# ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Outcome:
    returncode: int | None
    pid: int = 0
    timed_out: bool = False
    backstop: bool = False  # the whole run outlived the backstop while the harness held the turn
    cancelled: bool = False
    cancel_reason: str = ""
    wall_s: float = 0.0
    child_s: float = 0.0
    task_limit_exceeded: int = 0  # tasks counted when the process limit was enforced by the parent (0: never)


class _SandboxTasks:
    """Counts the tasks (processes and threads) in a boundary child's PID namespace.

    The process limit where RLIMIT_NPROC does not apply: the kernel exempts uid 0 from it, and when kforge runs as
    root the boundary's uid maps to root. One scan of /proc costs about 1 ms for 100 processes; it runs every
    `_TASK_POLL_S`, so a fork bomb is stopped within about that time.
    """

    def __init__(self, leader_pid: int) -> None:
        self.leader = leader_pid
        self.own_ns = os.readlink("/proc/self/ns/pid")
        self.ns: str | None = None

    def _find_namespace(self) -> str | None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
                if ppid == self.leader:
                    ns = os.readlink(f"/proc/{entry.name}/ns/pid")
                    if ns != self.own_ns:
                        return ns
            except (OSError, ValueError, IndexError):
                continue
        return None

    def count(self) -> int:
        if self.ns is None:
            self.ns = self._find_namespace()
            if self.ns is None:
                return 0
        total = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == self.ns:
                    total += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
        return total


_TASK_POLL_S = 0.1


class _OutputTails:
    """The child's stdout and stderr are pipes drained here: only the last `OUTPUT_LIMIT_CHARS` bytes of each are
    kept, so a child that prints without end fills neither the disk nor this process's memory."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.tails = {"stdout": bytearray(), "stderr": bytearray()}
        self.cut = {"stdout": 0, "stderr": 0}
        self.threads = [threading.Thread(target=self._drain, args=(name, getattr(process, name)), daemon=True,
                                         name=f"kforge-sandbox-{name}") for name in self.tails]
        for thread in self.threads:
            thread.start()

    def _drain(self, name: str, stream: Any) -> None:
        tail = self.tails[name]
        try:
            while chunk := stream.read1(1 << 16):
                tail += chunk
                if len(tail) > 2 * OUTPUT_LIMIT_CHARS:
                    self.cut[name] += len(tail) - OUTPUT_LIMIT_CHARS
                    del tail[:-OUTPUT_LIMIT_CHARS]
        except (OSError, ValueError):
            pass
        finally:
            stream.close()

    def join(self, timeout_s: float = 5.0) -> None:
        for thread in self.threads:
            thread.join(timeout_s)

    def text(self, name: str) -> str:
        data = bytes(self.tails[name])
        cut = self.cut[name] + max(0, len(data) - OUTPUT_LIMIT_CHARS)
        text = data[-OUTPUT_LIMIT_CHARS:].decode("utf-8", errors="replace")
        return f"[... {cut} bytes cut ...]\n{text}" if cut else text


def _start_child(argv: list[str], folder: Path, env: dict[str, str], channel_fd: int
                 ) -> tuple[subprocess.Popen, _OutputTails]:
    """Start the child in its own session, stdout/stderr to pipes drained by `_OutputTails`, the channel inherited."""
    process = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True, close_fds=True, pass_fds=(channel_fd,))
    return process, _OutputTails(process)


def _end_soon(process: subprocess.Popen, watcher: threading.Thread, grace_s: float) -> bool:
    """Give the child `grace_s` to exit on its own, then end its group; whether it had to be killed."""
    watcher.join(grace_s)
    if not watcher.is_alive() or _exited(process.pid):
        return False
    _signal_group(process.pid, signal.SIGKILL)
    return True


def _run_child(
    process: subprocess.Popen,
    options: SandboxOptions,
    clock: ChildClock,
    cancel_event: threading.Event | None,
    registry: ProcessRegistry | None,
    task_limit: int | None = None,
    on_kill: socket.socket | None = None,
) -> _Outcome:
    """Watch the child to its end, its time limit (the time it held the turn, `clock`), the backstop on the whole
    run, or a cancel; `task_limit`: kill it past that many tasks in its PID namespace (boundary runs as root, see
    `_SandboxTasks`). `on_kill`: the channel to shut down when the child is killed, so the harness waiting on it
    stops at once."""
    start = time.monotonic()
    registries = [_ALL_CHILDREN] + ([registry] if registry is not None and registry is not _ALL_CHILDREN else [])
    tracked = [(r, r.add(process)) for r in registries]
    outcome = _Outcome(returncode=None, pid=process.pid)
    tasks = _SandboxTasks(process.pid) if task_limit else None
    next_count = start
    backstop = start + options.timeout_s * options.backstop_factor
    try:
        while not _exited(process.pid):
            if tasks is not None and time.monotonic() >= next_count:
                next_count = time.monotonic() + _TASK_POLL_S
                counted = tasks.count()
                if counted > task_limit:  # type: ignore[operator]
                    outcome.task_limit_exceeded = counted
                    break
            if any(c.cancelled for _, c in tracked):
                outcome.cancelled, outcome.cancel_reason = True, "killed by kill_all"
                break
            if cancel_event is not None and cancel_event.is_set():
                outcome.cancelled, outcome.cancel_reason = True, "cancel_event was set"
                break
            if clock.used() >= options.timeout_s:
                outcome.timed_out = True
                break
            if time.monotonic() >= backstop:
                outcome.backstop = True
                break
            if cancel_event is not None:
                cancel_event.wait(_POLL_S)
            else:
                time.sleep(_POLL_S)
        if not _exited(process.pid):
            _terminate(process)
        if any(c.cancelled for _, c in tracked) and not outcome.timed_out:
            outcome.cancelled = True
            outcome.cancel_reason = outcome.cancel_reason or "killed by kill_all"
    finally:
        for owner, child in tracked:
            owner.discard(child)
        if on_kill is not None:
            try:
                on_kill.shutdown(socket.SHUT_RDWR)  # the harness stops waiting on a child that is gone
            except OSError:
                pass
        process.wait()  # reap only after every registry let go: the group id stays reserved until here
    outcome.returncode = process.returncode
    outcome.wall_s = time.monotonic() - start
    outcome.child_s = clock.used()
    return outcome


def _terminate(process: subprocess.Popen) -> None:
    """SIGTERM the group, then SIGKILL it if the leader has not ended after a short grace."""
    _signal_group(process.pid, signal.SIGTERM)
    grace_end = time.monotonic() + _TERM_GRACE_S
    while time.monotonic() < grace_end and not _exited(process.pid):
        time.sleep(_POLL_S)
    _signal_group(process.pid, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_SIGNAL_HINTS = {
    "SIGSEGV": "segmentation fault",
    "SIGBUS": "bus error",
    "SIGABRT": "aborted",
    "SIGKILL": "killed (out of memory?)",
    "SIGFPE": "arithmetic fault",
    "SIGILL": "illegal instruction",
}
# Signals that mean a resource limit of the harness was reached, not a fault of the candidate.
_LIMIT_SIGNALS = {"SIGXCPU": HarnessLimit.CPU_TIME, "SIGXFSZ": HarnessLimit.FILE_SIZE}


def _classify(outcome: _Outcome, output: _OutputTails, options: SandboxOptions, session: SessionResult, *,
              exit_codes_carry_signals: bool = False) -> dict[str, Any]:
    """The status: the harness's verdict when the session produced one, else from how the child ended. bwrap
    reports a child killed by signal N as exit code 128 + N (`exit_codes_carry_signals`). A harness limit reached
    (CPU time, file size, the process limit, the backstop) is `harness_error` naming it (`limit`)."""
    stdout, stderr = output.text("stdout"), output.text("stderr")
    fields: dict[str, Any] = {"stdout": stdout, "stderr": stderr}
    details: dict[str, Any] = {"pid": outcome.pid, "exit_code": outcome.returncode,
                               "child_wall_s": round(outcome.wall_s, 3), "child_s": round(outcome.child_s, 3)}
    verdict = session.verdict
    if verdict is not None:
        details.update(verdict.get("details") or {})
        return {**fields, "status": verdict["status"], "message": str(verdict["message"]), "details": details,
                "latency_ms": verdict.get("latency_ms"), "baseline_ms": verdict.get("baseline_ms"),
                "limit": verdict.get("limit")}
    if session.phase_s:
        details["phase_s"] = session.phase_s
    if outcome.cancelled:
        details.update(cancelled=True, reason=outcome.cancel_reason)
        return {**fields, "status": "timeout", "message": f"run cancelled ({outcome.cancel_reason})",
                "details": details}
    if outcome.task_limit_exceeded:
        details.update(tasks=outcome.task_limit_exceeded)
        return _limit_fields(fields, details, HarnessLimit.PROCESSES,
                             f"{outcome.task_limit_exceeded} processes/threads, over the sandbox's process limit "
                             f"({options.process_limit})")
    if outcome.timed_out:
        details.update(cancelled=False, timeout_s=options.timeout_s)
        return {**fields, "status": "timeout", "message": f"no result within {options.timeout_s:g} s of the "
                "candidate's time; the child was killed", "details": details}
    if outcome.backstop:
        details.update(backstop_s=options.timeout_s * options.backstop_factor)
        return {**fields, "status": "harness_error", "limit": None, "details": details,
                "message": f"harness error: the run took over {options.timeout_s * options.backstop_factor:g} s in "
                           "all while the harness held the turn; the child was stopped"}
    if session.killed:
        details.update(stderr_tail=stderr[-2000:], result_error=session.lost)
        return {**fields, "status": "crash", "message": f"the sandbox child was stopped: {session.lost}",
                "details": details}
    code = outcome.returncode
    if exit_codes_carry_signals and code is not None and 128 < code < 128 + 65:
        code = -(code - 128)
    if code is not None and code < 0:
        name = _signal_name(-code)
        details.update(signal=name, signal_number=-code, stderr_tail=stderr[-2000:])
        if name in _LIMIT_SIGNALS:
            return _limit_fields(fields, details, _LIMIT_SIGNALS[name], f"the child was killed by {name}")
        hint = _SIGNAL_HINTS.get(name, "")
        return {**fields, "status": "crash",
                "message": f"child killed by {name}" + (f" ({hint})" if hint else ""), "details": details}
    details.update(stderr_tail=stderr[-2000:], result_error=session.lost or "no verdict")
    return {**fields, "status": "crash", "message": f"child exited with code {code} without a valid result",
            "details": details}


def _limit_fields(fields: dict[str, Any], details: dict[str, Any], limit: HarnessLimit, what: str) -> dict[str, Any]:
    details.update(phase=details.get("phase", "run"), harness_limit=limit.value)
    return {**fields, "status": "harness_error", "limit": limit, "details": details,
            "message": f"harness error: the sandbox's {limit.value} limit was reached ({what}); not the candidate's "
                       "fault"}
