"""`run_candidate`: screen a candidate kernel, then run it in a disposable sandboxed child and judge it here.

Flow: screen the source (violations: `forbidden`, a syntax error: `compile_error`; nothing runs). Otherwise write
the source, the samples (CPU copies plus the device to move them to, for the child's timing) and the job into a
fresh folder, and start `python -m agent.sandbox.child <folder> <fd>` in its own session (so the whole process group
can be killed), with stdin closed, stdout/stderr to files, an allow-listed environment (`agent.sandbox.environment`),
resource limits applied by the child (memory, processes, CPU time, file size, open files), inside the bubblewrap
boundary (`agent.sandbox.isolation`: own user, PID, mount and network namespaces, read-only system, private run
folder; killed with its parent; every process in it killed when the child ends). Without the boundary nothing runs
(`SandboxUnavailableError`) unless the user opted out (`allow_unsafe`, `--unsafe-sandbox`, `KFORGE_UNSAFE_SANDBOX=1`).

The verdict is computed in this process (`agent.sandbox.harness.run_session`): the child only imports and runs the
candidate and answers calls over a socketpair created here (`agent.sandbox.wire`); the oracle (`validate`, the
probes, the launch check) runs here on the outputs it sends back. No file of the child's folder is read as a
verdict. A watcher thread owns the wall-clock limit (SIGTERM, then SIGKILL to the group; it then shuts the channel
so the harness stops waiting), the cancel event, `kill_all` and the task limit. When the child is lost before a
verdict, its end is classified (a signal: `crash` with its name; an exit: `crash` with the stderr tail; a reply
the harness refused: `crash`, the child stopped). A segfault or GPU fault ends only the child. `kill_all()` ends
every live child of this process within a few seconds.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agent.languages import get_language
from agent.languages.base import KernelLanguage
from agent.sandbox import protocol
from agent.sandbox.environment import child_environment, looks_secret, sandbox_caches
from agent.sandbox.harness import SessionResult, run_session
from agent.sandbox.isolation import Isolation, IsolationLevel, bwrap_command, resolve_isolation
from agent.sandbox.result import SandboxResult
from agent.screening.violation import Violation
from forge.checking.kernel_utils import KernelUtils
from forge.functional import original_function
from forge.samples import Sample, TensorSpec, clone_value, iter_leaves

__all__ = ["DEFAULT_MEMORY_LIMIT_BYTES", "DEFAULT_PROCESS_LIMIT", "DEFAULT_TIMEOUT_S", "ProcessRegistry", "kill_all",
           "live_process_groups", "run_candidate"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 180.0
# RLIMIT_DATA (heap and private writable mappings; not RLIMIT_AS, whose address-space reservations break CUDA):
# an import of torch + triton + the harness uses about 0.25 GB of it.
DEFAULT_MEMORY_LIMIT_BYTES = 16 << 30
# RLIMIT_NPROC: tasks (processes and threads) per sandbox; counted per user namespace inside the boundary.
DEFAULT_PROCESS_LIMIT = 512
OUTPUT_LIMIT_CHARS = 8192
_POLL_S = 0.05
_TERM_GRACE_S = 1.5
_EXIT_GRACE_S = 5.0  # after the verdict, for the child to exit on its own
_LOST_GRACE_S = 1.0  # after the channel was lost, for a dying child to end by its own signal
_SOCKET_GRACE_S = 30.0  # beyond timeout_s: a backstop; the watcher shuts the channel when it kills the child


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
    function_name: str,
    samples: Sequence[Sample],
    *,
    language: str | KernelLanguage = "triton",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    kernel_utils: Any = None,
    benchmark: bool = True,
    counts: Sequence[int] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    keep: bool = False,
    isolation: str | IsolationLevel = "auto",
    allow_unsafe: bool | None = None,
    cancel_event: threading.Event | None = None,
    cpu_limit_s: float | None = None,
    file_size_limit_bytes: int = 256 << 20,
    open_files_limit: int = 1024,
    memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
    process_limit: int | None = DEFAULT_PROCESS_LIMIT,
    extra_env: Mapping[str, str] | None = None,
    screen: bool = True,
    registry: ProcessRegistry | None = None,
) -> SandboxResult:
    """Screen `source`, then validate (and optionally benchmark) its `kernel_function` in a sandboxed child.

    `samples`: unique `Sample`s of `torch.nn.functional.<function_name>` (tensors, or `TensorSpec`s drawn by the
    oracle), all on one device; CPU samples run Triton under `TRITON_INTERPRET=1`. `kernel_utils`: a
    `forge.checking.KernelUtils` (default settings when None). `benchmark`: also time the candidate and the original
    PyTorch function in the same child on `counts`' GCD distribution (one call per sample when `counts` is None).
    `timeout_s`: wall clock for the child (CPU limit `cpu_limit_s`, default twice that). `workdir`: run folder to use
    and keep (created; must be empty); else a temporary folder, kept when `keep`. `isolation`: `"auto"` (the
    bubblewrap boundary; when unavailable, `SandboxUnavailableError` unless `allow_unsafe` or
    `KFORGE_UNSAFE_SANDBOX=1`, then the best weaker level with one warning), `"boundary"` (never weaker), or an
    explicit unsafe `"network"` / `"none"` (see `agent.sandbox.isolation`). `memory_limit_bytes` (RLIMIT_DATA) and
    `process_limit` (RLIMIT_NPROC, per sandbox inside the boundary) may be None for no limit. `cancel_event`: set it
    to abort the run (the child is killed; status `timeout`, `details["cancelled"]`). `extra_env`: more variables for
    the child (credential-like names are refused).

    `screen=False` skips static screening and runs any code: UNSAFE, for tests and evals of the sandbox only.
    `registry`: a `ProcessRegistry` that tracks this child in addition to the process-wide one (`SandboxPool`).
    """
    started = time.monotonic()
    lang = get_language(language)
    original_function(function_name)  # clear error for a name that is not a replaceable function
    samples = _check_samples(samples, counts)
    device = _device_of(samples, lang)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    for name, limit in (("memory_limit_bytes", memory_limit_bytes), ("process_limit", process_limit)):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"{name} must be None or an int >= 1, got {limit!r}")
    for name in extra_env or {}:
        if looks_secret(name):
            raise ValueError(f"extra_env may not pass {name!r} to a sandbox child: it looks like a credential")
    iso = resolve_isolation(isolation, allow_unsafe=allow_unsafe)  # SandboxUnavailableError: nothing runs

    def finish(status: str, message: str, **fields: Any) -> SandboxResult:
        return SandboxResult(status=status, message=message, isolation=iso.level, isolation_reason=iso.reason,
                             wall_s=time.monotonic() - started, **fields)  # type: ignore[arg-type]

    if screen:
        violations = lang.screen(source, function_name)
        if violations:
            return _screening_result(violations, finish)
    if cancel_event is not None and cancel_event.is_set():
        return finish("timeout", "cancelled before the run started", details={"cancelled": True})

    folder, keep_folder = _make_folder(workdir, keep)
    try:
        source_file = protocol.CANDIDATE_STEM + lang.file_suffix
        (folder / source_file).write_text(source, encoding="utf-8")
        home, tmp = folder / protocol.HOME_DIR, folder / protocol.TMP_DIR
        home.mkdir()
        tmp.mkdir()
        torch.save(
            {
                "samples": [(clone_value(tuple(s.args), device="cpu"), clone_value(dict(s.kwargs), device="cpu"))
                            for s in samples],
                "counts": list(counts) if counts is not None else None,
                "kernel_utils": _timing_settings(kernel_utils),
            },
            folder / protocol.INPUTS_FILE,
        )
        job = {
            "function_name": function_name,
            "language": lang.name,
            "source_file": source_file,
            "device": device,
            "benchmark": bool(benchmark),
            "cpu_limit_s": max(1, int(cpu_limit_s if cpu_limit_s is not None else 2 * timeout_s + 10)),
            "file_size_limit_bytes": int(file_size_limit_bytes),
            "open_files_limit": int(open_files_limit),
            "memory_limit_bytes": memory_limit_bytes,
            "process_limit": process_limit,
            "max_reply_bytes": _reply_limit(samples, memory_limit_bytes),
        }
        protocol.write_json_atomic(folder / protocol.JOB_FILE, job)
        caches = sandbox_caches(lang)  # Triton's first, then the language's own (CUDA builds)
        env = child_environment(home, tmp, language_env=lang.child_environment(torch.device(device).type),
                                extra_env=extra_env, triton_cache=caches[0])
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            argv = _child_argv(iso, folder, caches, child_end.fileno(), gpu=torch.device(device).type == "cuda")
            # Root is exempt from RLIMIT_NPROC (and the boundary's uid maps to root): the parent enforces the limit.
            task_limit = process_limit if iso.safe and os.geteuid() == 0 else None
            process = _start_child(argv, folder, env, child_end.fileno())
            child_end.close()
            parent_end.settimeout(timeout_s + _SOCKET_GRACE_S)
            box: dict[str, _Outcome] = {}
            watcher = threading.Thread(
                target=lambda: box.setdefault("outcome", _run_child(process, timeout_s, cancel_event, registry,
                                                                    task_limit, on_kill=parent_end)),
                name=f"kforge-sandbox-{process.pid}", daemon=True)
            watcher.start()
            try:
                session = run_session(parent_end, reference=original_function(function_name), samples=samples,
                                      utils=kernel_utils or KernelUtils(), device=device, benchmark=benchmark,
                                      max_bytes=job["max_reply_bytes"])
            except BaseException:  # a bug of ours or the user's Ctrl-C: the child goes with it
                _signal_group(process.pid, signal.SIGKILL)
                watcher.join()
                raise
            # After a verdict the child gets a grace to exit on its own; after a lost channel (a crash, or a reply
            # the harness refused) a short one, so a dying child is still classified by its own signal.
            if _end_soon(process, watcher, _EXIT_GRACE_S if session.verdict is not None else _LOST_GRACE_S):
                session.killed = session.verdict is None
            watcher.join()
        finally:
            child_end.close()
            parent_end.close()
        fields = _classify(box["outcome"], folder, timeout_s, session, exit_codes_carry_signals=iso.safe)
        status, message = fields.pop("status"), fields.pop("message")
        source_path = str(folder / source_file) if keep_folder else None
        return finish(status, message, source_path=source_path, **fields)
    finally:
        if not keep_folder:
            shutil.rmtree(folder, ignore_errors=True)


def _child_argv(iso: Isolation, folder: Path, caches: list[Path], channel_fd: int, *, gpu: bool) -> list[str]:
    """`python -m agent.sandbox.child <folder> <fd>`, inside the boundary (or the explicitly accepted weaker level);
    the channel is an inherited descriptor (bubblewrap passes inherited descriptors through)."""
    argv = [sys.executable, "-m", "agent.sandbox.child", str(folder), str(channel_fd)]
    if iso.level is IsolationLevel.BOUNDARY:
        assert iso.tool is not None
        return bwrap_command(iso.tool, argv, folder=folder, writable=caches, gpu=gpu)
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


def _reply_limit(samples: list[Sample], memory_limit_bytes: int | None) -> int:
    """Most bytes of tensors one reply of the child may carry: the child's memory cap, or 64x the largest sample's
    inputs (at least 1 GiB) without one. Bounds what a hostile child can make the harness allocate."""
    if memory_limit_bytes is not None:
        return int(memory_limit_bytes)
    largest = max(sum(t.numel() * t.element_size() for t in iter_leaves((s.args, s.kwargs))
                      if isinstance(t, torch.Tensor)) for s in samples)
    return max(1 << 30, 64 * largest)


def _screening_result(violations: list[Violation], finish: Any) -> SandboxResult:
    listed = [v.to_dict() for v in violations]
    syntax = [v for v in violations if v.kind == "syntax"]
    if syntax:
        return finish("compile_error", syntax[0].message,
                      details={"phase": "screening", "violations": listed, "compile_log": syntax[0].message})
    shown = [f"{v.construct} ({f'line {v.line}' if v.line else 'file'})" for v in violations[:5]]
    more = f" and {len(violations) - 5} more" if len(violations) > 5 else ""
    message = f"refused by screening: {'; '.join(shown)}{more}"
    return finish("forbidden", message, details={"phase": "screening", "violations": listed})


def _check_samples(samples: Sequence[Sample], counts: Sequence[int] | None) -> list[Sample]:
    if isinstance(samples, Sample) or not isinstance(samples, Sequence):
        raise TypeError("samples must be a sequence of forge.samples.Sample")
    out = []
    for i, sample in enumerate(samples):
        if not isinstance(sample, tuple) or len(sample) != 2 or not isinstance(sample[1], dict):
            raise TypeError(f"samples[{i}] must be a forge.samples.Sample (args, kwargs), got {type(sample).__name__}")
        out.append(Sample(tuple(sample[0]), dict(sample[1])))
    if not out:
        raise ValueError("run_candidate needs at least one sample")
    if counts is not None and (len(counts) != len(out) or any(not isinstance(c, int) or c < 1 for c in counts)):
        raise ValueError(f"counts must hold one int >= 1 per sample ({len(out)}), got {list(counts)!r}")
    return out


def _device_of(samples: list[Sample], language: KernelLanguage) -> str:
    devices: set[str] = set()
    for sample in samples:
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
    cancelled: bool = False
    cancel_reason: str = ""
    wall_s: float = 0.0
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


def _start_child(argv: list[str], folder: Path, env: dict[str, str], channel_fd: int) -> subprocess.Popen:
    """Start the child in its own session, stdout/stderr to files in its folder, the channel inherited."""
    with open(folder / protocol.STDOUT_FILE, "wb") as out, open(folder / protocol.STDERR_FILE, "wb") as err:
        return subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True, close_fds=True, pass_fds=(channel_fd,))


def _end_soon(process: subprocess.Popen, watcher: threading.Thread, grace_s: float) -> bool:
    """Give the child `grace_s` to exit on its own, then end its group; whether it had to be killed."""
    watcher.join(grace_s)
    if not watcher.is_alive() or _exited(process.pid):
        return False
    _signal_group(process.pid, signal.SIGKILL)
    return True


def _run_child(
    process: subprocess.Popen,
    timeout_s: float,
    cancel_event: threading.Event | None,
    registry: ProcessRegistry | None,
    task_limit: int | None = None,
    on_kill: socket.socket | None = None,
) -> _Outcome:
    """Watch the child to its end, the timeout or a cancel; `task_limit`: kill it past that many tasks in its PID
    namespace (boundary runs as root, see `_SandboxTasks`). `on_kill`: the channel to shut down when the child is
    killed, so the harness waiting on it stops at once."""
    start = time.monotonic()
    registries = [_ALL_CHILDREN] + ([registry] if registry is not None and registry is not _ALL_CHILDREN else [])
    tracked = [(r, r.add(process)) for r in registries]
    outcome = _Outcome(returncode=None, pid=process.pid)
    tasks = _SandboxTasks(process.pid) if task_limit else None
    next_count = start
    try:
        deadline = start + timeout_s
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
            if time.monotonic() >= deadline:
                outcome.timed_out = True
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
    return outcome


def _terminate(process: subprocess.Popen) -> None:
    """SIGTERM the group, then SIGKILL it if the leader has not ended after a short grace."""
    _signal_group(process.pid, signal.SIGTERM)
    grace_end = time.monotonic() + _TERM_GRACE_S
    while time.monotonic() < grace_end and not _exited(process.pid):
        time.sleep(_POLL_S)
    _signal_group(process.pid, signal.SIGKILL)


def _read_tail(path: Path, limit: int = OUTPUT_LIMIT_CHARS) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if size <= limit else f"[... {size - limit} bytes cut ...]\n{text}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_SIGNAL_HINTS = {
    "SIGXCPU": "CPU time limit exceeded",
    "SIGXFSZ": "file size limit exceeded (too much output?)",
    "SIGSEGV": "segmentation fault",
    "SIGBUS": "bus error",
    "SIGABRT": "aborted",
    "SIGKILL": "killed (CPU hard limit or out of memory)",
    "SIGFPE": "arithmetic fault",
    "SIGILL": "illegal instruction",
}


def _classify(outcome: _Outcome, folder: Path, timeout_s: float, session: SessionResult, *,
              exit_codes_carry_signals: bool = False) -> dict[str, Any]:
    """The status: the harness's verdict when the session produced one, else from how the child ended. bwrap
    reports a child killed by signal N as exit code 128 + N (`exit_codes_carry_signals`)."""
    stdout = _read_tail(folder / protocol.STDOUT_FILE)
    stderr = _read_tail(folder / protocol.STDERR_FILE)
    fields: dict[str, Any] = {"stdout": stdout, "stderr": stderr}
    details: dict[str, Any] = {"pid": outcome.pid, "exit_code": outcome.returncode,
                               "child_wall_s": round(outcome.wall_s, 3)}
    verdict = session.verdict
    if verdict is not None:
        details.update(verdict.get("details") or {})
        return {**fields, "status": verdict["status"], "message": str(verdict["message"]), "details": details,
                "latency_ms": verdict.get("latency_ms"), "baseline_ms": verdict.get("baseline_ms")}
    if session.phase_s:
        details["phase_s"] = session.phase_s
    if outcome.cancelled:
        details.update(cancelled=True, reason=outcome.cancel_reason)
        return {**fields, "status": "timeout", "message": f"run cancelled ({outcome.cancel_reason})",
                "details": details}
    if outcome.task_limit_exceeded:
        details.update(limit="processes", tasks=outcome.task_limit_exceeded)
        return {**fields, "status": "crash", "message": f"killed: {outcome.task_limit_exceeded} processes/threads, "
                "over the sandbox's process limit", "details": details}
    if outcome.timed_out:
        details.update(cancelled=False, timeout_s=timeout_s)
        return {**fields, "status": "timeout", "message": f"no result within {timeout_s:g} s; the child was killed",
                "details": details}
    if session.killed:
        details.update(stderr_tail=stderr[-2000:], result_error=session.lost)
        return {**fields, "status": "crash", "message": f"the sandbox child was stopped: {session.lost}",
                "details": details}
    code = outcome.returncode
    if exit_codes_carry_signals and code is not None and 128 < code < 128 + 65:
        code = -(code - 128)
    if code is not None and code < 0:
        name = _signal_name(-code)
        hint = _SIGNAL_HINTS.get(name, "")
        details.update(signal=name, signal_number=-code, stderr_tail=stderr[-2000:])
        return {**fields, "status": "crash",
                "message": f"child killed by {name}" + (f" ({hint})" if hint else ""), "details": details}
    details.update(stderr_tail=stderr[-2000:], result_error=session.lost or "no verdict")
    return {**fields, "status": "crash", "message": f"child exited with code {code} without a valid result",
            "details": details}
