"""`run_isolated`: call a function in a fresh child process, so a candidate that segfaults, corrupts the CUDA
context or hangs ends only that child.

The child is started with the `spawn` method (no inherited CUDA state), gets the function and its arguments by
pickle (so both must be importable / picklable), and sends back the return value or the exception text through a
pipe. The parent waits up to `timeout_s`, then kills it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["IsolatedOutcome", "run_isolated", "signal_name"]

IsolatedStatus = Literal["ok", "error", "crash", "timeout"]


@dataclass(frozen=True)
class IsolatedOutcome:
    """`ok` (with `value`), `error` (the function raised: `message`), `crash` (the child died: `message` names the
    signal or exit code) or `timeout` (killed after `timeout_s`)."""

    status: IsolatedStatus
    value: Any = None
    message: str = ""


def signal_name(number: int) -> str:
    """`11` -> `"SIGSEGV"`."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child(conn: multiprocessing.connection.Connection, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as text
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
    else:
        conn.send(("ok", value))
    conn.close()


def run_isolated(fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> IsolatedOutcome:
    """`fn(*args, **kwargs)` in a spawned child process (see the module docstring)."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, fn, args, kwargs), daemon=True,
                              name="kforge-eval-isolated")
    process.start()
    sender.close()
    try:
        ready = multiprocessing.connection.wait([receiver, process.sentinel], timeout=timeout_s)
        if not ready:
            return IsolatedOutcome("timeout", message=f"no result within {timeout_s:g} s; the child was killed")
        try:
            status, payload = receiver.recv()
        except (EOFError, OSError):
            process.join(5)
            code = process.exitcode
            if code is not None and code < 0:
                return IsolatedOutcome("crash", message=f"child died with signal {signal_name(-code)}")
            return IsolatedOutcome("crash", message=f"child exited with code {code} without a result")
        if status == "ok":
            return IsolatedOutcome("ok", value=payload)
        return IsolatedOutcome("error", message=str(payload))
    finally:
        receiver.close()
        if process.is_alive():
            process.kill()
        process.join(5)
