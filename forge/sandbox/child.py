"""Sandbox child: `python -m forge.sandbox.child <run folder> <channel fd>` runs one candidate for the harness.

The child never judges. It applies the resource limits, loads the job (written by the parent, read before any
candidate code runs: a function job's samples, or a module job's trusted problem file, seeds and dtype), imports the
candidate (a kernel file's entry function, or a `ModelNew` class; a failure is a `compile_error`, reported to the
parent), then serves the parent's requests on the inherited socket (`forge.sandbox.wire`) until told to exit:

- `build` (module jobs): construct `ModelNew(*get_init_inputs())` under the parent's seed, exactly as the parent
  builds `Model` (`forge.judging.modules.ModuleSource`); later calls run its forward. A constructor that raises is
  the candidate's compile error. Instance jobs (a live module of a user's model, `InstanceTarget`) build
  `ModelNew(original)` from the pickled instance the parent wrote, and are then served like a function job.
- `call`: run the candidate on the inputs the parent sent, with the parent's run plan (poison the allocator for the
  expected outputs, and when asked run under `PoisonFreshAllocations`); reply with the outputs as data, the input
  storages the call changed, which outputs alias an input of this call, and which output storages the candidate
  still holds from earlier calls (storage tokens), so the parent's oracle sees the same memory identity. A raised
  exception (its `SystemExit` and `KeyboardInterrupt` included) is replied with its classification by the language
  (`compile_error` or `runtime_error`) and the traceback for the fix prompt.
- `benchmark`: time the reference, the candidate, the reference again (`forge.checking.benchmarking.Bracket`, the
  order the optimizer's selection uses) here, on the original function or `Model` on the first seed; only feedback
  for the model, as a kernel controls this process and its clocks.

A limit of the harness reached while serving (memory, a reply's memory file over RLIMIT_FSIZE, descriptors, a reply
over what the parent accepts) is replied as `limit`, naming it (`limit_of`): the parent's verdict is then
`harness_error`, never the candidate's `runtime_error`.

The comparison and the verdict are computed in the parent (`forge.sandbox.harness`), which this process cannot
write to: a kernel that writes a `result.json`, or patches torch or the comparison code here, changes nothing the
parent reads. A signal, a hang or an exit mid-call is classified by the parent from how the process ended.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge.sandbox.protocol import INPUTS_FILE, JOB_FILE, MODULE_NAME, read_json
from forge.text import clip

__all__ = ["apply_limits", "is_device_fault", "main", "serve"]

_TRACEBACK_CHARS = 4000
_LOG_CHARS = 4000
_MESSAGE_CHARS = 300


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _short(text: str, limit: int = _MESSAGE_CHARS) -> str:
    return clip(text, limit)


def apply_limits(job: dict[str, Any]) -> None:
    """CPU seconds, file size, open files, memory (RLIMIT_DATA) and tasks (RLIMIT_NPROC) from the job; no core dumps.
    Never RLIMIT_AS (it breaks CUDA)."""
    import resource

    def cap(kind: int, soft: int, hard: int) -> None:
        _, current_hard = resource.getrlimit(kind)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(kind, (soft, hard))

    cap(resource.RLIMIT_CORE, 0, 0)
    if job.get("cpu_limit_s"):
        cpu = int(job["cpu_limit_s"])
        cap(resource.RLIMIT_CPU, cpu, cpu + 2)
    if job.get("file_size_limit_bytes"):
        size = int(job["file_size_limit_bytes"])
        cap(resource.RLIMIT_FSIZE, size, size)
    if job.get("open_files_limit"):
        files = int(job["open_files_limit"])
        cap(resource.RLIMIT_NOFILE, files, files)
    if job.get("memory_limit_bytes"):  # RLIMIT_DATA: heap and private writable mappings (CUDA's reservations are not)
        memory = int(job["memory_limit_bytes"])
        cap(resource.RLIMIT_DATA, memory, memory)
    if job.get("process_limit"):  # per user namespace inside the boundary; root outside one is exempt
        tasks = int(job["process_limit"])
        cap(resource.RLIMIT_NPROC, tasks, tasks)


def _exception_details(exc: BaseException, tb_text: str | None = None) -> dict[str, Any]:
    text = tb_text if tb_text is not None else "".join(traceback.format_exception(exc))
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": _short(str(exc), 2000),
            "traceback": _tail(text, _TRACEBACK_CHARS)}


_DEVICE_FAULT_TEXT = ("CUDA error", "HIP error", "illegal memory access", "illegal address", "device-side assert",
                      "misaligned address", "unspecified launch failure", "an illegal instruction")


def is_device_fault(exc: BaseException) -> bool:
    """Whether an exception reports a GPU fault (illegal address, device assert...) rather than a Python error."""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ == "AcceleratorError" or any(marker in text for marker in _DEVICE_FAULT_TEXT)


class _Recorder:
    """Wraps the candidate and remembers the first exception it raised (validate turns exceptions into errors)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.exception: BaseException | None = None
        self.traceback = ""
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.fn(*args, **kwargs)
        except BaseException as exc:
            if self.exception is None:
                self.exception = exc
                tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # skip this frame
                self.traceback = "".join(traceback.format_exception(type(exc), exc, tb))
            raise


def _failure(language: Any, exc: BaseException, tb_text: str | None, phase: str, **extra: Any) -> dict[str, Any]:
    """A compile_error or runtime_error verdict for an exception the candidate raised."""
    kind = language.classify_exception(exc)
    details: dict[str, Any] = {"phase": phase, "exception": _exception_details(exc, tb_text), **extra}
    if kind == "compile_error":
        details["compile_log"] = _tail(language.compile_log(exc), _LOG_CHARS)
        message = f"{language.name} compile error: {_short(str(exc))}"
    else:
        message = f"{type(exc).__name__} during {phase}: {_short(str(exc))}"
    return {"status": kind, "message": message, "details": details}


@dataclasses.dataclass
class _Job:
    """What the child loaded before any candidate code ran. Function jobs: the reference function, the samples and
    their counts. Module jobs: the problem file (`ModuleSource`, trusted), its seeds and dtype."""

    kind: str
    language: Any
    device: str
    utils: Any
    max_reply_bytes: int | None
    reference: Callable[..., Any] | None = None
    samples: list[Any] = dataclasses.field(default_factory=list)
    counts: list[int] | None = None
    problem: Any = None
    seeds: list[int] = dataclasses.field(default_factory=list)
    dtype: Any = None
    instance: Any = None  # instance jobs: the original module, ModelNew's constructor argument

    @property
    def builds(self) -> bool:
        """Whether the candidate is a `ModelNew` class the parent asks to `build` before any call."""
        return self.kind in ("module", "instance")

    @property
    def entry_point(self) -> str | None:
        """What the candidate file must define: the language's entry function, or `ModelNew` for modules."""
        return "ModelNew" if self.builds else None


def _load_job(folder: Path, job: dict[str, Any]) -> _Job:
    import torch

    from forge.checking import KernelUtils
    from forge.judging.language import language_from_ref
    from forge.samples import Sample

    device = job["device"]
    if device.startswith("cuda") and torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device))
    inputs = torch.load(folder / INPUTS_FILE, weights_only=False)
    loaded = _Job(job.get("kind", "function"), language_from_ref(job["language_ref"]), device,
                  inputs.get("kernel_utils") or KernelUtils(), job.get("max_reply_bytes"))
    if loaded.kind == "module":
        from forge.judging.modules import ModuleSource

        loaded.problem = ModuleSource(inputs["problem_source"], name=inputs.get("problem_name") or "problem")
        loaded.seeds, loaded.dtype = list(inputs["seeds"]), inputs.get("dtype")
    else:
        if loaded.kind == "instance":  # unpickled before any candidate code runs: the class is the library's
            loaded.instance = inputs["instance"]
            loaded.reference = loaded.instance
        else:
            from forge.functional import original_function

            loaded.reference = original_function(job["function_name"])
        loaded.samples = [Sample(tuple(a), dict(k)).clone(device=device) for a, k in inputs["samples"]]
        loaded.counts = inputs.get("counts")
    return loaded


def limit_of(exc: BaseException) -> Any:
    """The harness limit an exception reports (`forge.judging.verdict.HarnessLimit`), or None: memory (host or
    device) exhausted under the child's limits, a file (a reply's memory file) over RLIMIT_FSIZE, descriptors over
    RLIMIT_NOFILE, a reply over what the harness accepts."""
    import errno

    from forge.judging.verdict import HarnessLimit
    from forge.outcome import is_memory_exhaustion
    from forge.sandbox.wire import ReplyTooLarge

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ReplyTooLarge):
            return HarnessLimit.REPLY_SIZE
        if isinstance(current, OSError) and current.errno == errno.EFBIG:
            return HarnessLimit.FILE_SIZE
        if isinstance(current, OSError) and current.errno in (errno.EMFILE, errno.ENFILE):
            return HarnessLimit.OPEN_FILES
        if is_memory_exhaustion(current):
            return HarnessLimit.DEVICE_MEMORY if is_device_memory(current) else HarnessLimit.MEMORY
        current = current.__cause__ or current.__context__
    return None


def is_device_memory(exc: BaseException) -> bool:
    """Whether a memory exhaustion is the GPU's (torch's `OutOfMemoryError`, Triton's "Triton Error [CUDA]: out of
    memory") rather than the host's."""
    return type(exc).__name__ == "OutOfMemoryError" or "cuda" in str(exc).lower()


def _limit_reply(limit: Any, exc: BaseException, phase: str) -> dict[str, Any]:
    return {"op": "limit", "limit": limit.name, "message": f"{type(exc).__name__} during {phase}: {_short(str(exc))}"}


def _launch_monitor(language: Any) -> Any:
    """`language.launch_monitor()` when the language has one (the run-time launch check), else None."""
    factory = getattr(language, "launch_monitor", None)
    return factory() if callable(factory) else None


def _record_dict(record: Any) -> dict[str, Any] | None:
    """A launch record as JSON data (records are dataclasses or have `to_dict`)."""
    if record is None:
        return None
    if hasattr(record, "to_dict"):
        return record.to_dict()
    if dataclasses.is_dataclass(record):
        return dataclasses.asdict(record)
    return None


class _Server:
    """Serves `call`, `build` (module jobs) and `benchmark` for one imported candidate (see the module docstring).
    For a module job `loaded` is the `ModelNew` class and the calls run the forward of the model `build` made."""

    def __init__(self, job: _Job, loaded: Callable[..., Any], sock: Any, monitor: Any) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        self.job, self.sock = job, sock
        self.loaded = loaded
        self.entry: Callable[..., Any] | None = None if job.builds else loaded
        self.weakref = StorageWeakRef
        self.kept: dict[int, Any] = {}  # token -> weak reference to an output storage sent earlier
        self.held: dict[int, Any] = {}  # input token -> the tensor standing for that parent tensor
        self.next_token = 0
        self.first_failure: dict[str, Any] | None = None
        self.monitor = monitor

    def serve(self) -> None:
        from forge.sandbox import wire

        while True:
            header, fds = wire.recv_message(self.sock)
            op = header.get("op")
            if op == "exit":
                wire._close_all(fds)
                return
            if op == "call":
                reply, out_fds, keep = self.call(header, fds)
            elif op == "build":
                wire._close_all(fds)
                reply, out_fds, keep = self.build(int(header["seed"])), [], None
            elif op == "benchmark":
                wire._close_all(fds)
                reply, out_fds, keep = self.benchmark(), [], None
            else:
                wire._close_all(fds)
                raise RuntimeError(f"unknown request {op!r}")
            try:
                wire.send_message(self.sock, reply, out_fds)
            finally:
                wire._close_all(out_fds)
            del keep, reply  # our references to the outputs go now: what stays alive, the candidate holds

    # -- call -------------------------------------------------------------------------------------------
    def _token(self, storage: Any) -> tuple[int, bool]:
        for token, ref in self.kept.items():
            if not ref.expired() and ref.cdata == storage._cdata:
                return token, True
        token, self.next_token = self.next_token, self.next_token + 1
        self.kept[token] = self.weakref(storage)
        return token, False

    def _dead_tokens(self) -> list[int]:
        dead = [t for t, ref in self.kept.items() if ref.expired()]
        for token in dead:
            del self.kept[token]
        return dead

    def call(self, header: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int], Any]:
        """One candidate call. With a `pattern` (validate's runs): poison the allocator for `metas`, and when
        `dispatch`, run under `PoisonFreshAllocations`. Without one (a plain call, e.g. the probes'): the same
        tensor objects for the same parent tensors, and a thread the call leaves running is an error."""
        import threading

        import torch

        from forge.checking.expectation import call_quietly, synchronize_devices
        from forge.checking.poison import POISON_LARGE, POISON_NAN, PoisonFreshAllocations, poison_allocator
        from forge.samples import Sample
        from forge.sandbox import wire

        if self.entry is None:
            raise RuntimeError("a call before the module was built")
        try:
            specs = header["storages"]
            if len(specs) != len(fds):
                raise RuntimeError("storage count mismatch")
            storages = [wire.read_storage(fd, int(s["nbytes"]), s["device"])
                        for fd, s in zip(fds, specs, strict=True)]
        except BaseException as exc:
            limit = limit_of(exc)
            if limit is None:
                raise
            return _limit_reply(limit, exc, "receiving the inputs"), [], None
        finally:
            wire._close_all(fds)
        for token in header.get("forget") or ():
            self.held.pop(token, None)
        (args, kwargs), leaves = wire.load_inputs(header["inputs"], storages, self.held)
        del storages
        pattern = {p.name: p for p in (POISON_NAN, POISON_LARGE)}.get(header.get("pattern") or "")
        metas = [(tuple(shape), getattr(torch, dtype), torch.device(device))
                 for shape, dtype, device in header.get("metas") or ()]
        inputs = Sample(tuple(args), dict(kwargs))
        before: dict[Any, tuple[int, Any, Any]] = {}  # storage key -> (first leaf, storage, its bytes before)
        for index, leaf in enumerate(leaves):
            storage = leaf.untyped_storage()
            key = wire.storage_key(storage)
            if key is not None and key not in before:
                before[key] = (index, storage, wire.storage_bytes(storage).clone())
        dead = self._dead_tokens()
        if pattern is not None:
            poison_allocator(metas, pattern)
        threads_before = set(threading.enumerate())
        record: Any = None
        try:
            with _watch(self.monitor, (inputs.args, inputs.kwargs)) as record:
                if pattern is not None and header.get("dispatch"):
                    with PoisonFreshAllocations(pattern):
                        output = call_quietly(self.entry, inputs)
                else:
                    output = call_quietly(self.entry, inputs)
                running = [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()]
                synchronize_devices(inputs, output)
            if running and pattern is None:
                raise RuntimeError(f"the call returned while a thread it started was still running "
                                   f"({', '.join(sorted(running))[:200]}): work deferred to a background thread is "
                                   "neither timed nor finished when the caller reads the output")
        except BaseException as exc:  # noqa: BLE001 - the candidate's failure is reported, the server goes on
            limit = limit_of(exc)
            if limit is not None:
                return _limit_reply(limit, exc, "the call"), [], None
            return self._raised(exc, record, dead), [], None
        outbox = wire.Outbox(known={key: ["in", index] for key, (index, _, _) in before.items()},
                             tokens=self._token, max_bytes=self.job.max_reply_bytes)
        try:
            tree = wire.encode_tree(output, outbox)
            changed = [[index, outbox.attach(storage)] for index, storage, old in before.values()
                       if not torch.equal(wire.storage_bytes(storage), old)]
        except BaseException as exc:  # noqa: BLE001 - an output that cannot be sent is the candidate's problem
            outbox.close()
            limit = limit_of(exc)
            if limit is not None:  # the harness's own limits (file size, reply size, memory) while sending
                return _limit_reply(limit, exc, "sending the outputs"), [], None
            return self._raised(exc, record, dead, phase="sending the outputs"), [], None
        reply = {"op": "result", "output": tree, "storages": outbox.storages, "inputs_after": changed,
                 "dead": dead, "launches": _record_dict(record)}
        return reply, outbox.fds, (output, outbox.keep)

    def _raised(self, exc: BaseException, record: Any, dead: list[int], phase: str = "validation"
                ) -> dict[str, Any]:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        tb_text = "".join(traceback.format_exception(type(exc), exc, tb))
        failure = _failure(self.job.language, exc, tb_text, phase)
        if is_device_fault(exc):
            failure = {"status": "runtime_error",
                       "message": f"device fault after the candidate's kernels ran: {_short(str(exc))}",
                       "details": {"phase": phase, "device_fault": True, "exception": _exception_details(exc)}}
        frames = traceback.extract_tb(tb)
        where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
        return {"op": "raised", "type": type(exc).__name__, "message": _short(str(exc), 1000) + where,
                "failure": failure, "dead": dead, "launches": _record_dict(record)}

    # -- build (module jobs) ----------------------------------------------------------------------------
    def _construct(self, seed: int) -> Any:
        from forge.outcome import candidate_code

        with candidate_code():
            if self.job.kind == "instance":
                return self.loaded(self.job.instance)
            return self.job.problem.build(self.loaded, self.job.device, seed, dtype=self.job.dtype)

    def build(self, seed: int) -> dict[str, Any]:
        """`ModelNew(*get_init_inputs())` under `seed` (as the parent builds `Model`); later calls run its forward."""
        self.entry = None
        try:
            self.entry = self._construct(seed)
        except BaseException as exc:  # noqa: BLE001 - the candidate's constructor failed: reported
            limit = limit_of(exc)
            if limit is not None:
                return _limit_reply(limit, exc, "building ModelNew")
            tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
            failure = _failure(self.job.language, exc, "".join(traceback.format_exception(type(exc), exc, tb)),
                               "build")
            failure["status"] = "compile_error"
            failure["message"] = f"building ModelNew raised {type(exc).__name__}: {_short(str(exc))}"
            return {"op": "build_failed", "type": type(exc).__name__, "message": failure["message"],
                    "failure": failure}
        return {"op": "built"}

    def _pass(self) -> tuple[Callable[..., Any], Callable[..., Any], list[Any]]:
        """What one timed pass calls: the candidate, the reference and the samples. Module jobs time one forward of
        `ModelNew` and of `Model` on the first seed's `get_inputs()`, both built here under that seed."""
        from forge.samples import Sample

        job, utils = self.job, self.job.utils
        if job.kind == "module":
            seed = job.seeds[0]
            reference, inputs = job.problem.instantiate(job.device, seed, dtype=job.dtype)
            return self._construct(seed), reference, [Sample(tuple(inputs), {})]
        samples = (utils.benchmark_distribution(list(zip(job.counts, job.samples, strict=True)))
                   if job.counts else job.samples)
        assert self.entry is not None
        return self.entry, job.reference, samples

    # -- benchmark --------------------------------------------------------------------------------------
    def benchmark(self) -> dict[str, Any]:
        from forge.checking.benchmarking import NotCapturableError
        from forge.execution import TimingMode

        job, utils = self.job, self.job.utils
        # Eager (host-inclusive) feedback also gets the kernel's device time, so the prompt can compare device time
        # with the device roofline and host time with the host launch cost (like with like).
        device_benchmark = (dataclasses.replace(utils, timing=TimingMode.DEVICE).benchmark
                            if utils.timing is TimingMode.EAGER and job.device.startswith("cuda") else None)
        try:
            entry, reference, pass_samples = self._pass()
        except BaseException as exc:  # noqa: BLE001 - building ModelNew again failed: the candidate's
            limit = limit_of(exc)
            return _limit_reply(limit, exc, "building for timing") if limit is not None else {
                "op": "benchmark_failed", "failure": _failure(job.language, exc, None, "benchmark")}
        timed = _Recorder(entry)
        details: dict[str, Any] = {}
        baselines = []
        try:
            baselines.append(utils.benchmark(reference, pass_samples))
        except Exception as exc:  # noqa: BLE001 - not the candidate's fault: report, keep the verdict
            details["baseline_error"] = _exception_details(exc)
        try:
            latency = utils.benchmark(timed, pass_samples)
        except NotCapturableError as exc:
            return {"op": "benchmark_failed", "failure": {
                "status": "runtime_error",
                "message": f"not capturable in a CUDA graph (the model runs under CUDA graphs or compile): "
                           f"{_short(str(exc.__cause__ or exc))}",
                "details": {"phase": "benchmark", "not_capturable": True, "exception": _exception_details(exc)}}}
        except BaseException as exc:  # noqa: BLE001
            limit = limit_of(timed.exception or exc)
            if limit is not None:
                return _limit_reply(limit, timed.exception or exc, "benchmark")
            return {"op": "benchmark_failed",
                    "failure": _failure(job.language, timed.exception or exc, timed.traceback or None, "benchmark")}
        if device_benchmark is not None:
            try:
                details["device_latency_ms"] = device_benchmark(timed, pass_samples).to_dict()
            except Exception as exc:  # noqa: BLE001 - device time is extra feedback
                details["device_latency_error"] = _short(f"{type(exc).__name__}: {exc}")
        baseline = None
        if baselines:  # the reference again after the candidate: the better of the two, as the optimizer reads it
            from forge.checking.benchmarking import Bracket

            baseline = Bracket(baselines[0], utils.benchmark(reference, pass_samples)).baseline.to_dict()
        return {"op": "benchmark", "latency_ms": latency.to_dict(), "baseline_ms": baseline, "details": details}


class _watch:  # noqa: N801 - used like a function
    """`monitor.watch()` when there is a launch monitor, else a block that yields None."""

    def __init__(self, monitor: Any, inputs: Any) -> None:
        self.inner = monitor.watch(inputs) if monitor is not None else None

    def __enter__(self) -> Any:
        return self.inner.__enter__() if self.inner is not None else None

    def __exit__(self, *exc: Any) -> Any:
        return self.inner.__exit__(*exc) if self.inner is not None else False


def serve(folder: Path, job: dict[str, Any], sock: Any) -> None:
    """Load, import, report readiness (or the import failure), then serve until `exit`."""
    from forge.sandbox import wire

    phase_s: dict[str, float] = {}
    start = time.perf_counter()
    loaded = _load_job(folder, job)
    phase_s["setup"] = time.perf_counter() - start
    start = time.perf_counter()
    monitor = _launch_monitor(loaded.language)  # before the import: it installs the language's launch hooks
    try:
        entry = loaded.language.load(folder / job["source_file"], MODULE_NAME, loaded.entry_point)
    except BaseException as exc:  # noqa: BLE001 - anything at import is the candidate's compile failure
        limit = limit_of(exc)
        if limit is not None:
            wire.send_message(sock, {**_limit_reply(limit, exc, "the import"), "phase_s": phase_s})
            return
        failure = _failure(loaded.language, exc, None, "import")
        failure["status"] = "compile_error"
        failure["message"] = f"import failed: {type(exc).__name__}: {_short(str(exc))}"
        wire.send_message(sock, {"op": "import_failed", "failure": failure, "phase_s": phase_s})
        return
    phase_s["import"] = time.perf_counter() - start
    wire.send_message(sock, {"op": "ready", "phase_s": phase_s})
    _Server(loaded, entry, sock, monitor).serve()


def main(argv: list[str] | None = None) -> int:
    import os
    import socket

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m forge.sandbox.child <run folder> <channel fd>", file=sys.stderr)
        return 2
    folder = Path(argv[0]).resolve()
    fd = int(argv[1])
    os.set_inheritable(fd, False)  # processes the candidate starts do not get the channel
    sock = socket.socket(fileno=fd)
    job = read_json(folder / JOB_FILE)
    for name in ("HOME", "TMPDIR", "TRITON_CACHE_DIR"):  # in the child's private scratch
        if os.environ.get(name):
            os.makedirs(os.environ[name], exist_ok=True)
    apply_limits(job)
    from forge.sandbox import wire

    try:
        serve(folder, job, sock)
    except wire.PeerGone:
        return 0
    except BaseException as exc:  # noqa: BLE001 - a harness failure is reported, never charged to the candidate
        from forge.outcome import is_memory_exhaustion

        try:
            wire.send_message(sock, {"op": "harness_error",
                                     "message": f"sandbox harness error: {type(exc).__name__}: {_short(str(exc))}",
                                     "details": {"harness_error": _exception_details(exc),
                                                 "out_of_memory": is_memory_exhaustion(exc)}})
        except Exception:  # noqa: BLE001 - the parent is gone: nothing to report to
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
