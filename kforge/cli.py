"""`kforge`: the command line.

    kforge optimize --demo [llama|unet] [--out plan.json]     optimize an embedded demo (default: llama)
    kforge optimize PKG.MODULE:FACTORY --inputs PKG.MODULE:INPUTS [--out plan.json]
    kforge plan show plan.json [--trust-unsigned]             print a saved plan and its signature status
    kforge plan verify plan.json [--timeout S]                re-validate a saved plan's kernels on this machine
                                                              (generated kernels in the sandbox first; one process
                                                              per kernel, stopped after S seconds)
    kforge plan sign plan.json                                sign a reviewed plan with your key (forge.signing)
    kforge plan export-kernels plan.json --out DIR            its module kernels as a local `kernels` repository
                                                              (kernelize / transformers KernelConfig; forge.hub_kernels)
    kforge eval SUITE [...]                                   offline evals of kernel sources (see `kforge eval -h`)

Exit status: 0 done; 1 a negative result (a kernel failed verification) or an internal error (one line naming the
log with the traceback); 2 a usage error: a bad argument, an output folder that does not exist, a model or inputs
that do not import, build or run, a plan that does not load (one line on stderr; -v adds the traceback). Arguments
and outputs are checked before any long work. Without CUDA, TRITON_INTERPRET=1 is set unless already set.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import difflib
import importlib
import inspect
import logging
import math
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from forge.errors import UsageError
from forge.judging import Judge
from forge.optimizer import MODULE_MIN_SHARE_PERCENT
from forge.samples import Sample, map_values
from forge.text import clip
from forge.verify import DEFAULT_VERIFY_TIMEOUT_S

__all__ = ["main", "load_target", "load_inputs", "UsageError"]

logger = logging.getLogger("kforge.cli")


# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------
def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s" if verbosity else "%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Library warnings (Dynamo's tracing notes, deprecations) go to the log, shown with -v, so they never land in
    # the middle of a table; kernel-forge's own warnings (a plan run in another mode...) are log records anyway.
    logging.captureWarnings(False)  # re-installed, so it routes through the current `warnings.showwarning`
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.WARNING if verbosity else logging.ERROR)
    # Progress lines are always shown by the CLI.
    progress_logger = logging.getLogger("forge.progress")
    progress_logger.setLevel(logging.INFO)
    if verbosity == 0:
        progress_handler = logging.StreamHandler(sys.stderr)
        progress_handler.setFormatter(logging.Formatter("· %(message)s"))
        progress_logger.handlers[:] = [progress_handler]
        progress_logger.propagate = False


def _resolve(spec: str, what: str) -> Any:
    if ":" not in spec:
        raise UsageError(f"{what} must look like PKG.MODULE:NAME, got {spec!r}")
    module_name, attr = spec.split(":", 1)
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} for {what}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing: name it, not a traceback
        raise UsageError(f"importing {module_name!r} for {what} raised {_describe_exception(exc)}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no attribute {attr!r} ({what})") from None


def _describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_one_line(str(exc))}"


def _call_with_device(factory: Any, device: str, spec: str, what: str) -> Any:
    if not callable(factory):
        return factory
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    try:
        return factory(device=device) if "device" in params else factory()
    except Exception as exc:  # noqa: BLE001 - the user's factory raised: one line naming it
        raise UsageError(f"{what} {spec} raised {_describe_exception(exc)}") from exc


def load_target(spec: str, device: str) -> nn.Module:
    """`PKG.MODULE:FACTORY` -> an eval-mode module on `device` (FACTORY may be a module, a class or a function).

    Raises `UsageError` when the module does not import, the factory raises or returns something else."""
    target = _resolve(spec, "the model factory")
    model = target if isinstance(target, nn.Module) else _call_with_device(target, device, spec, "the model factory")
    if not isinstance(model, nn.Module):
        raise UsageError(f"{spec} returned {type(model).__name__}, expected a torch.nn.Module")
    try:
        return model.to(device).eval()
    except Exception as exc:  # noqa: BLE001 - e.g. a module that cannot move to the device
        raise UsageError(f"the model from {spec} cannot be moved to {device}: {_describe_exception(exc)}") from exc


def _to_sample(item: Any, device: str) -> Sample:
    move = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    if isinstance(item, Sample):
        return Sample(map_values(tuple(item.args), move), map_values(dict(item.kwargs), move))
    if isinstance(item, dict):
        return Sample((), map_values(item, move))
    if isinstance(item, (tuple, list)):
        if len(item) == 2 and isinstance(item[0], (tuple, list)) and isinstance(item[1], dict):
            return Sample(map_values(tuple(item[0]), move), map_values(dict(item[1]), move))
        return Sample(map_values(tuple(item), move), {})
    return Sample((move(item),), {})


def load_inputs(spec: str, device: str) -> list[Sample]:
    """`PKG.MODULE:INPUTS` -> samples. INPUTS may be (a callable returning) a list of Samples, (args, kwargs) pairs,
    argument tuples, kwargs dicts or single tensors. Raises `UsageError` when they cannot be obtained."""
    value = _call_with_device(_resolve(spec, "the inputs"), device, spec, "the inputs function")
    if isinstance(value, (torch.Tensor, Sample, dict)):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise UsageError(f"{spec} must give a non-empty list of samples, got {type(value).__name__}")
    try:
        return [_to_sample(item, device) for item in value]
    except Exception as exc:  # noqa: BLE001 - e.g. a tensor that cannot move to the device
        raise UsageError(f"the inputs from {spec} cannot be used on {device}: {_describe_exception(exc)}") from exc


def check_first_forward(model: nn.Module, data: list[Sample], label: str) -> None:
    """Run the model once on its first sample, so inputs that do not fit it fail here in one line naming the
    target, not as a traceback from inside the profiler (one forward: cheap next to profiling)."""
    sample = data[0]
    try:
        with torch.no_grad():
            model(*sample.args, **sample.kwargs)
    except Exception as exc:  # noqa: BLE001 - the user's model or inputs: one line naming both
        raise UsageError(f"{label} raised on its first input sample {_clip(sample.describe(), 200)}: "
                         f"{_describe_exception(exc)}") from exc


def _pick_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"--device {requested} requested but CUDA is not available (use --device cpu)")
        index = torch.device(requested).index
        if index is not None and index >= torch.cuda.device_count():
            raise UsageError(f"--device {requested}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return requested


# -- argument types: argparse turns their ArgumentTypeError into one line naming the flag ---------------------
_DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def device_argument(text: str) -> str:
    """`--device`: auto, cpu, cuda or cuda:N."""
    if not _DEVICE_PATTERN.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use auto, cpu, cuda or cuda:N")
    return text.strip()


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def percent_argument(text: str) -> float:
    """A time share in percent, 0 to 100."""
    value = _finite(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage between 0 and 100")
    return value


def seconds_argument(text: str) -> float:
    """A duration in seconds, >= 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; give a number of seconds >= 0")
    return value


def positive_seconds_argument(text: str) -> float:
    """A duration in seconds, > 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds > 0")
    return value


def output_file_argument(text: str) -> str:
    """An output file whose folder exists and is writable and which is not a folder: checked before any work."""
    try:
        check_output_file(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def check_output_file(text: str) -> Path:
    path = Path(text).expanduser()
    if not text.strip():
        raise UsageError("the output path is empty")
    if path.is_dir():
        raise UsageError(f"{text} is a directory; give a file name such as {path / 'plan.json'}")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"folder {str(folder)!r} does not exist; create it first (mkdir -p {folder})")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"folder {str(folder)!r} is not writable")
    if path.exists() and not path.is_file():
        raise UsageError(f"{text} exists and is not a regular file")
    return path


def _check_generator_arguments(args: argparse.Namespace) -> None:
    """The LLM generator's flags (defined in `agent.cli_support`), checked before the model is loaded."""
    for flag, minimum in (("candidates", 1), ("attempts", 1), ("optimize_rounds", 0)):
        value = getattr(args, flag, None)
        if value is not None and value < minimum:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= {minimum}, got {value}")
    prompts_dir = getattr(args, "prompts_dir", None)
    if prompts_dir is not None and not Path(prompts_dir).expanduser().is_dir():
        raise UsageError(f"--prompts-dir {prompts_dir}: no such folder")
    artifacts_dir = getattr(args, "artifacts_dir", None)
    if artifacts_dir is not None and Path(artifacts_dir).exists() and not Path(artifacts_dir).is_dir():
        raise UsageError(f"--artifacts-dir {artifacts_dir} exists and is not a folder")
    names = getattr(args, "generate_functions", None)
    if names:
        _check_function_names([n.strip() for n in names.split(",") if n.strip()], "--generate-functions")


def _check_function_names(names: list[str], flag: str) -> None:
    from forge.functional import functional_names

    known = functional_names()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see forge.functional.functional_names()"
            raise UsageError(f"{flag}: {name!r} is not a torch.nn.functional function{hint}")


def _print_table(title: str, frame: pd.DataFrame | None) -> None:
    print(f"\n== {title} ==")
    if frame is None or frame.empty:
        print("(none)")
        return
    shown = frame.copy()
    for column in shown.columns:
        shown[column] = shown[column].map(lambda v: _clip(v) if isinstance(v, str) else "-" if v is None else v)
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-"))


def _clip(text: str, width: int = 100) -> str:
    return clip(printable(" ".join(text.split())), width, ellipsis="…")


def printable(text: str) -> str:
    """`text` with control and format characters escaped (`\\x1b`, `\\u202e`): a plan file or a model's message
    must not be able to drive the terminal (colours, cursor moves, a title change, reversed text)."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _one_line(text: str) -> str:
    """An error message on one line: its lines joined with ' | ', control characters escaped."""
    return printable(" | ".join(line.strip() for line in text.splitlines() if line.strip()))


# ---------------------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------------------
def _generators(args: argparse.Namespace) -> list:
    if args.no_generate:
        return []
    try:
        from agent.cli_support import generators_from_args
    except ImportError:
        return []
    return generators_from_args(args)


def _module_sources(generators: list) -> list:
    try:
        from agent.cli_support import module_sources_for
    except ImportError:
        return []
    return module_sources_for(generators)


def _load_demo(name: str, device: str) -> tuple[nn.Module, list[Sample], str]:
    """The embedded demo `name` (model, inputs, label); an unknown name is a one-line error naming the choices."""
    from forge.demos import UnknownDemoError, get_demo

    try:
        demo = get_demo(name)
    except UnknownDemoError as exc:
        raise SystemExit(f"kforge: {exc}") from None
    return demo.model(device), demo.inputs(device), f"demo {demo.name}: {demo.description}"


def _cmd_optimize(args: argparse.Namespace) -> int:
    from forge.checking import KernelUtils
    from forge.optimizer import KernelOptimizer, default_generation_timeout
    from forge.providers import CompiledModuleProvider, default_providers

    device = _pick_device(args.device)
    if (args.demo is not None) == bool(args.target):
        raise UsageError("optimize: give either --demo [NAME] or a PKG.MODULE:FACTORY target")
    if args.demo is None and not args.inputs:
        raise UsageError("optimize: a target needs --inputs PKG.MODULE:INPUTS")
    if args.generation_timeout is None:
        try:
            args.generation_timeout = default_generation_timeout()  # the optimizer's own parser, checked up front
        except ValueError as exc:
            raise UsageError(f"{exc}; give a number of seconds >= 0 or unset it") from None
    _check_generator_arguments(args)
    generators = _generators(args)  # the LLM configuration is checked before the model is built
    if args.demo is not None:
        model, data, label = _load_demo(args.demo, device)
    else:
        model, data = load_target(args.target, device), load_inputs(args.inputs, device)
        label = args.target
        check_first_forward(model, data, label)
    params = sum(p.numel() for p in model.parameters())
    print(f"kforge: optimizing {label} ({params / 1e6:.1f}M parameters) on {device}, {len(data)} input sample(s)")

    providers = [] if args.no_static else default_providers(device)
    # One judge for the run: the generator's (its sandbox concurrency and limits), so the optimizer's re-judging of a
    # generated kernel queues for the same sandbox slots as the generator's candidates.
    shared = next((g.judge for g in generators if isinstance(getattr(g, "judge", None), Judge)), None)
    optimizer = KernelOptimizer(
        kernel_providers=providers,
        kernel_generators=generators,
        kernel_utils=KernelUtils(),
        provider_min_time_share_percent=args.provider_threshold,
        module_sources=([] if args.no_static else [CompiledModuleProvider]) + _module_sources(generators),
        module_min_time_share_percent=args.module_threshold,
        module_classes=args.modules,
        generator_min_time_share_percent=args.generator_threshold,
        generation_timeout=args.generation_timeout,
        end_to_end_check=not args.no_end_to_end_check,
        judge=shared,
        graph_blocks=not (args.no_static or args.no_graphs),
    )
    compile_options = {"mode": args.compile_mode} if args.compile_mode != "default" else {}
    plan = optimizer.make_plan(model, data, execution=args.execution, compile_options=compile_options)
    _print_table("profile (time per forward pass)", optimizer.profile_summary)
    if optimizer.module_profile is not None:
        _print_table("hot module classes (device ms per forward; self: launched by the class's own forward, "
                     "outside_f: not inside a torch.nn.functional call)", _hot_modules(optimizer.module_profile))
        print(optimizer.last_result.reach.describe())
    if optimizer.last_result.graph_blocks:
        print("blocks tried replayed from CUDA graphs (eager on CUDA): "
              + ", ".join(name.rsplit(".", 1)[-1] for name in optimizer.last_result.graph_blocks))
    _print_table("candidates", optimizer.report)
    if optimizer.end_to_end is not None:
        _print_table("end-to-end check (the whole model with and without the selected kernels)", optimizer.end_to_end)
    _print_table("plan", plan.summary())
    if args.out:
        _save_plan(plan, args.out)
    if args.benchmark:
        _end_to_end(model, data, plan, compile_options)
    return 0


def _hot_modules(profile: Any, top: int = 10) -> pd.DataFrame:
    from forge.modules import declared_layer

    hot = profile.hot(top).copy()
    hot["layer"] = hot["module_class"].map(lambda name: declared_layer(name) or "")  # the library's swappable layer
    hot["module_class"] = hot["module_class"].map(lambda name: name.rsplit(".", 1)[-1])
    return hot[["module_class", "layer", "leaf", "calls", "self_ms", "outside_f_ms", "self_pct", "outside_f_pct",
                "inclusive_ms"]]


def _save_plan(plan: Any, out: str) -> None:
    """Save to `out` (checked before the run); should that still fail (disk full, folder removed meanwhile), save a
    copy in the temp folder so the run's work is not lost, and report both."""
    try:
        path = plan.save(out)
    except OSError as exc:
        handle, name = tempfile.mkstemp(prefix="kforge-plan-", suffix=".json")
        os.close(handle)
        rescue = plan.save(name)
        raise UsageError(f"cannot save the plan to {out} ({exc}); it was saved to {rescue} instead") from exc
    print(f"\nplan saved to {path}")
    _report_saved_signature(plan, path)


def _report_saved_signature(plan: Any, path: Path) -> None:
    """Say who signed a saved plan that carries code, or how to sign it."""
    from forge.plan_schema import read_plan_json
    from forge.signing import check_document, load_key

    if not plan.carries_code:
        return
    try:
        key = load_key()
    except (OSError, ValueError):  # plan.save already said why it saved unsigned
        key = None
    check = check_document(read_plan_json(path), key)
    if check.valid:
        print(printable(f"plan {check.describe()}"))
    else:
        print(printable(f"plan holds generated code and is {check.describe()}: review it, then run "
                        f"`kforge plan sign {path}` (loading it refuses until then)"))


def _end_to_end(model: nn.Module, data: list[Sample], plan: Any, compile_options: dict[str, Any],
                blocks: int = 6) -> None:
    """Whole-model latency in every execution mode with and without the plan (`forge.end_to_end`)."""
    from forge.end_to_end import compare_end_to_end

    report = compare_end_to_end(model, data, plan, blocks=blocks, compile_options=compile_options, profile=True)
    _print_table(f"end-to-end latency (one pass over the inputs; {blocks} interleaved blocks; CUDA graphs timed by "
                 "replay, the others host-inclusive; outputs checked against eager)", report.frame())
    _print_where_the_time_went(report)


def _print_where_the_time_went(report: Any, top: int = 12) -> None:
    """The kernel profile of the model with the plan against without it, per mode: totals, by function, by kernel."""
    summary = report.kernel_summary()
    if summary.empty:
        return
    _print_table("where the time went (device ms per pass over the inputs, profiled without and with the plan)",
                 summary)
    for execution in summary["execution"]:
        diff = report.kernel_diff(execution)
        _print_table(f"{execution}: device time by function (largest change first)", diff.by_function().head(top))
        _print_table(f"{execution}: device time by kernel (largest change first)", diff.by_kernel(top))


def _cmd_prompts(args: argparse.Namespace) -> int:
    """Write the first request the LLM generator would send for each hot function (JSONL), without calling an LLM."""
    import json

    from agent.cli_support import first_turn_requests
    from agent.generator import GeneratorOptions, LLMKernelGenerator
    from agent.llm import LLMConfig
    from forge.profiler import ModuleFunctionKernelProfiler

    device = _pick_device(args.device)
    if args.functions:
        _check_function_names([n.strip() for n in args.functions.split(",") if n.strip()], "--functions")
    if args.demo is not None:
        model, data, _ = _load_demo(args.demo, device)
    else:
        if not (args.target and args.inputs):
            raise UsageError("prompts: give --demo or a PKG.MODULE:FACTORY target with --inputs")
        model, data = load_target(args.target, device), load_inputs(args.inputs, device)
        check_first_forward(model, data, args.target)
    config = LLMConfig.from_env(**({"model": args.llm_model} if args.llm_model else {}))
    generator = LLMKernelGenerator(config, GeneratorOptions(
        functions=tuple(args.functions.split(",")) if args.functions else None, use_cache=False))
    names = set(generator.supports_functions())
    profile = ModuleFunctionKernelProfiler(names).profile(model, data)
    requests = first_turn_requests(generator, profile, [n for n in profile.functions if n in names])
    from forge.atomic import write_text_atomic

    write_text_atomic(args.out, "".join(json.dumps(item) + "\n" for item in requests))
    print(f"wrote {len(requests)} request(s) to {args.out}: {', '.join(r['function'] for r in requests)}")
    return 0


def _load_plan(path: str, trust_unsigned: bool = False) -> Any:
    """The plan at `path`; `UsageError` naming the problem when it cannot be loaded."""
    from forge.plan import KernelOptimizationPlan, PlanLoadError

    try:
        return KernelOptimizationPlan.load(path, trust_unsigned=trust_unsigned)
    except PlanLoadError as exc:
        raise UsageError(str(exc)) from exc


def _signature_line(plan: Any) -> str:
    check = plan.signature
    status = check.describe() if check is not None else "unsigned"
    if plan.carries_code and (check is None or not check.valid):
        status += " (loaded because of --trust-unsigned)"
    elif not plan.carries_code and (check is None or not check.valid):
        status += " (no generated code: a signature is not needed)"
    return f"signature: {status}"


def _cmd_plan_show(args: argparse.Namespace) -> int:
    """Print a plan; every text that comes from the file is printed with control characters escaped."""
    plan = _load_plan(args.path, args.trust_unsigned)
    env = plan.environment
    say = lambda text: print(printable(text))  # noqa: E731
    say(f"plan {args.path}: {len(plan)} replacement(s)")
    say(_signature_line(plan))
    if env:
        gpu = env.get("gpu_name") or "CPU"
        say(f"measured on {gpu} (cc {env.get('compute_capability')}), torch {env.get('torch')}, "
            f"triton {env.get('triton')}, CUDA {env.get('cuda')}")
    _print_table("plan", plan.summary())
    for entry in plan.entries:
        print()
        say(f"{entry.function} -> {entry.provider.name} ({entry.source}); validated signatures:")
        for sample in entry.signatures:
            say(f"  {entry.function}{sample.describe()}")
    return 0


def _cmd_plan_verify(args: argparse.Namespace) -> int:
    """Re-validate every kernel of a saved plan on fresh inputs drawn from its signatures, on this machine; each
    kernel in its own process, stopped after `--timeout` seconds (`forge.verify`)."""
    from forge.plan import PlanLoadError
    from forge.verify import VerifySettings, verify_plan_file

    plan = _load_plan(args.path, args.trust_unsigned)
    print(printable(f"plan {args.path}: {_signature_line(plan)}"))
    try:
        results = verify_plan_file(args.path, VerifySettings(timeout_s=args.timeout,
                                                             trust_unsigned=args.trust_unsigned))
    except PlanLoadError as exc:
        raise UsageError(str(exc)) from exc
    for result in results:
        print(printable(f"{result.function}: {result.status.value}"))
        for error in result.errors[:5]:
            print(f"  {_clip(error, 300)}")
    passed = sum(result.ok for result in results)
    print(f"{passed} of {len(results)} kernel(s) verified")
    return 0 if passed == len(results) else 1


def _cmd_plan_sign(args: argparse.Namespace) -> int:
    """Sign a plan after reviewing it: the file must load (schema, provider types, every source screened, nothing
    imported); its document is signed as it is (a previous signature replaced) and written back atomically."""
    from forge.atomic import write_json_atomic
    from forge.plan_schema import read_plan_json
    from forge.signing import load_key, sign_document

    _load_plan(args.path, trust_unsigned=True)
    data = read_plan_json(args.path)
    try:
        key = load_key(create=True)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read or create the signing key: {exc}") from exc
    assert key is not None  # create=True
    if key.created:
        print(printable(f"created a new signing key in {key.origin} (mode 0600); keep it private"))
    signed = sign_document(data, key)
    write_json_atomic(Path(args.path), signed, indent=2, allow_nan=False)
    block = signed["signature"]
    print(printable(f"signed {args.path} as {block['signer']} (key {block['key_id']}, from {key.origin})"))
    return 0


def _cmd_plan_export_kernels(args: argparse.Namespace) -> int:
    """Write a plan's module kernels as a local `kernels` repository (`forge.hub_kernels`), print its mapping (also
    written to DIR/kernel_mapping.json) and how to load it."""
    import json

    from forge.hub_kernels import export_kernels

    plan = _load_plan(args.path, args.trust_unsigned)
    export = export_kernels(plan, args.out, name=args.name, overwrite=args.overwrite)
    for function, why in export.skipped:
        print(printable(f"skipped {function}: {why}"))
    print(printable(f"exported {len(export.exported)} module kernel(s) to {export.path} "
                    f"(package {export.package.name}, module id {export.module_id}); mapping "
                    f"({export.mapping_path}):"))
    lines = [*json.dumps(export.mapping, indent=2).splitlines(), "to load it:", *export.instructions().splitlines()]
    for line in lines:
        print(printable(line))
    _report_saved_signature(export.plan, export.plan_path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kforge", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v for INFO logs, -vv for DEBUG")
    sub = parser.add_subparsers(dest="command", required=True)

    opt = sub.add_parser("optimize", help="profile a model and build a plan of faster kernels")
    opt.add_argument("target", nargs="?", help="PKG.MODULE:FACTORY returning an nn.Module")
    opt.add_argument("--demo", nargs="?", const="llama", metavar="NAME",
                     help="optimize an embedded demo: llama (default: a decoder at prefill) or unet (a diffusion UNet)")
    opt.add_argument("--inputs", help="PKG.MODULE:INPUTS giving the input samples")
    opt.add_argument("--out", type=output_file_argument,
                     help="where to save the plan (JSON); its folder must exist (checked before any work)")
    opt.add_argument("--device", default="auto", type=device_argument,
                     help="auto (CUDA when available), cpu, cuda, cuda:N")
    opt.add_argument("--compile-mode", default="default",
                     choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                     help="torch.compile mode of the compile variants (end-to-end check and --benchmark)")
    opt.add_argument("--execution", default="eager", choices=["eager", "cuda_graphs", "compile"],
                     help="how the model will run: eager (host-inclusive timing), cuda_graphs or compile (kernels "
                     "selected on device time; the end-to-end check runs that way). Recorded in the plan")
    opt.add_argument("--benchmark", action="store_true",
                     help="also time the whole model: eager, CUDA graphs and torch.compile(model), each with and "
                     "without the plan")
    opt.add_argument("--no-static", action="store_true", help="skip the built-in static providers")
    opt.add_argument("--no-graphs", action="store_true",
                     help="in eager execution on CUDA, do not try the model's blocks replayed from CUDA graphs")
    opt.add_argument("--no-end-to-end-check", action="store_true",
                     help="keep per-function winners without timing the whole model with and without them")
    opt.add_argument("--provider-threshold", type=percent_argument, default=0.0, metavar="PCT",
                     help="minimum time share for static providers (default 0)")
    opt.add_argument("--module-threshold", type=percent_argument, default=MODULE_MIN_SHARE_PERCENT, metavar="PCT",
                     help="minimum share of kernel time outside F calls in a module class's own forward for a "
                          "module kernel (torch.compile of the class's forward, and a generated ModelNew when an "
                          "LLM is configured; default 1)")
    opt.add_argument("--modules", nargs="+", default=None, metavar="CLASS",
                     help="only these module classes get module kernels (bare or qualified names, or the layer name "
                          "the library declares, e.g. LlamaRMSNorm or RMSNorm)")
    opt.add_argument("--generator-threshold", type=percent_argument, default=10.0, metavar="PCT",
                     help="minimum time share for kernel generation (default 10)")
    opt.add_argument("--generation-timeout", type=seconds_argument, default=None, metavar="S",
                     help="seconds to wait for generated kernels, and again for module conversations (default: "
                          "$KFORGE_GENERATION_TIMEOUT or 21600)")
    opt.add_argument("--no-generate", action="store_true", help="do not use the LLM kernel generator")
    try:
        from agent.cli_support import add_generator_arguments
    except ImportError:
        pass
    else:
        add_generator_arguments(opt)
    opt.set_defaults(func=_cmd_optimize)

    prompts = sub.add_parser("prompts", help="write the generator's first LLM request per hot function (no LLM call)")
    prompts.add_argument("target", nargs="?", help="PKG.MODULE:FACTORY returning an nn.Module")
    prompts.add_argument("--demo", nargs="?", const="llama", metavar="NAME", help="an embedded demo: llama or unet")
    prompts.add_argument("--inputs")
    prompts.add_argument("--device", default="auto", type=device_argument)
    prompts.add_argument("--functions", help="comma-separated function names (default: all the generator supports)")
    prompts.add_argument("--llm-model", help="model name recorded in the requests (default $KFORGE_LLM_MODEL)")
    prompts.add_argument("--out", required=True, type=output_file_argument, help="JSONL file to write")
    prompts.set_defaults(func=_cmd_prompts)

    plan = sub.add_parser("plan", help="inspect saved plans")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True)
    trust_help = ("load a plan holding generated code even when it is unsigned or its signature does not match "
                  "(its sources are still screened; sign it with `kforge plan sign` once reviewed)")
    show = plan_sub.add_parser("show", help="print a saved plan")
    show.add_argument("path")
    show.add_argument("--trust-unsigned", action="store_true", help=trust_help)
    show.set_defaults(func=_cmd_plan_show)
    sign = plan_sub.add_parser("sign", help="sign a reviewed plan with your key ($KFORGE_SIGNING_KEY, or the key "
                               "file ~/.config/kforge/signing.key, created on first use)")
    sign.add_argument("path")
    sign.set_defaults(func=_cmd_plan_sign)
    verify = plan_sub.add_parser("verify", help="re-validate a saved plan's kernels on fresh inputs on this machine")
    verify.add_argument("path")
    verify.add_argument("--timeout", type=positive_seconds_argument, default=DEFAULT_VERIFY_TIMEOUT_S, metavar="S",
                        help="seconds each kernel may take once its process has started; a kernel still running "
                        f"is stopped and reported as TIMEOUT (default {DEFAULT_VERIFY_TIMEOUT_S:g}); a generated "
                        "kernel first runs in the sandbox, which gets S + 30 s for its start-up")
    verify.add_argument("--trust-unsigned", action="store_true", help=trust_help)
    verify.set_defaults(func=_cmd_plan_verify)
    export = plan_sub.add_parser("export-kernels", help="write the plan's module kernels as a local `kernels` "
                                 "repository with its layer mapping (kernels.kernelize, transformers KernelConfig)")
    export.add_argument("path")
    export.add_argument("--out", required=True, metavar="DIR",
                        help="the repository folder to write (its parent must exist; a previous export there is "
                        "replaced)")
    export.add_argument("--name", help="the package name: lowercase letters, digits and dashes (default: kforge- and "
                        "the layer names)")
    export.add_argument("--overwrite", action="store_true", help="replace DIR even when it is a non-empty folder "
                        "that is not a previous export")
    export.add_argument("--trust-unsigned", action="store_true", help=trust_help)
    export.set_defaults(func=_cmd_plan_export_kernels)

    try:
        from evals.cli import add_eval_parser
    except ImportError:
        pass
    else:
        add_eval_parser(sub)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line (`kforge optimize: error: argument --out: ...`, exit
    status 2) instead of the usage block followed by the error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {printable(message)} (see `{self.prog} -h`)\n")


def use_triton_interpreter_on_cpu(args: argparse.Namespace) -> None:
    """Without CUDA (or with `--device cpu`), export `TRITON_INTERPRET=1` unless the user set it.

    Generated Triton kernels are validated in a sandbox that runs CPU tensors under the interpreter; without the
    variable the same kernel then failed in this process ('0 active drivers') and was silently never used. Triton
    reads the variable when `@triton.jit` decorates a function (`triton.knobs.runtime.interpret`, read from the
    environment at each access in triton 3.4+, including 3.6 and 3.9), so setting it before any generated kernel is
    imported is enough; the verify and sandbox child processes inherit it.
    """
    if "TRITON_INTERPRET" in os.environ:
        return
    device = getattr(args, "device", None)
    if not torch.cuda.is_available() or (isinstance(device, str) and device == "cpu"):
        os.environ["TRITON_INTERPRET"] = "1"
        logger.debug("no CUDA device in use: TRITON_INTERPRET=1 so Triton kernels run on CPU tensors")


def _crash_log(argv: Sequence[str] | None) -> Path:
    """Write the current exception's traceback to a log file (cache folder, else the temp folder); its path."""
    text = f"kforge {' '.join(argv if argv is not None else sys.argv[1:])}\n\n{traceback.format_exc()}"
    stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    from forge.env import cache_root

    folder = cache_root() / "logs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"kforge-crash-{stamp}-{os.getpid()}.log"
        path.write_text(text)
        return path
    except OSError:
        handle, name = tempfile.mkstemp(prefix=f"kforge-crash-{stamp}-", suffix=".log")
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        return Path(name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `kforge`. Exit status: 0 ok; 1 a command's negative result (a kernel failed verification) or an internal
    error (a bug: one line naming the log file with the traceback); 2 a usage error (one line on stderr). `-v`
    adds the traceback of a usage error and lets an internal error propagate."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    use_triton_interpreter_on_cpu(args)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"kforge: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.verbose:
            raise
        log = _crash_log(argv)
        print(f"kforge: internal error (a bug): {_describe_exception(exc)}; full traceback in {log}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
