"""The harness's dispatch modes, which leave `torch._dynamo` unimported until something else imports it.

Why: torch wraps every `TorchDispatchMode.__torch_dispatch__` in `torch._disable_dynamo`, whose first call imports
`torch._dynamo`; in a sandbox child that import was 1.2 s of a child's ~5 s (py-spy over the eleven children of one
judging test on the CPU: as long as importing torch itself), paid by every child whose candidate never compiles.
Nothing can be compiling before `torch._dynamo` is imported (`torch.compile` imports it), so a mode's frame needs
Dynamo's skip only once it is loaded: from then on it gets it, as torch gives it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HarnessDispatchMode"]


def _skipped_by_dynamo_once_loaded(dispatch: Callable[..., Any]) -> Callable[..., Any]:
    skipping: Callable[..., Any] | None = None

    @functools.wraps(dispatch)
    def inner(*args: Any, **kwargs: Any) -> Any:
        nonlocal skipping
        if skipping is None:
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None:  # never imported: nothing is compiling
                return dispatch(*args, **kwargs)
            skipping = dynamo.disable(dispatch, recursive=True, wrapping=False)
        return skipping(*args, **kwargs)

    return inner


class HarnessDispatchMode(TorchDispatchMode):
    """A `TorchDispatchMode` whose `__torch_dispatch__` Dynamo skips once `torch._dynamo` is loaded (see the module
    docstring), not one that imports it on its first call."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # torch's eager wrapper; `__init_subclass__` puts the lazy one in its place

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dispatch = cls.__dict__.get("__torch_dispatch__")
        if dispatch is not None and not isinstance(dispatch, classmethod):
            cls.__torch_dispatch__ = _skipped_by_dynamo_once_loaded(dispatch)  # type: ignore[method-assign]
