"""`UsageError`: a failure the user can fix (a bad flag, a missing folder, a model that does not import).

The CLI prints these as one line (`kforge: <message>`, exit status 2) and everything else as an internal error with
a traceback log (`kforge.cli.main`), so the message of a `UsageError` must name the problem and the fix on its own.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """An expected, user-fixable failure; its message is shown as is, on one line."""
