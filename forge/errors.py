"""kernel-forge's exceptions, one hierarchy (as httpx's `_exceptions.py`): what a caller can catch, and the outcome
each one means.

    KernelForgeError                 every error kernel-forge raises on purpose
    ├── UsageError                   the user can fix it (a bad flag, a missing folder, a model that does not import)
    │   │                             : the CLI prints it as one line, `kforge: <message>`, exit status 2
    │   └── SettingError             an environment variable (or a flag's text) that does not parse (forge.env)
    ├── HarnessError                 the harness failed, not the candidate (forge.outcome): `harness_error`
    ├── sandbox events (forge.sandbox): SandboxUnavailableError (no boundary: `harness_error`), SandboxChildLost
    │   (the child ended or broke the protocol: `crash`), SandboxLimitReached and WireError / ReplyTooLarge (a limit
    │   or a broken message of the harness: `harness_error`)
    └── CandidateError               the candidate was judged at fault while it ran: its `outcome`
        ├── SpotCheckError           a timed pass computed something else (forge.checking.spot_check): `mismatch`
        ├── IntegrityError           it patched what judges or times it (forge.checking.integrity): `mismatch`
        ├── NotCapturableError       it cannot run under CUDA graphs (forge.checking.benchmarking): `runtime_error`
        ├── CandidateAbort           it raised SystemExit / KeyboardInterrupt / GeneratorExit (forge.outcome)
        └── ParameterCopyError       a module kernel copied the instance's weights (agent.modules): `forbidden`

Each class's `outcome` (a `forge.outcome.Outcome` value) is what a report shows for it:
`forge.outcome.outcome_of_exception` reads it, so no caller matches types or text to find a status. Some keep a
standard base as well (`ValueError` for bad input, `RuntimeError` for a check that failed), so existing
`except ValueError` code keeps working. Anything else a candidate raises is its `runtime_error`.
"""

from __future__ import annotations

__all__ = ["CandidateError", "KernelForgeError", "SettingError", "UsageError"]


class KernelForgeError(Exception):
    """Base of every error kernel-forge raises on purpose; `outcome` says what it means for a candidate."""

    outcome = "runtime_error"


class UsageError(KernelForgeError):
    """An expected, user-fixable failure; its message is shown as is, on one line."""

    outcome = "harness_error"


class SettingError(UsageError, ValueError):
    """A setting's text does not parse (`forge.env`): the message names the variable, the value and the form
    expected. Also a ValueError, as the hand-written checks it replaced raised."""


class CandidateError(KernelForgeError):
    """The candidate misbehaved while the harness ran it (see the subclasses for the outcome of each)."""
