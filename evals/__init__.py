"""Offline evals: benchmark problems (function calls from real models, KernelBench modules), the results store,
standard metrics and reports.

    from evals import load_suite, ResultsStore, summarize, write_report
    problems = load_suite("builtin")
    store = ResultsStore("runs/x/results.jsonl")
    ...  # the runner appends one record per problem
    write_report(store.frame(), "runs/x/report", total=len(problems))
"""

from .metrics import (
    FAST_P_THRESHOLDS,
    RECORD_COLUMNS,
    compile_rate,
    correct_rate,
    cost_per_correct,
    cost_per_problem,
    failure_category,
    fast_p,
    geomean_speedup,
    mean_roofline_fraction,
    normalize_records,
    pass_at_k,
    pass_at_k_estimate,
    per_problem,
    problem_count,
    roofline_fraction,
    summarize,
    summarize_by_suite,
)
from .options import EvalOptions
from .problems import (
    SCHEMA_VERSION,
    FunctionProblem,
    ModuleProblem,
    Problem,
    ProblemKind,
    Provenance,
    SuiteFormatError,
    Tolerance,
    builtin_suite_names,
    function_problem_from_json,
    load_kernelbench_folder,
    load_source_module,
    load_suite,
    module_problem_from_source,
    read_suite_file,
    suite_to_json,
    write_suite_file,
)
from .progress import ProgressBar, format_duration
from .report import PLOT_FILES, markdown_table, write_report
from .results import ResultsStore, parse_shard, record_key, shard
from .runner import QUICK_KERNEL_UTILS, run_eval
from .sources import CompileSource, EagerSource, EvalSource, LLMSource, SDPASource, source_from_name

__all__ = [
    "QUICK_KERNEL_UTILS",
    "CompileSource",
    "EagerSource",
    "EvalOptions",
    "EvalSource",
    "LLMSource",
    "SDPASource",
    "run_eval",
    "source_from_name",
    "FAST_P_THRESHOLDS",
    "PLOT_FILES",
    "RECORD_COLUMNS",
    "SCHEMA_VERSION",
    "FunctionProblem",
    "ModuleProblem",
    "Problem",
    "ProblemKind",
    "ProgressBar",
    "Provenance",
    "ResultsStore",
    "SuiteFormatError",
    "Tolerance",
    "builtin_suite_names",
    "compile_rate",
    "correct_rate",
    "cost_per_correct",
    "cost_per_problem",
    "failure_category",
    "fast_p",
    "format_duration",
    "function_problem_from_json",
    "geomean_speedup",
    "load_kernelbench_folder",
    "load_source_module",
    "load_suite",
    "markdown_table",
    "mean_roofline_fraction",
    "module_problem_from_source",
    "normalize_records",
    "parse_shard",
    "pass_at_k",
    "pass_at_k_estimate",
    "per_problem",
    "problem_count",
    "read_suite_file",
    "record_key",
    "roofline_fraction",
    "shard",
    "suite_to_json",
    "summarize",
    "summarize_by_suite",
    "write_report",
    "write_suite_file",
]
