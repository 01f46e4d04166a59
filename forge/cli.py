"""`kforge`: the command line.

    kforge optimize --demo [--out plan.json]                  optimize the embedded demo decoder
    kforge optimize PKG.MODULE:FACTORY --inputs PKG.MODULE:INPUTS [--out plan.json]
    kforge plan show plan.json                                print a saved plan
    kforge plan verify plan.json                              re-validate a saved plan's kernels on this machine
    kforge eval SUITE [...]                                   offline evals of kernel sources (see `kforge eval -h`)
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from forge.samples import Sample, map_values

__all__ = ["main", "load_target", "load_inputs"]

logger = logging.getLogger("forge.cli")


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
        raise SystemExit(f"kforge: {what} must look like PKG.MODULE:NAME, got {spec!r}")
    module_name, attr = spec.split(":", 1)
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"kforge: cannot import {module_name!r} for {what}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"kforge: module {module_name!r} has no attribute {attr!r} ({what})") from None


def _call_with_device(factory: Any, device: str) -> Any:
    if not callable(factory):
        return factory
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    return factory(device=device) if "device" in params else factory()


def load_target(spec: str, device: str) -> nn.Module:
    """`PKG.MODULE:FACTORY` -> an eval-mode module on `device` (FACTORY may be a module, a class or a function)."""
    target = _resolve(spec, "the model factory")
    model = target if isinstance(target, nn.Module) else _call_with_device(target, device)
    if not isinstance(model, nn.Module):
        raise SystemExit(f"kforge: {spec} returned {type(model).__name__}, expected a torch.nn.Module")
    return model.to(device).eval()


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
    argument tuples, kwargs dicts or single tensors."""
    value = _call_with_device(_resolve(spec, "the inputs"), device)
    if isinstance(value, (torch.Tensor, Sample, dict)):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise SystemExit(f"kforge: {spec} must give a non-empty list of samples, got {type(value).__name__}")
    return [_to_sample(item, device) for item in value]


def _pick_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("kforge: --device cuda requested but CUDA is not available")
    return requested


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
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


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


def _cmd_optimize(args: argparse.Namespace) -> int:
    from forge.checking import KernelUtils
    from forge.demo import demo_inputs, demo_model
    from forge.optimizer import KernelOptimizer
    from forge.providers import default_providers

    device = _pick_device(args.device)
    if args.demo == bool(args.target):
        raise SystemExit("kforge optimize: give either --demo or a PKG.MODULE:FACTORY target")
    if args.demo:
        model, data = demo_model(device), demo_inputs(device)
        label = "demo decoder"
    else:
        if not args.inputs:
            raise SystemExit("kforge optimize: a target needs --inputs PKG.MODULE:INPUTS")
        model, data = load_target(args.target, device), load_inputs(args.inputs, device)
        label = args.target
    params = sum(p.numel() for p in model.parameters())
    print(f"kforge: optimizing {label} ({params / 1e6:.1f}M parameters) on {device}, {len(data)} input sample(s)")

    providers = [] if args.no_static else default_providers(device)
    generators = _generators(args)
    optimizer = KernelOptimizer(
        kernel_providers=providers,
        kernel_generators=generators,
        kernel_utils=KernelUtils(),
        provider_min_time_share_percent=args.provider_threshold,
        generator_min_time_share_percent=args.generator_threshold,
        generation_timeout=args.generation_timeout,
        end_to_end_check=not args.no_end_to_end_check,
    )
    plan = optimizer.make_plan(model, data, execution=args.execution)
    _print_table("profile (time per forward pass)", optimizer.profile_summary)
    _print_table("candidates", optimizer.report)
    if optimizer.end_to_end is not None:
        _print_table("end-to-end check (the whole model with and without the selected kernels)", optimizer.end_to_end)
    _print_table("plan", plan.summary())
    if args.out:
        path = plan.save(args.out)
        print(f"\nplan saved to {path}")
    if args.benchmark:
        _end_to_end(model, data, plan)
    return 0


def _end_to_end(model: nn.Module, data: list[Sample], plan: Any, blocks: int = 6) -> None:
    """Whole-model latency in every execution mode with and without the plan (`forge.end_to_end`)."""
    from forge.end_to_end import compare_end_to_end

    report = compare_end_to_end(model, data, plan, blocks=blocks)
    _print_table(f"end-to-end latency (one pass over the inputs; {blocks} interleaved blocks; CUDA graphs timed by "
                 "replay, the others host-inclusive; outputs checked against eager)", report.frame())


def _cmd_prompts(args: argparse.Namespace) -> int:
    """Write the first request the LLM generator would send for each hot function (JSONL), without calling an LLM."""
    import json

    from agent.cli_support import first_turn_requests
    from agent.generator import LLMKernelGenerator
    from agent.llm import LLMConfig
    from forge.demo import demo_inputs, demo_model
    from forge.profiler import ModuleFunctionKernelProfiler

    device = _pick_device(args.device)
    if args.demo:
        model, data = demo_model(device), demo_inputs(device)
    else:
        if not (args.target and args.inputs):
            raise SystemExit("kforge prompts: give --demo or a PKG.MODULE:FACTORY target with --inputs")
        model, data = load_target(args.target, device), load_inputs(args.inputs, device)
    config = LLMConfig.from_env(**({"model": args.llm_model} if args.llm_model else {}))
    generator = LLMKernelGenerator(config, functions=args.functions.split(",") if args.functions else None,
                                   use_cache=False)
    names = set(generator.supports_functions())
    profile = ModuleFunctionKernelProfiler(names).profile(model, data)
    requests = first_turn_requests(generator, profile, [n for n in profile.functions if n in names])
    with open(args.out, "w") as handle:
        for item in requests:
            handle.write(json.dumps(item) + "\n")
    print(f"wrote {len(requests)} request(s) to {args.out}: {', '.join(r['function'] for r in requests)}")
    return 0


def _load_plan(path: str) -> Any:
    """The plan at `path`, or None after printing why it cannot be loaded."""
    from forge.plan import KernelOptimizationPlan, PlanLoadError

    try:
        return KernelOptimizationPlan.load(path)
    except PlanLoadError as exc:
        print(f"kforge: {exc}", file=sys.stderr)
        return None


def _cmd_plan_show(args: argparse.Namespace) -> int:
    plan = _load_plan(args.path)
    if plan is None:
        return 2
    env = plan.environment
    print(f"plan {args.path}: {len(plan)} replacement(s)")
    if env:
        gpu = env.get("gpu_name") or "CPU"
        print(f"measured on {gpu} (cc {env.get('compute_capability')}), torch {env.get('torch')}, "
              f"triton {env.get('triton')}, CUDA {env.get('cuda')}")
    _print_table("plan", plan.summary())
    for entry in plan.entries:
        print(f"\n{entry.function} -> {entry.provider.name} ({entry.source}); validated signatures:")
        for sample in entry.signatures:
            print(f"  {entry.function}{sample.describe()}")
    return 0


def _cmd_plan_verify(args: argparse.Namespace) -> int:
    """Re-validate every kernel of a saved plan on fresh inputs drawn from its signatures, on this machine."""
    plan = _load_plan(args.path)
    if plan is None:
        return 2
    failures = 0
    for function, errors in plan.verify().items():
        print(f"{function}: {'ok' if not errors else 'FAILED'}")
        for error in errors[:5]:
            print(f"  {_clip(error, 300)}")
        failures += bool(errors)
    print(f"{len(plan) - failures} of {len(plan)} kernel(s) verified")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kforge", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v for INFO logs, -vv for DEBUG")
    sub = parser.add_subparsers(dest="command", required=True)

    opt = sub.add_parser("optimize", help="profile a model and build a plan of faster kernels")
    opt.add_argument("target", nargs="?", help="PKG.MODULE:FACTORY returning an nn.Module")
    opt.add_argument("--demo", action="store_true", help="optimize the embedded Llama-style demo decoder")
    opt.add_argument("--inputs", help="PKG.MODULE:INPUTS giving the input samples")
    opt.add_argument("--out", help="where to save the plan (JSON)")
    opt.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    opt.add_argument("--execution", default="eager", choices=["eager", "cuda_graphs", "compile"],
                     help="how the model will run: eager (host-inclusive timing), cuda_graphs or compile (kernels "
                     "selected on device time; the end-to-end check runs that way). Recorded in the plan")
    opt.add_argument("--benchmark", action="store_true",
                     help="also time the whole model: eager, CUDA graphs and torch.compile(model), each with and "
                     "without the plan")
    opt.add_argument("--no-static", action="store_true", help="skip the built-in static providers")
    opt.add_argument("--no-end-to-end-check", action="store_true",
                     help="keep per-function winners without timing the whole model with and without them")
    opt.add_argument("--provider-threshold", type=float, default=0.0, metavar="PCT",
                     help="minimum time share for static providers (default 0)")
    opt.add_argument("--generator-threshold", type=float, default=10.0, metavar="PCT",
                     help="minimum time share for kernel generation (default 10)")
    opt.add_argument("--generation-timeout", type=float, default=None, metavar="S",
                     help="seconds to wait for generated kernels (default: $KFORGE_GENERATION_TIMEOUT or 21600)")
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
    prompts.add_argument("--demo", action="store_true")
    prompts.add_argument("--inputs")
    prompts.add_argument("--device", default="auto")
    prompts.add_argument("--functions", help="comma-separated function names (default: all the generator supports)")
    prompts.add_argument("--llm-model", help="model name recorded in the requests (default $KFORGE_LLM_MODEL)")
    prompts.add_argument("--out", required=True, help="JSONL file to write")
    prompts.set_defaults(func=_cmd_prompts)

    plan = sub.add_parser("plan", help="inspect saved plans")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True)
    show = plan_sub.add_parser("show", help="print a saved plan")
    show.add_argument("path")
    show.set_defaults(func=_cmd_plan_show)
    verify = plan_sub.add_parser("verify", help="re-validate a saved plan's kernels on fresh inputs on this machine")
    verify.add_argument("path")
    verify.set_defaults(func=_cmd_plan_verify)

    try:
        from evals.cli import add_eval_parser
    except ImportError:
        pass
    else:
        add_eval_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
