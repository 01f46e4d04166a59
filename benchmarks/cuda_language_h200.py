"""CUDA as a kernel language on the H200: compile times, launch overhead, correctness, faults (issue 12).

Measures, for the hand-written CUDA candidates in `agent.languages.cuda.reference_candidates` and the prompt's
CUDA example (silu):

1. compile time per backend (NVRTC in process, nvcc -cubin, torch `load_inline`): cold process + cold cache, warm
   process + cold cache, cache hit; `load_cuda` from the cache in a fresh process (what a sandbox child pays);
2. parallel builds (`BuildPool`) with 1..16 threads: candidates compiled per second;
3. host time per call (launch overhead) at tiny sizes: CUDA through the ctypes cubin launcher and through the
   `load_inline` extension, against a Triton kernel for the same op loaded by `TritonLanguage` (cached launchers)
   and against PyTorch eager; plus a CUDA-graph replay check;
4. correctness against PyTorch for fp32/fp16/bf16 on every backend, and through the judge (`Judge.judge_source`,
   language "cuda", validated and benchmarked);
5. an out-of-bounds kernel: in a raw child process and through the sandbox; the parent must stay usable.

Usage (on the GPU host, repository root):
`python3 benchmarks/cuda_language_h200.py [--quick] [--only compile,launch,...] [--backends nvrtc,nvcc,load_inline]`;
writes `$OUT/cuda_language_h200.json` and `$OUT/cuda_language_h200.md` (./cuda_language_out when $OUT is unset).
`--backends nvrtc` leaves out the others (a cold `load_inline` build takes tens of seconds); the Triton and PyTorch
rows of the launch section are measured whatever the backends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRITON_RMS_NORM = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _rms(x_ptr, w_ptr, y_ptr, n, eps, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    y = x * r
    if HAS_W:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_function(input, normalized_shape, weight=None, eps=None):
    n = input.shape[-1]
    out = torch.empty_like(input)
    _rms[(input.numel() // n,)](input, input if weight is None else weight, out, n,
                                1.1920928955078125e-07 if eps is None else eps, HAS_W=weight is not None,
                                BLOCK=triton.next_power_of_2(n))
    return out
'''


def _sources() -> dict[str, str]:
    from agent.languages import get_language
    from agent.languages.cuda.reference_candidates import GROUP_NORM_FILE, RMS_NORM_FILE

    example = get_language("cuda").prompt_fragments().example_file.read_text()
    return {"silu": example, "rms_norm": RMS_NORM_FILE, "group_norm": GROUP_NORM_FILE}


def _cuda_src(name: str) -> str:
    from agent.languages.cuda.source import extract_cuda_source

    return extract_cuda_source(_sources()[name])[0]  # type: ignore[index]


# ------------------------------------------------------------------------------------------------ child modes
def child_compile(backend: str, name: str, cache: str, nonce: str) -> dict:
    """In a fresh process: cold-process build, warm-process build of another variant, cache hit, load from cache."""
    t0 = time.perf_counter()
    import torch

    from agent.languages.cuda.build import build_cubin
    from agent.languages.cuda.runtime import load_cuda
    from agent.languages.cuda.toolchain import toolchain

    out: dict = {"import_s": time.perf_counter() - t0}
    torch.cuda.init()
    src = _cuda_src(name)
    first, second = f"{src}\n// nonce {nonce} a\n", f"{src}\n// nonce {nonce} b\n"
    if backend == "load_inline":
        t = time.perf_counter()
        load_cuda(first, backend="load_inline", cache_dir=cache)
        out["build_and_load_s"] = time.perf_counter() - t
        return out
    chain = toolchain(backend)
    t = time.perf_counter()
    build_cubin(first, chain, cache)
    out["cold_process_s"] = time.perf_counter() - t
    t = time.perf_counter()
    build_cubin(second, chain, cache)
    out["warm_process_s"] = time.perf_counter() - t
    t = time.perf_counter()
    hit = build_cubin(second, chain, cache)
    out["cache_hit_s"] = time.perf_counter() - t
    out["cached"] = hit.cached
    t = time.perf_counter()
    load_cuda(second, backend=backend, cache_dir=cache)
    out["load_cuda_from_cache_s"] = time.perf_counter() - t
    return out


def child_load_cached(backend: str, name: str, cache: str, nonce: str) -> dict:
    """In a fresh process: `load_cuda` of a source built earlier into `cache` (what a sandbox child pays)."""
    import torch

    from agent.languages.cuda.runtime import load_cuda

    torch.cuda.init()
    src = f"{_cuda_src(name)}\n// nonce {nonce} a\n"
    t = time.perf_counter()
    handle = load_cuda(src, backend=backend, cache_dir=cache)
    return {"load_cuda_s": time.perf_counter() - t, "backend": handle.backend}


def child_fault(cache: str) -> dict:
    """Run an rms_norm whose store is 2^40 elements out of bounds; report what the child saw."""
    import torch

    from agent.languages.cuda.reference_candidates import RMS_NORM_FILE
    from agent.languages.cuda.runtime import load_cuda  # noqa: F401 - imported by the file

    os.environ["KFORGE_CUDA_CACHE"] = cache
    faulting = RMS_NORM_FILE.replace("store(yr + i, v);", "store(yr + i + (1ll << 40), v);")
    path = Path(tempfile.mkdtemp()) / "faulting.py"
    path.write_text(faulting)
    from agent.languages import get_language

    fn = get_language("cuda").load(path, "kforge_bench_faulting")
    x = torch.randn(8, 4096, device="cuda")
    try:
        fn(x, (4096,))
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the point: what does the child see
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"raised": None}


def _run_child(mode: str, *args: str, timeout: float = 400) -> dict:
    cmd = [sys.executable, __file__, f"--child-{mode}", *args]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(last[-1]) if last else {}
    result.update(returncode=proc.returncode, process_wall_s=round(wall, 3))
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr[-1500:]
    return result


# ------------------------------------------------------------------------------------------------ measurements
BACKENDS = ("nvrtc", "nvcc", "load_inline")


def measure_compile(quick: bool, work: Path, backends: tuple[str, ...] = BACKENDS) -> dict:
    results: dict = {}
    names = ["rms_norm"] if quick else ["silu", "rms_norm", "group_norm"]
    for backend in (b for b in ("nvrtc", "nvcc") if b in backends):
        for name in names:
            cache = work / f"compile_{backend}_{name}"
            results[f"{backend}/{name}"] = _run_child("compile", backend, name, str(cache), "1")
            results[f"{backend}/{name}"]["fresh_process_load"] = _run_child("load", backend, name, str(cache), "1")
    if "load_inline" not in backends:
        return results
    cache = work / "compile_load_inline"
    cold = _run_child("compile", "load_inline", "rms_norm", str(cache), "1", timeout=580)
    warm = _run_child("compile", "load_inline", "rms_norm", str(cache), "1", timeout=580)
    results["load_inline/rms_norm"] = {"cold": cold, "cached_fresh_process": warm}
    return results


def measure_parallel(work: Path, quick: bool, backends: tuple[str, ...] = BACKENDS) -> dict:
    from agent.languages.cuda.build import BuildPool
    from agent.languages.cuda.toolchain import toolchain

    src = _cuda_src("rms_norm")
    n = 8 if quick else 16
    out: dict = {"candidates": n, "cpu_count": os.cpu_count()}
    for backend in (b for b in ("nvrtc", "nvcc") if b in backends):
        for workers in (1, 4, 8, 16):
            if quick and workers not in (1, 8):
                continue
            cache = work / f"parallel_{backend}_{workers}"
            variants = [f"{src}\n// variant {backend} {workers} {i}\n" for i in range(n)]
            t = time.perf_counter()
            with BuildPool(toolchain(backend), cache, max_workers=workers) as pool:
                for future in pool.map(variants):
                    future.result()
            wall = time.perf_counter() - t
            out[f"{backend}/workers={workers}"] = {"wall_s": round(wall, 3), "per_s": round(n / wall, 2)}
    return out


def host_us(fn, calls: int, reps: int = 5) -> float:
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    values = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        values.append((time.perf_counter() - t) / calls * 1e6)
    return round(statistics.median(values), 3)


def _load(language: str, source: str, work: Path, name: str):
    from agent.languages import get_language

    path = work / f"{name}.py"
    path.write_text(source)
    return get_language(language).load(path, f"kforge_bench_{name}")


def measure_launch(work: Path, quick: bool, backends: tuple[str, ...] = BACKENDS) -> dict:
    import torch
    import torch.nn.functional as F

    from agent.examples import EXAMPLES_DIR
    from agent.languages.cuda.runtime import clear_loaded

    calls = 2000 if quick else 5000
    sources = _sources()
    out: dict = {"calls_per_rep": calls, "unit": "host microseconds per call (sync after the loop), median of 5"}
    x_rms = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    w_rms = torch.randn(4096, device="cuda", dtype=torch.float16)
    x_silu = torch.randn(4096, device="cuda", dtype=torch.float16)
    os.environ["KFORGE_CUDA_CACHE"] = str(work / "shared_cache")
    for backend in (b for b in ("nvrtc", "load_inline") if b in backends):
        os.environ["KFORGE_CUDA_BACKEND"] = backend
        clear_loaded()
        try:
            rms = _load("cuda", sources["rms_norm"], work, f"rms_{backend}")
            out[f"rms_norm/cuda_{backend}"] = host_us(lambda rms=rms: rms(x_rms, (4096,), w_rms), calls)
            torch.testing.assert_close(rms(x_rms, (4096,), w_rms), F.rms_norm(x_rms, (4096,), w_rms), atol=2e-3,
                                       rtol=2e-3)
            if backend == "nvrtc":
                silu = _load("cuda", sources["silu"], work, "silu_nvrtc")
                out["silu/cuda_nvrtc"] = host_us(lambda silu=silu: silu(x_silu), calls)
                from agent.languages.cuda.runtime import load_cuda

                handle = load_cuda(_cuda_src("rms_norm"))
                y = torch.empty_like(x_rms)
                raw = handle.rms_f16
                out["rms_norm/cuda_nvrtc_raw_launch"] = host_us(
                    lambda raw=raw, y=y: raw[1, 256](x_rms, w_rms, y, 4096, 1e-6), calls)
        except Exception as exc:  # noqa: BLE001 - record and go on to the other measurements
            out[f"rms_norm/cuda_{backend}_error"] = f"{type(exc).__name__}: {exc}"[:800]
    os.environ.pop("KFORGE_CUDA_BACKEND", None)
    trms = _load("triton", TRITON_RMS_NORM, work, "rms_triton")
    out["rms_norm/triton"] = host_us(lambda: trms(x_rms, (4096,), w_rms), calls)
    tsilu = _load("triton", (EXAMPLES_DIR / "triton_example.py").read_text(), work, "silu_triton")
    out["silu/triton"] = host_us(lambda: tsilu(x_silu), calls)
    out["rms_norm/torch"] = host_us(lambda: F.rms_norm(x_rms, (4096,), w_rms), calls)
    out["silu/torch"] = host_us(lambda: F.silu(x_silu), calls)
    # A CUDA launch inside a CUDA graph: capture one call, change the input, replay, compare.
    clear_loaded()
    os.environ["KFORGE_CUDA_BACKEND"] = "nvrtc"
    rms = _load("cuda", sources["rms_norm"], work, "rms_graph")
    x = torch.randn(64, 4096, device="cuda")
    rms(x, (4096,))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rms(x, (4096,))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    out["cuda_graph_replay_max_err"] = float((y - F.rms_norm(x, (4096,))).abs().max())
    out["rms_norm/cuda_nvrtc_graph_replay"] = host_us(graph.replay, calls)
    return out


def measure_correctness(work: Path, backends: tuple[str, ...] = BACKENDS) -> dict:
    import torch
    import torch.nn.functional as F

    from agent.languages.cuda.runtime import clear_loaded

    sources = _sources()
    out: dict = {}
    for backend in (b for b in BACKENDS if b in backends):
        os.environ["KFORGE_CUDA_BACKEND"] = backend
        os.environ["KFORGE_CUDA_CACHE"] = str(work / "shared_cache")
        clear_loaded()
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            key = f"{backend}/{str(dtype).removeprefix('torch.')}"
            try:
                tag = f"{backend}_{str(dtype)[6:]}"
                rms = _load("cuda", sources["rms_norm"], work, f"c_rms_{tag}")
                # load_inline: rms_norm only (each cold extension build costs tens of seconds)
                silu = _load("cuda", sources["silu"], work, f"c_silu_{tag}") if backend != "load_inline" else None
                gn = _load("cuda", sources["group_norm"], work, f"c_gn_{tag}") if backend != "load_inline" else None
                x = torch.randn(257, 4099, device="cuda", dtype=dtype)
                w = torch.randn(4099, device="cuda", dtype=dtype)
                g = torch.randn(8, 64, 17, 19, device="cuda", dtype=dtype)
                gw, gb = torch.randn(64, device="cuda", dtype=dtype), torch.randn(64, device="cuda", dtype=dtype)
                errors = {"rms_norm": (rms(x, (4099,), w).float() - F.rms_norm(x, (4099,), w).float()).abs().max()}
                if silu is not None and gn is not None:
                    errors["silu"] = (silu(x[:, ::3]).float() - F.silu(x[:, ::3]).float()).abs().max()
                    errors["group_norm"] = (gn(g, 16, gw, gb).float() - F.group_norm(g, 16, gw, gb).float()).abs().max()
                out[key] = {k: float(v.item()) for k, v in errors.items()}
            except Exception as exc:  # noqa: BLE001
                out[key] = {"error": f"{type(exc).__name__}: {exc}"[:800]}
    os.environ.pop("KFORGE_CUDA_BACKEND", None)
    return out


def measure_sandbox(work: Path) -> dict:
    import torch

    from agent.languages.cuda.reference_candidates import GROUP_NORM_FILE, RMS_NORM_FILE
    from forge.checking import KernelUtils
    from forge.judging import FunctionTarget, Judge, JudgeOptions
    from forge.samples import Sample
    from forge.sandbox import SandboxOptions

    os.environ["KFORGE_SANDBOX_CACHE_DIR"] = str(work / "sandbox_cache")
    utils = KernelUtils()
    cases = {
        "rms_norm": (RMS_NORM_FILE, [Sample((torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16), (4096,),
                                             torch.randn(4096, device="cuda", dtype=torch.bfloat16), 1e-6), {}),
                                     Sample((torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16), (4096,),
                                             torch.randn(4096, device="cuda", dtype=torch.bfloat16), 1e-6), {})]),
        "group_norm": (GROUP_NORM_FILE, [Sample((torch.randn(16, 128, 32, 32, device="cuda", dtype=torch.float16), 32,
                                                 torch.randn(128, device="cuda", dtype=torch.float16),
                                                 torch.randn(128, device="cuda", dtype=torch.float16)), {})]),
    }
    out: dict = {}
    # group_norm is compiled by the parent's build pool into the sandbox cache first (the child only loads the
    # cubin); rms_norm is compiled inside the child (needs the CUDA headers visible in the sandbox).
    from agent.languages import get_language

    language = get_language("cuda")
    judge = Judge(utils, JudgeOptions(SandboxOptions(timeout_s=400, allow_unsafe=True)))
    t = time.perf_counter()
    with language.build_pool(cache_dir=language.shared_cache()) as pool:
        prebuilt = pool.submit(GROUP_NORM_FILE).result()
    out["group_norm_prebuild"] = {"seconds": round(time.perf_counter() - t, 3), "cached": prebuilt.cached}
    for name, (source, samples) in cases.items():
        t = time.perf_counter()
        result = judge.judge_source(source, FunctionTarget(name, tuple(samples)), language)
        out[name] = {"status": result.status, "message": result.message[:300], "latency_ms": result.latency_ms,
                     "baseline_ms": result.baseline_ms, "wall_s": round(time.perf_counter() - t, 2)}
    faulting = RMS_NORM_FILE.replace("store(yr + i, v);", "store(yr + i + (1ll << 40), v);")
    one = FunctionTarget("rms_norm", tuple(cases["rms_norm"][1][:1]))
    result = judge.judge_source(faulting, one, language, benchmark=False)
    out["faulting_rms_norm"] = {"status": result.status, "message": result.message[:300]}
    broken = RMS_NORM_FILE.replace("rsqrtf(", "rsqrtf_missing(")
    result = judge.judge_source(broken, one, language, benchmark=False)
    out["compile_error"] = {"status": result.status, "compile_log": str(result.details.get("compile_log"))[:600]}
    out["parent_gpu_alive"] = torch.ones(1, device="cuda").item() == 1.0
    return out


def environment() -> dict:
    import torch

    from agent.languages.cuda.toolchain import cuda_include_dirs, default_backend, nvcc_version, nvrtc_version

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
           "nvrtc": nvrtc_version(), "nvcc": nvcc_version(), "default_backend": default_backend(),
           "include_dirs": cuda_include_dirs(), "cpu_count": os.cpu_count()}
    for module in ("triton", "cuda.core", "cuda.bindings", "cupy"):
        try:
            imported = __import__(module, fromlist=["__version__"])
            env[module] = getattr(imported, "__version__", "present")
        except Exception as exc:  # noqa: BLE001
            env[module] = f"missing ({type(exc).__name__})"
    return env


def summary_markdown(report: dict) -> str:
    lines = ["# CUDA language on the H200", "", "```json", json.dumps(report.get("environment"), indent=1), "```", ""]
    for section in ("compile", "parallel", "launch", "correctness", "sandbox", "fault_child"):
        lines += [f"## {section}", "", "```json", json.dumps(report.get(section), indent=1, default=str), "```", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sources, calls and worker counts")
    parser.add_argument("--child-compile", nargs=4, metavar=("BACKEND", "NAME", "CACHE", "NONCE"))
    parser.add_argument("--child-load", nargs=4, metavar=("BACKEND", "NAME", "CACHE", "NONCE"))
    parser.add_argument("--child-fault", nargs=1, metavar="CACHE")
    parser.add_argument("--only", default="", help="comma list of sections to run (default: all)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma list of CUDA build backends to measure (default: {','.join(BACKENDS)})")
    args = parser.parse_args()
    backends = tuple(b for b in args.backends.split(",") if b)
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: choose among {', '.join(BACKENDS)}")
    if args.child_compile:
        print(json.dumps(child_compile(*args.child_compile)))
        return 0
    if args.child_load:
        print(json.dumps(child_load_cached(*args.child_load)))
        return 0
    if args.child_fault:
        print(json.dumps(child_fault(*args.child_fault)))
        return 0
    out_dir = Path(os.environ.get("OUT") or "cuda_language_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kforge-cuda-bench-"))
    report: dict = {"environment": environment()}
    only = {s for s in args.only.split(",") if s}
    steps = {
        "compile": lambda: measure_compile(args.quick, work, backends),
        "parallel": lambda: measure_parallel(work, args.quick, backends),
        "launch": lambda: measure_launch(work, args.quick, backends),
        "correctness": lambda: measure_correctness(work, backends),
        "sandbox": lambda: measure_sandbox(work),
        "fault_child": lambda: _run_child("fault", str(work / "fault_cache")),
    }
    for name, step in steps.items():
        if only and name not in only:
            continue
        t = time.perf_counter()
        try:
            report[name] = step()
        except Exception:  # noqa: BLE001 - keep the other sections
            report[name] = {"error": traceback.format_exc()[-3000:]}
        if name == "fault_child":
            import torch

            report[name]["parent_gpu_alive_after"] = torch.ones(1, device="cuda").item() == 1.0
        report[f"{name}_section_s"] = round(time.perf_counter() - t, 1)
        print(f"[{name}] {time.perf_counter() - t:.1f} s: {json.dumps(report[name], default=str)[:1500]}", flush=True)
        suffix = "_" + "_".join(sorted(only)) if only else ""
        (out_dir / f"cuda_language_h200{suffix}.json").write_text(json.dumps(report, indent=1, default=str))
        (out_dir / f"cuda_language_h200{suffix}.md").write_text(summary_markdown(report))
    print(f"wrote {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
