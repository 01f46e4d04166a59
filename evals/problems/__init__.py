"""Eval problems: function problems (real `torch.nn.functional` calls from models) and KernelBench-format modules."""

from .base import Problem, ProblemKind, Provenance, SuiteFormatError, Tolerance
from .function import FunctionProblem, function_problem_from_json
from .kernelbench import ModuleProblem, load_kernelbench_folder, module_problem_from_source
from .source_module import load_source_module
from .suite import (
    SCHEMA_VERSION,
    builtin_suite_names,
    load_suite,
    read_suite_file,
    suite_to_json,
    write_suite_file,
)

__all__ = [
    "SCHEMA_VERSION",
    "FunctionProblem",
    "ModuleProblem",
    "Problem",
    "ProblemKind",
    "Provenance",
    "SuiteFormatError",
    "Tolerance",
    "builtin_suite_names",
    "function_problem_from_json",
    "load_kernelbench_folder",
    "load_source_module",
    "load_suite",
    "module_problem_from_source",
    "read_suite_file",
    "suite_to_json",
    "write_suite_file",
]
