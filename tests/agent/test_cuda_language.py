"""CUDA C++ as a kernel language: registration, prompts, replies, screening, builds, diagnostics, launches.

CPU tests compile for sm_90 without a GPU (nvcc `-cubin`, NVRTC via `$KFORGE_NVRTC_LIBRARY` or the nvidia wheel)
and skip with the reason when no compiler is present. `@pytest.mark.cuda` tests load and run kernels on a GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import torch

from agent.languages import CudaLanguage, get_language, language_names
from agent.languages.cuda.build import build_cubin, build_key
from agent.languages.cuda.diagnostics import CudaCompileError, format_diagnostics, parse_compiler_output
from agent.languages.cuda.reference_candidates import GROUP_NORM_FILE, RMS_NORM_FILE
from agent.languages.cuda.source import extract_cuda_source, parse_kernels
from agent.languages.cuda.toolchain import TOOLCHAIN_ENV, Toolchain, find_nvcc, nvrtc_library, toolchain

CUDA = get_language("cuda")
EXAMPLE = CUDA.prompt_fragments().example_file.read_text()
HAS_NVCC = find_nvcc() is not None
HAS_NVRTC = nvrtc_library() is not None
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="no nvcc on this machine (PATH, CUDA_HOME, /usr/local/cuda)")
needs_nvrtc = pytest.mark.skipif(not HAS_NVRTC, reason="no libnvrtc (set KFORGE_NVRTC_LIBRARY or install "
                                 "nvidia-cuda-nvrtc)")
needs_compiler = pytest.mark.skipif(not (HAS_NVCC or HAS_NVRTC), reason="neither nvcc nor NVRTC is available")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CPU_BACKEND = "nvrtc" if HAS_NVRTC else "nvcc"


def cuda_of(file_source: str) -> str:
    extracted = extract_cuda_source(file_source)
    assert extracted is not None
    return extracted[0]


# ---------------------------------------------------------------------------------------------------------
# Registration, prompts, replies
# ---------------------------------------------------------------------------------------------------------
def test_cuda_is_registered_beside_triton() -> None:
    assert {"cuda", "triton"} <= set(language_names())
    assert isinstance(CUDA, CudaLanguage) and CUDA.entry_point == "kernel_function"
    assert {"cuda", "python"} <= set(CUDA.fence_tags)
    assert CUDA.device_types() == ("cuda",)


class _Task:
    kind = "function"
    qualified_name = "torch.nn.functional.rms_norm"
    has_inplace = False
    has_fp32 = True


@pytest.mark.parametrize("kind", ["function", "module"])
def test_prompt_fragments_render_strictly_and_name_the_cuda_format(kind: str) -> None:
    fragments = CUDA.prompt_fragments()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(fragments.template_dir)),
                             undefined=jinja2.StrictUndefined)
    task = _Task()
    task.kind = kind
    rendered = {name: env.get_template(name).render(task=task) for name in
                (fragments.system_rules, fragments.rules, fragments.speed, fragments.example_intro)}
    assert 'extern "C" __global__' in rendered[fragments.rules]
    assert "load_cuda(CUDA_SRC)" in rendered[fragments.rules]
    assert ("kernel_function" in rendered[fragments.rules]) == (kind == "function")
    assert "```python" in rendered[fragments.system_rules]
    assert "@triton.jit" not in "".join(rendered.values())
    assert "see rule 6" in rendered[fragments.speed]  # the fp32 rule's number in CUDA's list
    assert fragments.display_name == "CUDA C++" and fragments.reply_fence in CUDA.fence_tags


def test_example_file_is_an_honest_candidate() -> None:
    assert "CUDA_SRC = r" in EXAMPLE and "def kernel_function(input, inplace=False)" in EXAMPLE
    assert CUDA.screen(EXAMPLE, "silu") == []
    names = [k.name for k in parse_kernels(cuda_of(EXAMPLE))]
    assert names == ["silu_f32", "silu_f16", "silu_bf16"]


def test_reply_with_a_cuda_fence_is_extracted() -> None:
    reply = f"Here is the kernel.\n\n```cuda\n{RMS_NORM_FILE}```\nDone."
    extracted = CUDA.extract_reply(reply)
    assert extracted is not None and extracted.code.strip() == RMS_NORM_FILE.strip()
    assert CUDA.screen(extracted.code, "rms_norm") == []


def test_reply_split_into_python_and_cuda_blocks_is_spliced() -> None:
    cuda_source = cuda_of(RMS_NORM_FILE)
    launcher = RMS_NORM_FILE.replace(f'CUDA_SRC = r"""{cuda_source}"""\n', "")
    assert "CUDA_SRC = r" not in launcher
    reply = f"Device code:\n```cuda\n{cuda_source.strip()}\n```\nLauncher:\n```python\n{launcher}```\n"
    extracted = CUDA.extract_reply(reply)
    assert extracted is not None and "separate CUDA block" in extracted.note
    assert extract_cuda_source(extracted.code) is not None
    assert CUDA.screen(extracted.code, "rms_norm") == []


def test_reply_without_a_kernel_function_gives_nothing() -> None:
    assert CUDA.extract_reply("```cuda\nextern \"C\" __global__ void k(float* x) {}\n```") is None
    assert CUDA.extract_reply("no code at all") is None


# ---------------------------------------------------------------------------------------------------------
# Screening
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,source", [("rms_norm", RMS_NORM_FILE), ("group_norm", GROUP_NORM_FILE),
                                         ("silu", EXAMPLE)])
def test_honest_kernels_pass_screening(name: str, source: str) -> None:
    assert CUDA.screen(source, name) == []


def _line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if needle in line)


ANCHOR = "  const T* xr = x + blockIdx.x * n;"  # a line inside rms_row's body


@pytest.mark.parametrize(
    "inserted,construct,reason",
    [
        ("  at::Tensor t = at::empty({1});", "ATen", "ATen"),
        ("  auto s = torch::sum(x);", "ATen", "ATen"),
        ("  asm volatile(\"membar.gl;\");", "asm", "inline PTX"),
        ("  printf(\"%d\", 1);", "printf", "printf"),
        ("  float* p = (float*)malloc(16);", "malloc", "device-heap"),
        ("  cudaStream_t s; cudaStreamCreate(&s);", "cudaStream_t", "runtime API"),
        ("  cudaDeviceSynchronize();", "cudaDeviceSynchronize", "runtime API"),
        ("  long long t0 = clock64();", "clock64", "clocks"),
        ("  other_kernel<<<1, 32>>>(y);", "<<<", "launch"),
        ("  cublasSgemm(0);", "cublasSgemm", "library"),
    ],
)
def test_screening_rejects_each_forbidden_device_construct(inserted: str, construct: str, reason: str) -> None:
    bad = RMS_NORM_FILE.replace(ANCHOR, ANCHOR + "\n" + inserted)
    violations = CUDA.screen(bad, "rms_norm")
    hits = [v for v in violations if v.construct == construct]
    assert hits, violations
    assert hits[0].line == _line_of(bad, inserted.strip()), (hits[0], inserted)
    assert reason in hits[0].message and hits[0].kind == "forbidden"


@pytest.mark.parametrize(
    "old,new,construct,reason",
    [
        ("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n#include <ATen/ATen.h>", "#include", "ATen/torch headers"),
        ("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n#include <cstdio>", "#include", "allow-list"),
        ("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n#include \"mine.h\"", "#include", "quoted"),
        ("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n#define CAT(a, b) a##b", "##", "token pasting"),
        ("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n#line 7 \"x.cu\"", "#line", "#line"),
        ("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n__device__ float cached_out[4096];", "__device__ variable",
         "between calls"),
        ("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n__managed__ int flag;", "__managed__", "unified"),
        ('extern "C" __global__ void rms_f32(', '__global__ void rms_f32(', "rms_f32", 'extern "C"'),
        ("float eps) {\n  rms_row", "float& eps) {\n  rms_row", "rms_f32", "reference"),
    ],
    ids=["aten-header", "host-header", "quoted-include", "token-pasting", "line-directive", "device-global",
         "managed", "no-extern-c", "reference-param"],
)
def test_screening_rejects_bad_declarations_with_line_and_reason(old: str, new: str, construct: str,
                                                                 reason: str) -> None:
    assert old in RMS_NORM_FILE
    bad = RMS_NORM_FILE.replace(old, new, 1)
    hits = [v for v in CUDA.screen(bad, "rms_norm") if v.construct == construct]
    assert hits and reason in hits[0].message, CUDA.screen(bad, "rms_norm")
    needle = "void rms_f32(" if construct == "rms_f32" else new.splitlines()[-1].strip()
    assert hits[0].line == _line_of(bad, needle)


def test_screening_ignores_banned_words_in_comments_and_strings_and_allows_constant_tables() -> None:
    ok = RMS_NORM_FILE.replace(ANCHOR, ANCHOR + "\n  // printf, malloc, asm, cudaMalloc and at::sum are only words"
                               "\n  const char* note = \"clock64 <<< torch::\";")
    ok = ok.replace("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n__constant__ float table[2] = {1.0f, 2.0f};"
                    "\n__device__ const float half_pi = 1.5707963f;")
    assert CUDA.screen(ok, "rms_norm") == []


@pytest.mark.parametrize(
    "old,new,reason",
    [
        ("kernels = load_cuda(CUDA_SRC)", "kernels = load_cuda(CUDA_SRC + '')", "exactly"),
        ("kernels = load_cuda(CUDA_SRC)", "kernels = load_cuda('extern')", "exactly"),
        ("CUDA_SRC = r\"\"\"", "CUDA_SRC = str() + r\"\"\"", "string literal"),
        ("    out = torch.empty_like(input)\n    rows",
         "    out = torch.empty_like(input)\n    kernels.rms_f64\n    rows", "no extern"),
        ("    out = torch.empty_like(input)\n    rows", "    out = (input * input).sqrt()\n    rows", "sqrt"),
        ("from agent.languages.cuda.runtime import load_cuda",
         "from agent.languages.cuda.runtime import load_cuda\nfrom agent.languages.cuda.build import build_cubin",
         "not available"),
        ("import math", "import math\nimport ctypes", "ctypes"),
    ],
)
def test_screening_rejects_launcher_problems(old: str, new: str, reason: str) -> None:
    assert old in RMS_NORM_FILE
    violations = CUDA.screen(RMS_NORM_FILE.replace(old, new, 1), "rms_norm")
    assert any(reason in v.message for v in violations), violations


def test_screening_requires_a_launch_from_kernel_function() -> None:
    launch = "    _BY_DTYPE[input.dtype][rows, block](input, weight, out, n, _FP32_EPS if eps is None else eps)\n"
    assert launch in RMS_NORM_FILE
    violations = CUDA.screen(RMS_NORM_FILE.replace(launch, ""), "rms_norm")
    assert any("never launches" in v.message for v in violations), violations


def test_kernel_parameters_are_parsed_by_declared_type() -> None:
    (kernel,) = parse_kernels('extern "C" __global__ void __launch_bounds__(256) k(const float* __restrict__ x, '
                              "int n, unsigned m, int64_t big, size_t sz, float eps, double d, bool flag, "
                              "float y[]) {}")
    assert kernel.extern_c and kernel.params is not None
    assert [p.kind for p in kernel.params] == ["ptr", "i32", "u32", "i64", "u64", "f32", "f64", "bool", "ptr"]
    (bad,) = parse_kernels('extern "C" __global__ void k(float2 v) {}')
    assert bad.params is None and "float2" in (bad.problem or "")


@pytest.mark.parametrize("checked_packing", [False, True], ids=["converters", "struct-packing"])
def test_launch_arguments_are_checked_against_the_kernel_signature(checked_packing: bool) -> None:
    import struct

    from agent.languages.cuda.runtime import _STRUCT_CODES, CudaLaunchError, _Kernel

    (sig,) = parse_kernels('extern "C" __global__ void k(float* x, int n, float eps) {}')
    packer = struct.Struct("@" + "".join(_STRUCT_CODES[p.kind] for p in sig.params or ()))
    launched: list[tuple] = []

    def launch(grid, block, shared, values):  # what the cubin launcher does before cuLaunchKernel
        packer.pack(*values)
        launched.append((grid, block, shared, tuple(values)))

    kernel = _Kernel(sig, launch, checked_packing=checked_packing)
    with pytest.raises(CudaLaunchError, match="CUDA tensors"):
        kernel[4, 128](torch.zeros(4), 4, 1e-5)
    with pytest.raises(CudaLaunchError, match="does not fit int"):
        kernel[4, 128](None, 2**31, 1e-5)
    with pytest.raises(CudaLaunchError, match="must be an int"):
        kernel[4, 128](None, 4.0, 1e-5)
    with pytest.raises(CudaLaunchError, match="takes 3 arguments"):
        kernel[4, 128](None, 4)
    with pytest.raises(CudaLaunchError, match="grid"):
        kernel[0, 128](None, 4, 1e-5)
    kernel[(2, 3), 128, 1024](None, 7, 1)
    assert launched == [((2, 3, 1), (128, 1, 1), 1024, (0, 7, 1.0))]
    assert kernel[(2, 3), 128, 1024] is kernel[(2, 3), 128, 1024]  # bound launchers are cached per config


def test_launch_observers_see_every_launch_until_removed() -> None:
    from agent.languages.cuda.runtime import _Kernel, add_launch_observer, remove_launch_observer

    (sig,) = parse_kernels('extern "C" __global__ void k(float* x, int n) {}')
    kernel = _Kernel(sig, lambda *a: None, checked_packing=True)
    seen: list[tuple] = []
    observer = lambda *record: seen.append(record)  # noqa: E731
    add_launch_observer(observer)
    try:
        kernel[8, 256](None, 3)
        kernel[(1, 2), (32, 4), 512](None, 3)
    finally:
        remove_launch_observer(observer)
    kernel[8, 256](None, 3)
    assert seen == [("k", (8, 1, 1), (256, 1, 1), 0), ("k", (1, 2, 1), (32, 4, 1), 512)]


# ---------------------------------------------------------------------------------------------------------
# Builds: real compilers, real diagnostics, the cache
# ---------------------------------------------------------------------------------------------------------
@needs_nvcc
@pytest.mark.parametrize("source", [RMS_NORM_FILE, GROUP_NORM_FILE, EXAMPLE], ids=["rms_norm", "group_norm", "silu"])
def test_nvcc_compiles_honest_kernels_for_sm90(tmp_path: Path, source: str) -> None:
    build = build_cubin(cuda_of(source), toolchain("nvcc", "sm_90"), tmp_path)
    assert not build.cached and build.cubin()[:4] == b"\x7fELF"  # a cubin is an ELF file


@needs_nvrtc
def test_nvrtc_compiles_the_rms_norm_kernel_for_sm90(tmp_path: Path) -> None:
    build = build_cubin(cuda_of(RMS_NORM_FILE), toolchain("nvrtc", "sm_90"), tmp_path)
    assert build.cubin()[:4] == b"\x7fELF"


@needs_compiler
def test_second_build_is_a_cache_hit_and_arch_is_part_of_the_key(tmp_path: Path) -> None:
    chain = toolchain(CPU_BACKEND, "sm_90")
    first = build_cubin(cuda_of(EXAMPLE), chain, tmp_path)
    second = build_cubin(cuda_of(EXAMPLE), chain, tmp_path)
    assert not first.cached and second.cached and second.path == first.path
    assert second.cubin() == first.cubin()
    assert build_key(cuda_of(EXAMPLE), toolchain(CPU_BACKEND, "sm_80")) != first.key
    assert list((tmp_path / "cubin").iterdir()) == [first.path]  # no temporaries left behind


TEMPLATE_ERROR = r"""
#include <cub/block/block_reduce.cuh>
template <typename T>
__device__ T twice(T v) { return v.doubled(); }
extern "C" __global__ void k(float* y, int n) {
  typedef cub::BlockReduce<float, 128> Reduce;
  __shared__ typename Reduce::TempStorage tmp;
  float s = Reduce(tmp).Sum(twice(y[threadIdx.x]));
  y[0] = s + undefined_name;
}
"""


@needs_compiler
def test_compile_errors_come_back_as_file_line_message(tmp_path: Path) -> None:
    with pytest.raises(CudaCompileError) as info:
        build_cubin(TEMPLATE_ERROR, toolchain(CPU_BACKEND, "sm_90"), tmp_path)
    error = info.value
    lines = {(d.file, d.line) for d in error.diagnostics}
    assert ("CUDA_SRC", 4) in lines and ("CUDA_SRC", 9) in lines, error.diagnostics
    assert all(d.severity == "error" for d in error.diagnostics)
    assert any("undefined_name" in d.message for d in error.diagnostics)
    assert any("instantiation" in d.message for d in error.diagnostics if d.line == 4)
    text = format_diagnostics(error.diagnostics, TEMPLATE_ERROR)
    assert "y[0] = s + undefined_name;" in text
    assert len(text) < len(error.log) and "^" not in text
    assert not list((tmp_path / "cubin").glob("*.cubin")) if (tmp_path / "cubin").exists() else True


@needs_nvcc
def test_ptxas_resource_errors_are_reported(tmp_path: Path) -> None:
    too_big = 'extern "C" __global__ void k(float* y) {\n  __shared__ float s[60000];\n  s[threadIdx.x] = 1.0f;\n' \
              "  __syncthreads();\n  y[threadIdx.x] = s[threadIdx.x + 1];\n}\n"
    with pytest.raises(CudaCompileError) as info:
        build_cubin(too_big, toolchain("nvcc", "sm_90"), tmp_path)
    assert any(d.file == "ptxas" and "shared" in d.message for d in info.value.diagnostics), info.value.log


@needs_nvcc
def test_load_inline_launchers_compile_with_nvcc(tmp_path: Path) -> None:
    from agent.languages.cuda.runtime import extension_sources, launchable

    cuda_source = cuda_of(GROUP_NORM_FILE)
    cpp_text, cuda_text, functions = extension_sources(cuda_source, launchable(parse_kernels(cuda_source)))
    assert functions == ["launch_gn_f32", "launch_gn_f16", "launch_gn_bf16"]
    assert all(f"void {f}(" in cpp_text for f in functions)
    (tmp_path / "ext.cu").write_text(cuda_text)
    done = subprocess.run([find_nvcc(), "-c", "-arch=sm_90", "-std=c++17", "-o", str(tmp_path / "ext.o"),
                           str(tmp_path / "ext.cu")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_diagnostic_parser_drops_noise_and_caps_the_list() -> None:
    log = "\n".join(
        [f"CUDA_SRC({i}): error: something wrong #{i}\n  code line\n      ^\n"
         f"          detected during instantiation of \"f<T>\" [with T=float] at line {i + 1}\n"
         f"          detected during instantiation of \"g<T>\" [with T=float] at line {i + 2}" for i in range(1, 20)]
        + ["CUDA_SRC(3): warning #177-D: variable \"x\" was declared but never referenced",
           "19 errors detected in the compilation of \"CUDA_SRC\"."]
    )
    diagnostics = parse_compiler_output(log)
    assert len(diagnostics) == 8 and all(d.severity == "error" for d in diagnostics)
    assert diagnostics[0].line == 1 and "at line 2" in diagnostics[0].message and "g<T>" not in diagnostics[0].message
    assert parse_compiler_output("CUDA_SRC(3): warning #177-D: variable \"x\" unused")[0].severity == "warning"


@needs_compiler
def test_build_pool_compiles_in_parallel_and_reports_failures_per_candidate(tmp_path: Path) -> None:
    broken = RMS_NORM_FILE.replace("const float r = rsqrtf", "const float r = rsqrtf_missing")
    with CUDA.build_pool(arch="sm_90", cache_dir=tmp_path, max_workers=2) as pool:
        futures = [pool.submit(s) for s in (RMS_NORM_FILE, broken, "def kernel_function(x):\n    return x\n")]
        good = futures[0].result()
        assert good.path.is_file() and not good.cached
        with pytest.raises(CudaCompileError, match="rsqrtf_missing"):
            futures[1].result()
        with pytest.raises(ValueError, match="CUDA_SRC"):
            futures[2].result()
    assert CUDA.build(RMS_NORM_FILE, arch="sm_90", cache_dir=tmp_path).cached


def test_compile_errors_are_classified_and_logged_with_the_source_line() -> None:
    diagnostics = parse_compiler_output('CUDA_SRC(2): error: identifier "oops" is undefined')
    error = CudaCompileError(diagnostics, "full log", "nvrtc")
    error.cuda_source = "\n  y[0] = oops;\n"
    try:
        try:
            raise error
        except CudaCompileError as inner:
            raise ImportError("while importing the candidate") from inner
    except ImportError as outer:
        assert CUDA.classify_exception(outer) == "compile_error"
        assert CUDA.compile_log(outer) == 'CUDA_SRC line 2: error: identifier "oops" is undefined\n    y[0] = oops;'
    assert CUDA.classify_exception(RuntimeError("CUDA error: an illegal memory access")) == "runtime_error"


# ---------------------------------------------------------------------------------------------------------
# Toolchain and sandbox environment
# ---------------------------------------------------------------------------------------------------------
def test_toolchain_key_names_backend_arch_and_compiler_version() -> None:
    a = Toolchain("nvrtc", "sm_90", "13.0", "13.0.88", "13.0")
    assert a.key() == "cuda:nvrtc:sm_90:nvrtc=13.0:torch_cuda=13.0"
    assert a.key() != Toolchain("nvrtc", "sm_100", "13.0", "13.0.88", "13.0").key()
    assert a.key() != Toolchain("nvrtc", "sm_90", "13.1", "13.0.88", "13.0").key()
    assert a.key() == Toolchain("nvrtc", "sm_90", "13.0", None, "13.0").key()  # nvcc unseen in a sandbox: same key


def test_child_environment_builds_in_the_scratch_reads_the_shared_cache_and_pins_the_toolchain(
        monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KFORGE_SANDBOX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KFORGE_CUDA_BACKEND", "nvcc")
    env = CUDA.child_environment("cuda", tmp_path / "scratch")
    assert env["KFORGE_CUDA_CACHE"] == str(tmp_path / "scratch" / "cuda")  # its own builds die with it
    assert env["KFORGE_CUDA_SHARED_CACHE"] == str(tmp_path / "cuda")  # the parent's prebuilt cubins, read-only
    assert env["KFORGE_CUDA_BACKEND"] == "nvcc"
    if torch.cuda.is_available():
        pinned = Toolchain(**__import__("json").loads(env[TOOLCHAIN_ENV]))
        monkeypatch.setenv(TOOLCHAIN_ENV, env[TOOLCHAIN_ENV])
        assert toolchain() == pinned
    else:
        assert TOOLCHAIN_ENV not in env  # no GPU, no arch: nothing to pin
    monkeypatch.setenv(TOOLCHAIN_ENV, Toolchain("nvrtc", "sm_90", "13.0", None, None).to_json())
    assert toolchain().key() == "cuda:nvrtc:sm_90:nvrtc=13.0:torch_cuda=-"


def test_fix_prompt_headline_names_the_language_compiler() -> None:
    from agent.prompting import Failure, KernelTask, PromptRenderer
    from forge.samples import Sample

    renderer = PromptRenderer()
    failure = {"status": "compile_error", "details": {"compile_log": "CUDA_SRC line 3: error: identifier undefined"}}
    samples = [Sample((torch.randn(4, 64), (64,)), {})]
    prompts = {name: renderer.fix(KernelTask.from_samples("rms_norm", samples, language=name), RMS_NORM_FILE, failure)
               for name in ("cuda", "triton")}
    status = "**Status: compile_error — the file did not compile (Python import or {} compilation failed).**"
    assert status.format("CUDA C++") in prompts["cuda"] and status.format("Triton") in prompts["triton"]
    view = Failure.of(failure)
    assert view.headline_in("triton") == view.headline  # Triton's bytes are the default headline's
    assert Failure.of({"status": "mismatch"}).headline_in("cuda") == Failure.of({"status": "mismatch"}).headline


def test_only_cuda_shares_a_cache_with_its_children_and_triton_none(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KFORGE_SANDBOX_CACHE_DIR", str(tmp_path))
    assert CUDA.shared_caches() == [tmp_path / "cuda"] and (tmp_path / "cuda").is_dir()
    assert get_language("triton").shared_caches() == []  # each Triton child compiles in its own scratch


@needs_compiler
def test_a_child_inside_the_boundary_loads_the_parents_prebuilt_cubin(monkeypatch, tmp_path: Path) -> None:
    """Inside bubblewrap nothing but the private scratch is writable: the build pool's cache is bound read-only
    (`CudaLanguage.shared_caches`), so the child loads the parent's cubin without compiling and cannot change it."""
    import shutil

    from agent.languages.cuda import toolchain as toolchain_module
    from forge.sandbox.environment import SCRATCH_MOUNT, child_environment
    from forge.sandbox.isolation import IsolationLevel, bwrap_command, resolve_isolation

    if shutil.which("bwrap") is None or resolve_isolation("auto", allow_unsafe=True).level is not \
            IsolationLevel.BOUNDARY:
        pytest.skip("no working bubblewrap boundary on this machine")
    monkeypatch.setenv("KFORGE_SANDBOX_CACHE_DIR", str(tmp_path / "sandbox-cache"))
    monkeypatch.setenv("KFORGE_CUDA_BACKEND", CPU_BACKEND)
    monkeypatch.delenv(TOOLCHAIN_ENV, raising=False)
    monkeypatch.setattr(toolchain_module, "device_arch", lambda device=None: "sm_90")
    pool = CUDA.candidate_build_pool()
    assert pool is not None
    with pool:
        build = pool.submit(RMS_NORM_FILE).result(timeout=300)
    folder = tmp_path / "run"
    folder.mkdir(parents=True)
    (folder / "candidate.py").write_text(RMS_NORM_FILE)
    env = child_environment(SCRATCH_MOUNT, language_env=CUDA.child_environment("cuda", SCRATCH_MOUNT))
    code = ("import pathlib\nfrom agent.languages.cuda.build import build_cubin\n"
            "from agent.languages.cuda.source import extract_cuda_source\n"
            "from agent.languages.cuda.toolchain import toolchain\n"
            "src = extract_cuda_source(pathlib.Path('candidate.py').read_text())[0]\n"
            "b = build_cubin(src, toolchain())\nprint(b.key, b.cached)\n"  # what load_cuda does first
            "import os\nshared = os.environ['KFORGE_CUDA_SHARED_CACHE']\n"
            "try:\n    open(os.path.join(shared, 'planted'), 'w')\n    print('SHARED writable')\n"
            "except OSError:\n    print('SHARED read-only')\n")
    argv = bwrap_command(shutil.which("bwrap"), [sys.executable, "-c", code], folder=folder,
                         scratch=SCRATCH_MOUNT, readonly=CUDA.shared_caches())
    out = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # the same key, found in the cache: no compile in the child; and the child cannot plant a cubin there
    assert out.stdout.split() == [build.key, "True", "SHARED", "read-only"]


def test_importing_the_language_does_not_import_the_runtime() -> None:
    code = "import sys, agent.languages; print('agent.languages.cuda.runtime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


# ---------------------------------------------------------------------------------------------------------
# On a GPU: load, run, sandbox
# ---------------------------------------------------------------------------------------------------------
def _load_file(source: str, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return CUDA.load(path, f"kforge_test_cuda_{name}_{abs(hash(source)) % 10**8}")


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("backend", ["nvrtc", "nvcc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_honest_kernels_match_pytorch_on_the_gpu(monkeypatch, tmp_path: Path, backend: str, dtype) -> None:
    import torch.nn.functional as F

    from agent.languages.cuda.runtime import clear_loaded

    if backend == "nvrtc" and not HAS_NVRTC:
        pytest.skip("no NVRTC")
    monkeypatch.setenv("KFORGE_CUDA_BACKEND", backend)
    monkeypatch.setenv("KFORGE_CUDA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TOOLCHAIN_ENV, raising=False)
    clear_loaded()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    x = torch.randn(37, 1000, device="cuda", dtype=dtype)
    w = torch.randn(1000, device="cuda", dtype=dtype)
    rms = _load_file(RMS_NORM_FILE, tmp_path, f"rms_{backend}")
    torch.testing.assert_close(rms(x, (1000,), w, 1e-6), F.rms_norm(x, (1000,), w, 1e-6), atol=tol, rtol=tol)
    torch.testing.assert_close(rms(x, [1000]), F.rms_norm(x, [1000]), atol=tol, rtol=tol)
    g = torch.randn(4, 32, 7, 9, device="cuda", dtype=dtype)
    gw, gb = torch.randn(32, device="cuda", dtype=dtype), torch.randn(32, device="cuda", dtype=dtype)
    gn = _load_file(GROUP_NORM_FILE, tmp_path, f"gn_{backend}")
    torch.testing.assert_close(gn(g, 8, gw, gb), F.group_norm(g, 8, gw, gb), atol=tol * 4, rtol=tol * 4)
    silu = _load_file(EXAMPLE, tmp_path, f"silu_{backend}")
    s = torch.randn(300, 513, device="cuda", dtype=dtype)[:, ::2]
    torch.testing.assert_close(silu(s), F.silu(s), atol=tol, rtol=tol)


@pytest.mark.cuda
@needs_gpu
def test_cuda_launches_replay_in_a_cuda_graph(tmp_path: Path) -> None:
    import torch.nn.functional as F

    rms = _load_file(RMS_NORM_FILE, tmp_path, "rms_graph")
    x = torch.randn(64, 4096, device="cuda")
    rms(x, (4096,))  # load the module outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rms(x, (4096,))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, F.rms_norm(x, (4096,)), atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
@needs_gpu
def test_cuda_candidates_run_through_the_sandbox_and_a_fault_ends_only_the_child() -> None:
    from forge.checking import KernelUtils
    from forge.samples import Sample
    from tests.sandbox_run import judge_file

    fast = KernelUtils(fresh_inputs_per_sample=1, warmup=1, rounds=3, min_run_time_s=0.0)
    samples = [Sample((torch.randn(64, 4096, device="cuda"), (4096,)), {})]
    ok = judge_file(RMS_NORM_FILE, "rms_norm", samples, language="cuda", kernel_utils=fast, timeout_s=300,
                       allow_unsafe=True)
    assert ok.status == "ok", (ok.message, ok.details, ok.stderr)
    faulting = RMS_NORM_FILE.replace("store(yr + i, v);", "store(yr + i + (1ll << 40), v);")
    bad = judge_file(faulting, "rms_norm", samples, language="cuda", kernel_utils=fast, timeout_s=300,
                        allow_unsafe=True, benchmark=False)
    assert bad.status in {"runtime_error", "crash"}, (bad.message, bad.details)
    broken = RMS_NORM_FILE.replace("rsqrtf(", "rsqrtf_missing(")
    failed = judge_file(broken, "rms_norm", samples, language="cuda", kernel_utils=fast, timeout_s=300,
                           allow_unsafe=True, benchmark=False)
    assert failed.status == "compile_error", (failed.message, failed.details)
    assert "rsqrtf_missing" in failed.details["compile_log"] and "CUDA_SRC line" in failed.details["compile_log"]
    assert torch.ones(1, device="cuda").item() == 1.0


@pytest.mark.cuda
@pytest.mark.slow
@needs_gpu
def test_load_inline_backend_runs_the_same_file(monkeypatch, tmp_path: Path) -> None:
    import torch.nn.functional as F

    from agent.languages.cuda.runtime import clear_loaded

    monkeypatch.setenv("KFORGE_CUDA_BACKEND", "load_inline")
    monkeypatch.setenv("KFORGE_CUDA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TOOLCHAIN_ENV, raising=False)
    clear_loaded()
    rms = _load_file(RMS_NORM_FILE, tmp_path, "rms_inline")
    x = torch.randn(8, 2048, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(rms(x, (2048,)), F.rms_norm(x, (2048,)), atol=2e-3, rtol=2e-3)



@needs_compiler
def test_loading_a_candidate_builds_it_and_exposes_only_its_kernels(monkeypatch, tmp_path: Path) -> None:
    """The import path a sandbox child takes (no GPU needed until a launch): pinned toolchain, build, handle."""
    from agent.languages.cuda.runtime import clear_loaded

    monkeypatch.setenv(TOOLCHAIN_ENV, toolchain(CPU_BACKEND, "sm_90").to_json())
    monkeypatch.setenv("KFORGE_CUDA_CACHE", str(tmp_path / "cache"))
    clear_loaded()
    path = tmp_path / "rms.py"
    path.write_text(RMS_NORM_FILE)
    entry = CUDA.load(path, "kforge_test_cuda_rms_import")
    module = sys.modules["kforge_test_cuda_rms_import"]
    assert callable(entry) and sorted(dir(module.kernels)) == ["rms_bf16", "rms_f16", "rms_f32"]
    with pytest.raises(AttributeError, match="no launchable kernel 'block_sum'"):
        module.kernels.block_sum  # noqa: B018 - a __device__ helper is not launchable
    assert len(list((tmp_path / "cache" / "cubin").glob("*.cubin"))) == 1
    broken = tmp_path / "broken.py"
    broken.write_text(RMS_NORM_FILE.replace("rsqrtf(", "rsqrtf_missing("))
    with pytest.raises(CudaCompileError) as info:
        CUDA.load(broken, "kforge_test_cuda_rms_broken")
    assert CUDA.classify_exception(info.value) == "compile_error"
    log = CUDA.compile_log(info.value)
    assert log.startswith("CUDA_SRC line ") and "rsqrtf_missing" in log and "const float r = rsqrtf_missing(" in log
