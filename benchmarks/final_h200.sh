# The session's last H200 call: KernelBench GroupNorm at its shipped size, the KernelBench RNG test, NVRTC compile
# times and host cost per call of CUDA vs Triton vs PyTorch rms_norm. Run from the repo root with .whl and .gpu carried.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD KFORGE_CACHE_DIR=/tmp/kc
timeout 75 python3 -m kforge.cli eval .gpu/kernelbench/level1 --source eager --timeout 70 --no-plots --problems level1/35_GroupNorm_ --out $OUT/kb 2>&1 | grep -v "^·" | grep -E "GroupNorm|harness" | head -5
timeout 25 python3 -m pytest -q -p no:cacheprovider tests/evals/test_eval_cuda.py -k kernelbench_inputs 2>&1 | tail -1
timeout 60 python3 - <<'PY'
import sys, time, statistics, torch
sys.argv = ["x"]
sys.path.insert(0, "benchmarks")
import cuda_language_h200 as b
from pathlib import Path
import tempfile
work = Path(tempfile.mkdtemp())
for name in ("rms_norm",):
    cold = b._run_child("compile", "nvrtc", name, str(work / "c"), "1")
    load = b._run_child("load", "nvrtc", name, str(work / "c"), "1")
    print("nvrtc compile", name, {k: v for k, v in cold.items() if k != "stderr_tail"})
    print("nvrtc fresh-process load from cache", {k: v for k, v in load.items() if k != "stderr_tail"})
import os
os.environ["KFORGE_CUDA_CACHE"] = str(work / "shared"); os.environ["KFORGE_CUDA_BACKEND"] = "nvrtc"
src = b._sources()
x = torch.randn(1, 4096, device="cuda", dtype=torch.float16); w = torch.randn(4096, device="cuda", dtype=torch.float16)
rms = b._load("cuda", src["rms_norm"], work, "rms_nvrtc")
tri = b._load("triton", b.TRITON_RMS_NORM, work, "rms_triton")
F = torch.nn.functional
torch.testing.assert_close(rms(x, (4096,), w), F.rms_norm(x, (4096,), w), atol=2e-3, rtol=2e-3)
print("host us/call rms_norm [1,4096] fp16: cuda nvrtc", b.host_us(lambda: rms(x, (4096,), w), 2000),
      "triton", b.host_us(lambda: tri(x, (4096,), w), 2000), "torch", b.host_us(lambda: F.rms_norm(x, (4096,), w), 2000))
PY
