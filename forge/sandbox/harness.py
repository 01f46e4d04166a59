"""The harness side of a sandbox run: the oracle runs here, the candidate in the child.

`run_session` drives one child over its channel (`forge.sandbox.wire`): it waits for the import, runs the harness's
`validate` (the caller's `KernelUtils`, unchanged) with a `SandboxCandidate` proxy, asks the child for its timing
feedback, and composes the verdict. Nothing the child sends is executed or unpickled here, and the child cannot
write to this process, so a kernel that patches `torch.Tensor.any` or `forge.checking.compare` in its own process, or
writes its own `result.json`, changes nothing this verdict reads.

`SandboxCandidate` satisfies `forge.checking.remote.RemoteCandidate`: each of validate's runs is sent with its run
plan (the poison pattern, the dispatch mode and the expected outputs, so the child poisons its own allocator), and
its outputs come back as tensors in this process with the child's storage identity mirrored: an output on an input
storage of the call is a view of the harness's own input tensor; an output storage that the candidate still holds
from an earlier call (the child reports it by token) is the same mirror storage here, kept alive exactly as long as
the child reports it alive. So validate's alias and reused-output checks keep working. Inputs the call changed come
back too and are copied into the harness's input tensors.

Timings measured in the child are feedback for the model only (`details["timing_source"]`): a kernel controls its
own process and its clocks. The optimizer re-times winners in the main process.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.checking.poison import PoisonPattern
from forge.errors import CandidateError, KernelForgeError
from forge.judging.verdict import HarnessLimit
from forge.outcome import HarnessError, Outcome, is_memory_exhaustion, issue_of
from forge.samples import Sample
from forge.sandbox import wire
from forge.text import clip

__all__ = ["ChildClock", "SandboxCandidate", "SandboxChildLost", "SandboxLimitReached", "SessionResult", "run_session"]

logger = logging.getLogger(__name__)

TIMING_SOURCE = "sandbox child (feedback only)"
_MISMATCH_ROWS = 8
_MESSAGE_CHARS = 300
_FAILURE_STATUSES = {Outcome.COMPILE_ERROR.value, Outcome.RUNTIME_ERROR.value}


class ChildClock:
    """The time the child holds the turn: its start-up and import, and each call from the request sent to the reply
    received. The sandbox's time limit applies to this, so the harness's own work (a float64 reference, the
    comparisons, the probes' bookkeeping) never counts against the candidate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used = 0.0
        self._since: float | None = time.monotonic()  # the child's turn from its start

    def child_turn(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()

    def harness_turn(self) -> None:
        with self._lock:
            if self._since is not None:
                self._used += time.monotonic() - self._since
                self._since = None

    def used(self) -> float:
        with self._lock:
            running = time.monotonic() - self._since if self._since is not None else 0.0
            return self._used + running


class SandboxChildLost(KernelForgeError):  # noqa: N818 - an event, reported as such
    """The child ended, stopped answering or broke the protocol; the run is classified from how it ended."""

    outcome = "crash"


class SandboxLimitReached(KernelForgeError):  # noqa: N818 - an event, reported as such
    """The child reached a limit of the harness (`HarnessLimit`): the run ends as `harness_error`, no verdict."""

    outcome = "harness_error"

    def __init__(self, limit: HarnessLimit, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class CandidateRaised(CandidateError):  # noqa: N818
    """The candidate raised in the child (subclassed per type name, so the oracle's issue names the real type)."""


_RAISED_TYPES: dict[str, type[CandidateRaised]] = {}


def _raised_type(name: Any) -> type[CandidateRaised]:
    name = name if isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) else "Exception"
    if name not in _RAISED_TYPES:
        _RAISED_TYPES[name] = type(name, (CandidateRaised,), {"__module__": "sandbox"})
    return _RAISED_TYPES[name]


def _short(text: Any, limit: int = _MESSAGE_CHARS) -> str:
    return clip(text, limit)


def _plain_failure(failure: Any, phase: str) -> dict[str, Any]:
    """A failure verdict from the child, as data with the fields we use; it can only ever blame the candidate."""
    if not isinstance(failure, dict):
        failure = {}
    status = failure.get("status") if failure.get("status") in _FAILURE_STATUSES else Outcome.RUNTIME_ERROR.value
    details = failure.get("details") if isinstance(failure.get("details"), dict) else {}
    return {"status": status, "message": _short(failure.get("message") or f"the candidate failed during {phase}"),
            "details": {**details, "phase": phase if "phase" not in details else details["phase"]}}


class SandboxCandidate:
    """A `RemoteCandidate` whose calls run in the sandbox child (see the module docstring)."""

    allows_dispatch_poisoning = True

    def __init__(self, sock: socket.socket, device: str, max_bytes: int | None,
                 clock: ChildClock | None = None) -> None:
        self.sock = sock
        self.devices = {"cpu", str(torch.device(device))}
        self.max_bytes = max_bytes
        self.clock = clock if clock is not None else ChildClock()
        self.mirrors: dict[int, torch.UntypedStorage] = {}
        self.first_failure: dict[str, Any] | None = None
        self.lost: str | None = None
        self.limit: tuple[HarnessLimit, str] | None = None  # a harness limit the child reached: no verdict
        self.scaled: Any = None  # a module check that stopped after its first seed (`ScaledCheck`)
        self.launch_records: list[Any] = []  # forge.checking.launch_check.LaunchRecord, one per call
        self.module_kernel = False  # a ModelNew: the launch check's module policy (library ops allowed)
        self.calls = 0
        self._inputs: dict[int, tuple[weakref.ref, int, int]] = {}  # id(tensor) -> (ref, token, version synced)
        self._next_input = 0
        self._forget: list[int] = []  # tokens of parent tensors that died: the child may drop its copies

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A plain call (no poisoning), e.g. the probes': the same parent tensor is the same child tensor."""
        return self._call(Sample(tuple(args), dict(kwargs)), None, False, ())

    def call(self, inputs: Sample, pattern: PoisonPattern, dispatch: bool,
             output_metas: Sequence[tuple[tuple[int, ...], torch.dtype, torch.device]]) -> Any:
        return self._call(inputs, pattern, dispatch, output_metas)

    def _input_token(self, tensor: torch.Tensor) -> tuple[int, str]:
        """The child's token for a parent tensor, and whether the child must get its values ("new"), copy new values
        into the same object ("update": the caller changed it in place) or use what it holds ("reuse")."""
        entry = self._inputs.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1], "reuse" if tensor._version == entry[2] else "update"
        token, self._next_input = self._next_input, self._next_input + 1
        key = id(tensor)
        ref = weakref.ref(tensor, lambda _, key=key, token=token: self._input_died(key, token))
        self._inputs[key] = (ref, token, tensor._version)
        return token, "new"

    def _input_died(self, key: int, token: int) -> None:
        self._forget.append(token)
        entry = self._inputs.get(key)
        if entry is not None and entry[1] == token:
            del self._inputs[key]

    def build(self, seed: int) -> SandboxCandidate:
        """Have the child build its `ModelNew` under `seed` (a module target); later calls run its forward. A
        constructor that raises is the candidate's compile error (`CandidateRaised`)."""
        self._check_usable()
        try:
            self.clock.child_turn()
            wire.send_message(self.sock, {"op": "build", "seed": int(seed)})
            reply, fds = self._receive()
        except (wire.WireError, OSError) as exc:
            self._lose(f"could not ask the child to build: {exc}")
        finally:
            self.clock.harness_turn()
        wire._close_all(fds)
        if reply.get("op") == "built":
            return self
        if reply.get("op") == "build_failed":
            failure = _plain_failure(reply.get("failure"), "build")
            failure["status"] = Outcome.COMPILE_ERROR.value
            if self.first_failure is None:
                self.first_failure = failure
            raise _raised_type(reply.get("type"))(_short(reply.get("message"), 1000))
        self._limit_or_lose(reply)
        raise AssertionError("unreachable")

    def _check_usable(self) -> None:
        if self.lost is not None:
            raise SandboxChildLost(self.lost)
        if self.limit is not None:
            raise SandboxLimitReached(*self.limit)

    def _limit_or_lose(self, reply: dict[str, Any]) -> None:
        """A `limit` reply (the child reached a harness limit) stops the run as `harness_error`; anything else the
        child sends out of turn breaks the protocol."""
        if reply.get("op") == "limit":
            name = reply.get("limit")
            limit = HarnessLimit.__members__.get(name) if isinstance(name, str) else None
            if limit is not None:
                self.limit = (limit, _short(reply.get("message") or limit.value))
                raise SandboxLimitReached(*self.limit)
        self._lose(f"the child sent an unexpected reply {str(reply.get('op'))[:40]!r}")

    def _call(self, inputs: Sample, pattern: PoisonPattern | None, dispatch: bool,
              output_metas: Sequence[tuple[tuple[int, ...], torch.dtype, torch.device]]) -> Any:
        self._check_usable()
        self.calls += 1
        outbox = wire.Outbox()
        payload, leaves = wire.dump_inputs((tuple(inputs.args), dict(inputs.kwargs)), outbox, self._input_token)
        forget, self._forget = self._forget, []
        header = {"op": "call", "inputs": payload, "storages": outbox.storages, "forget": forget,
                  "pattern": pattern.name if pattern is not None else None, "dispatch": bool(dispatch),
                  "metas": [[list(shape), str(dtype).removeprefix("torch."), str(device)]
                            for shape, dtype, device in output_metas]}
        self.clock.child_turn()
        try:
            wire.send_message(self.sock, header, outbox.fds)
            reply, fds = self._receive()
        except (wire.WireError, OSError) as exc:
            self._lose(f"could not send a call to the child: {exc}")
        finally:
            self.clock.harness_turn()
            outbox.close()
        if reply.get("op") == "limit":
            wire._close_all(fds)
            self._limit_or_lose(reply)
        try:
            return self._result(reply, fds, leaves)
        except (wire.WireError, OSError, RuntimeError, ValueError, TypeError, KeyError, IndexError, MemoryError) as exc:
            if is_memory_exhaustion(exc):  # this process could not hold the outputs: the harness's limit
                from forge.sandbox.child import is_device_memory

                self.limit = (HarnessLimit.DEVICE_MEMORY if is_device_memory(exc) else HarnessLimit.MEMORY,
                              f"the harness could not hold the outputs the child sent: {_short(exc)}")
                raise SandboxLimitReached(*self.limit) from exc
            self._lose(f"the child sent a malformed reply: {type(exc).__name__}: {_short(exc)}")
        finally:
            wire._close_all(fds)
            for leaf in leaves:  # what the child holds for each parent tensor now matches it
                entry = self._inputs.get(id(leaf))
                if entry is not None and entry[0]() is leaf:
                    self._inputs[id(leaf)] = (entry[0], entry[1], leaf._version)

    def _lose(self, why: str) -> None:
        self.lost = why
        raise SandboxChildLost(why)

    def _receive(self) -> tuple[dict[str, Any], list[int]]:
        try:
            return wire.recv_message(self.sock)
        except wire.PeerGone as exc:
            self._lose(f"the child ended: {exc}")
        except TimeoutError:
            self._lose("the child did not answer in time")
        except (wire.WireError, OSError) as exc:
            self._lose(f"the child broke the protocol: {exc}")
        raise AssertionError("unreachable")

    def _drop_mirrors(self, dead: Any) -> None:
        for token in dead if isinstance(dead, list) else ():
            self.mirrors.pop(token, None) if type(token) is int else None

    def _result(self, reply: dict[str, Any], fds: list[int], leaves: list[torch.Tensor]) -> Any:
        self._drop_mirrors(reply.get("dead"))
        if isinstance(reply.get("launches"), dict):
            from forge.checking.launch_check import LaunchRecord

            self.launch_records.append(LaunchRecord.from_dict(reply["launches"]))  # malformed: a broken protocol
        if reply.get("op") == "raised":
            if fds:
                raise wire.WireError("storages attached to an exception reply")
            if self.first_failure is None:
                self.first_failure = _plain_failure(reply.get("failure"), "validation")
            raise _raised_type(reply.get("type"))(_short(reply.get("message"), 1000))
        if reply.get("op") == "harness_error":  # after the import the candidate could have caused it: not trusted
            raise wire.WireError(f"the child reported a failure of its own: {_short(reply.get('message'))}")
        if reply.get("op") != "result":
            raise wire.WireError(f"unexpected reply {str(reply.get('op'))[:40]!r}")
        specs = reply.get("storages")
        if not isinstance(specs, list) or len(specs) != len(fds):
            raise wire.WireError("storage list does not match the attached descriptors")
        total = sum(int(s.get("nbytes", -1)) for s in specs if isinstance(s, dict))
        if any(not isinstance(s, dict) or type(s.get("nbytes")) is not int or s["nbytes"] < 0 for s in specs):
            raise wire.WireError("bad storage entry")
        if self.max_bytes is not None and total > self.max_bytes:
            raise wire.WireError(f"{total} bytes of outputs; at most {self.max_bytes}")
        storages = [self._storage(fd, spec) for fd, spec in zip(fds, specs, strict=True)]
        sent = [leaf.untyped_storage() for leaf in leaves]
        for pair in reply.get("inputs_after") or []:
            index, entry = pair
            update = storages[entry]
            if update.nbytes() != sent[index].nbytes():
                raise wire.WireError("an input update of the wrong size")
            wire.storage_bytes(sent[index]).copy_(wire.storage_bytes(update))

        def storage_of(ref: Any) -> torch.UntypedStorage:
            if not (isinstance(ref, list) and len(ref) == 2 and ref[0] in ("in", "new") and type(ref[1]) is int):
                raise wire.WireError("bad storage reference")
            pool = sent if ref[0] == "in" else storages
            if not 0 <= ref[1] < len(pool):
                raise wire.WireError("storage reference out of range")
            return pool[ref[1]]

        return wire.decode_tree(reply.get("output"), storage_of)

    def _storage(self, fd: int, spec: dict[str, Any]) -> torch.UntypedStorage:
        device = spec.get("device")
        if device not in self.devices:
            raise wire.WireError(f"a storage on an unexpected device {str(device)[:40]!r}")
        token, existing = spec.get("token"), spec.get("existing")
        mirror = self.mirrors.get(token) if type(token) is int and existing is True else None
        if mirror is not None and mirror.nbytes() == spec["nbytes"] and str(mirror.device) == device:
            return wire.read_storage(fd, spec["nbytes"], device, into=mirror)
        storage = wire.read_storage(fd, spec["nbytes"], device)
        if type(token) is int:
            self.mirrors[token] = storage  # alive while the child says the candidate holds it
            held = sum(m.nbytes() for m in self.mirrors.values())
            if self.max_bytes is not None and held > self.max_bytes:
                raise wire.WireError(f"the child claims {held} bytes of outputs still held; at most {self.max_bytes}")
        return storage


@dataclass
class SessionResult:
    """What the session produced: a verdict dict (`status`, `message`, `details`, `latency_ms`, `baseline_ms`), or
    None when the child was lost before one existed (the runner classifies how it ended)."""

    verdict: dict[str, Any] | None
    lost: str | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    killed: bool = False  # the runner stopped a child that was still running after the channel was lost


def run_session(sock: socket.socket, *, target: Any, utils: Any, device: str, benchmark: bool,
                max_bytes: int | None, clock: ChildClock | None = None) -> SessionResult:
    """Drive one child from import to exit (see the module docstring). `target`: a `FunctionTarget` or a
    `ModuleTarget` (`forge.judging.targets`); `clock`: the child's time (the runner's time limit)."""
    clock = clock if clock is not None else ChildClock()
    phase_s: dict[str, float] = {}
    try:
        ready, fds = wire.recv_message(sock)
    except (wire.WireError, OSError) as exc:
        return SessionResult(None, lost=f"no import report: {exc}")
    finally:
        clock.harness_turn()
    wire._close_all(fds)
    child_phases = ready.get("phase_s") if isinstance(ready.get("phase_s"), dict) else {}
    phase_s.update({f"child_{k}": float(v) for k, v in child_phases.items()
                    if isinstance(k, str) and type(v) in (int, float)})
    if ready.get("op") == "import_failed":
        failure = _plain_failure(ready.get("failure"), "import")
        failure["status"] = Outcome.COMPILE_ERROR.value
        return _done(failure, phase_s)
    if ready.get("op") == "harness_error":
        return _done(_child_harness_error(ready), phase_s)
    if ready.get("op") == "limit":
        proxy = SandboxCandidate(sock, device, max_bytes, clock)
        try:
            proxy._limit_or_lose(ready)
        except (SandboxLimitReached, SandboxChildLost):
            pass
        return _lost_or_limit(proxy, phase_s)
    if ready.get("op") != "ready":
        return SessionResult(None, lost="the child did not report its import")

    proxy = SandboxCandidate(sock, device, max_bytes, clock)
    proxy.module_kernel = target.kind in ("module", "instance")
    start = time.perf_counter()
    if target.kind == "module":
        verdict = _module_verdict(utils, target, proxy)
    elif target.kind == "instance":
        verdict = _instance_verdict(utils, target, proxy)
    else:
        verdict = _validation_verdict(utils, target.reference_fn, proxy, target.samples)
    phase_s["validate"] = time.perf_counter() - start
    if proxy.lost is not None or proxy.limit is not None:
        return _lost_or_limit(proxy, phase_s)
    if verdict is None:
        verdict = {"status": Outcome.OK.value, "message": "correct on every sample", "details": {}}
        if proxy.scaled is not None:  # a module check that stopped after its first seed says why
            verdict["details"].update(oracle_scaled=proxy.scaled.value, note=proxy.scaled.note(target.seeds[0]))
        if benchmark:
            start = time.perf_counter()
            clock.child_turn()
            try:
                verdict = _benchmark(sock, verdict, target)
            finally:
                clock.harness_turn()
            phase_s["benchmark"] = time.perf_counter() - start
            if verdict is None:
                return SessionResult(None, lost="the child ended while benchmarking", phase_s=phase_s)
    verdict["details"]["validated_in"] = "harness process"
    if proxy.launch_records:
        verdict["details"]["launch_records"] = len(proxy.launch_records)
    try:
        wire.send_message(sock, {"op": "exit"})
    except (wire.WireError, OSError):
        pass
    return _done(verdict, phase_s)


def _lost_or_limit(proxy: SandboxCandidate, phase_s: dict[str, float]) -> SessionResult:
    """No verdict of the oracle: the child reached a harness limit (`harness_error` naming it), or it was lost (the
    runner classifies how it ended)."""
    if proxy.limit is not None:
        limit, message = proxy.limit
        return _done({"status": Outcome.HARNESS_ERROR.value, "limit": limit,
                      "message": f"harness error: the sandbox's {limit.value} limit was reached ({message}); not the "
                                 "candidate's fault",
                      "details": {"phase": "validation", "harness_limit": limit.value}}, phase_s)
    return SessionResult(None, lost=proxy.lost, phase_s=phase_s)


def _instance_verdict(utils: Any, target: Any, proxy: SandboxCandidate) -> dict[str, Any] | None:
    """A live module (`InstanceTarget`): the child builds `ModelNew(original)` from its copy of the instance, then
    the oracle checks its forward on the samples like a function kernel's, against the instance here."""
    try:
        proxy.build(0)
    except (SandboxChildLost, SandboxLimitReached):
        return None
    except Exception as exc:  # noqa: BLE001 - the constructor raised (CandidateRaised)
        failure = proxy.first_failure or {"status": Outcome.COMPILE_ERROR.value,
                                          "message": f"building ModelNew raised {type(exc).__name__}: {exc}",
                                          "details": {"phase": "build"}}
        failure["details"].setdefault("errors", [failure["message"]])
        return failure
    return _validation_verdict(utils, target.reference_fn, proxy, target.samples)


def _module_verdict(utils: Any, target: Any, proxy: SandboxCandidate) -> dict[str, Any] | None:
    """`check_module` with the child's `ModelNew` (built there, seed by seed) against `Model` built here; None when
    correct on every seed checked."""
    from forge.judging.modules import check_module

    found: dict[str, Any] = {}
    by_value = dataclasses.replace(utils, check_layout=False)  # a problem's output is its end (check_module)

    def validate(reference: Any, candidate: Any, samples: Any) -> list[Any]:
        verdict = _validation_verdict(by_value, reference, candidate, samples)
        if verdict is not None:
            found["verdict"] = verdict
            return verdict["details"].get("errors") or [verdict["message"]]
        return []

    try:
        check = check_module(target.source, proxy.build, validate, target.device, seeds=target.seeds,
                             dtype=target.dtype)
    except HarnessError as exc:  # the reference failed to build or run here
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return {"status": Outcome.HARNESS_ERROR.value, "message": f"harness error: {_short(exc.reason)}",
                "details": {"phase": "module check", "out_of_memory": exc.out_of_memory,
                            "harness_error": _exception_details(cause)}}
    except Exception as exc:  # noqa: BLE001 - building the reference is ours: a harness failure
        if proxy.lost is not None or proxy.limit is not None:
            return None
        return {"status": Outcome.HARNESS_ERROR.value,
                "message": f"harness error building the reference: {type(exc).__name__}: {_short(str(exc))}",
                "details": {"phase": "module check", "harness_error": _exception_details(exc),
                            "out_of_memory": is_memory_exhaustion(exc)}}
    if proxy.lost is not None or proxy.limit is not None:
        return None
    if not check.built:
        failure = proxy.first_failure or {"status": Outcome.COMPILE_ERROR.value, "message": str(check.errors[0]),
                                          "details": {"phase": "build"}}
        failure["details"].update(errors=[str(e) for e in check.errors])
        return failure
    if check.errors:
        verdict = found.get("verdict") or {"status": check.outcome.value, "message": str(check.errors[0]),
                                           "details": {"phase": "validation"}}
        verdict["details"]["errors"] = [str(e) for e in check.errors]
        verdict["details"]["issues"] = [issue_of(e).to_dict() for e in check.errors]
        if verdict["status"] == Outcome.MISMATCH.value:
            verdict["message"] = f"{len(check.errors)} validation error(s); first: {_short(check.errors[0], 200)}"
        return verdict
    proxy.scaled = check.scaled
    return None


def _done(verdict: dict[str, Any], phase_s: dict[str, float]) -> SessionResult:
    verdict.setdefault("details", {})["phase_s"] = phase_s
    return SessionResult(verdict, phase_s=phase_s)


def _child_harness_error(report: dict[str, Any]) -> dict[str, Any]:
    details = report.get("details") if isinstance(report.get("details"), dict) else {}
    return {"status": Outcome.HARNESS_ERROR.value, "message": _short(report.get("message") or "sandbox harness error"),
            "details": {"harness_error": details.get("harness_error"),
                        "out_of_memory": details.get("out_of_memory") is True}}


def _exception_details(exc: BaseException) -> dict[str, Any]:
    import traceback

    text = "".join(traceback.format_exception(exc))
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": _short(str(exc), 2000),
            "traceback": text[-4000:]}


def _validation_verdict(utils: Any, reference: Callable[..., Any], proxy: SandboxCandidate,
                        samples: Sequence[Sample]) -> dict[str, Any] | None:
    """None when validation passed; else the verdict (mismatch, the candidate's failure, or a harness error)."""
    try:
        errors = list(utils.validate(reference, proxy, samples))
    except HarnessError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return {"status": Outcome.HARNESS_ERROR.value, "message": f"harness error: {_short(exc.reason)}",
                "details": {"phase": "validation", "out_of_memory": exc.out_of_memory,
                            "harness_error": _exception_details(cause)}}
    except Exception as exc:  # noqa: BLE001 - validate raises only on harness problems
        if proxy.lost is not None:
            return None
        return {"status": Outcome.HARNESS_ERROR.value,
                "message": f"sandbox harness error: {type(exc).__name__}: {_short(str(exc))}",
                "details": {"phase": "validation", "harness_error": _exception_details(exc), "out_of_memory": False}}
    errors += _launch_issues(proxy.launch_records, module=proxy.module_kernel)
    if not errors or proxy.lost is not None:
        return None
    issues = [issue_of(e) for e in errors]
    found = {"errors": [str(e) for e in errors], "issues": [i.to_dict() for i in issues],
             "mismatches": _mismatch_rows(issues)}
    if proxy.first_failure is not None:
        verdict = proxy.first_failure
        verdict["details"].update(found)
        return verdict
    return {"status": Outcome.MISMATCH.value,
            "message": f"{len(errors)} validation error(s); first: {_short(errors[0], 200)}",
            "details": {"phase": "validation", **found}}


def _launch_issues(records: list[Any], *, module: bool = False) -> list[Any]:
    """The run-time launch check (`forge.checking.launch_check`) over the records the child made around each call
    (`language.launch_monitor()`), with the module policy for a `ModelNew` (library products, convolutions and
    attention allowed). The records come from the candidate's process, so a kernel could forge them: this check
    catches honest mistakes and fallbacks; the oracle's verdict does not depend on it."""
    if not records:
        return []
    from forge.checking.launch_check import LaunchPolicy, launch_issues

    return list(launch_issues(records, LaunchPolicy.for_modules() if module else LaunchPolicy()))


def _benchmark(sock: socket.socket, verdict: dict[str, Any], target: Any) -> dict[str, Any] | None:
    try:
        wire.send_message(sock, {"op": "benchmark"})
        reply, fds = wire.recv_message(sock)
    except (wire.WireError, OSError):
        return None
    wire._close_all(fds)
    if reply.get("op") == "limit":
        return None
    if reply.get("op") == "benchmark_failed":
        return _plain_failure(reply.get("failure"), "benchmark")
    if reply.get("op") != "benchmark" or not _timing(reply.get("latency_ms")):
        return _plain_failure({"message": "the child sent no usable timing"}, "benchmark")
    verdict["latency_ms"] = _timing(reply["latency_ms"])
    verdict["baseline_ms"] = _timing(reply.get("baseline_ms"))
    details = reply.get("details") if isinstance(reply.get("details"), dict) else {}
    for key in ("device_latency_ms", "device_latency_error", "baseline_error"):
        if key in details:
            verdict["details"][key] = details[key]
    verdict["details"]["timing_source"] = TIMING_SOURCE
    speed = ""
    baseline = {"module": "Model", "instance": "the original forward"}.get(target.kind, "PyTorch")
    if verdict["baseline_ms"]:
        speed = (f"; {verdict['latency_ms']['median_ms']:.4g} ms vs {baseline} "
                 f"{verdict['baseline_ms']['median_ms']:.4g} ms (timed in the sandbox: feedback only)")
    verdict["message"] = f"correct on every sample{speed}"
    return verdict


def _timing(value: Any) -> dict[str, Any] | None:
    """A `BenchmarkResult.to_dict()` from the child, kept only with a positive finite median."""
    if not isinstance(value, dict):
        return None
    median = value.get("median_ms")
    if type(median) not in (int, float) or not 0 < median < float("inf"):
        return None
    return value


def _mismatch_rows(issues: list[Any]) -> list[dict[str, Any]]:
    """The worst elements of the first value mismatches, as JSON-safe table rows (sample, input, output, index,
    expected, actual, abs_diff, allowed)."""
    rows: list[dict[str, Any]] = []
    for issue in issues:
        for row in issue.table_rows():
            if len(rows) >= _MISMATCH_ROWS:
                return rows
            rows.append({k: (list(v) if isinstance(v, tuple) else _json_value(v)) for k, v in row.items()})
    return rows


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "+inf" if value > 0 else "-inf"
    return value
