"""Static screening of candidate kernel sources (AST, alias-aware): what may run in the sandbox at all."""

from agent.screening.python_ast import PythonAnalysis, PythonRules, analyse_python
from agent.screening.screen import screen_source
from agent.screening.violation import Violation, ViolationKind, format_violations, has_syntax_error

__all__ = [
    "PythonAnalysis",
    "PythonRules",
    "Violation",
    "ViolationKind",
    "analyse_python",
    "format_violations",
    "has_syntax_error",
    "screen_source",
]
