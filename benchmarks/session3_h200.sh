#!/usr/bin/env bash
# This session's H200 calls, from a snapshot of a commit (`git archive HEAD > .gpu/head.tar`, carried with .gpu and
# .whl) so that work in progress in the tree never travels. PART=a: the oracle + probes' peak memory at KernelBench
# size and the harness time of six heavy KernelBench level-1 problems at their shipped sizes. PART=b: the CUDA demo
# cassettes (rms_norm, group_norm written in CUDA by a stand-in model) through `kforge optimize`, and GPU tests.
# PART=c: the checking package's GPU tests (spot checks in graph mode) and the adversarial corpus on the H200.
# Output: $OUT/session3.tar.gz.
set -uo pipefail
source "$(dirname "$0")/h200_common.sh"
h200_snapshot
h200_setup session3
export KFORGE_UNSAFE_SANDBOX=1
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv | tee "$logs/gpu.txt"
if [ "${PART:-a}" = a ]; then
  step oracle-probes 170 python3 -m benchmarks.oracle_memory --probes --out "$logs/oracle_probes.json"
  step kb6 330 python3 -m kforge.cli eval .gpu/kernelbench/level1 --source eager --timeout 150 --no-plots \
    --problems "${KB:-level1/35_GroupNorm_,level1/36_RMSNorm_,level1/99_TripletMarginLoss,level1/19_ReLU,level1/1_Square_matrix_multiplication_,level1/23_Softmax}" \
    --out "$logs/kb6"
elif [ "${PART:-a}" = d ]; then  # after the spot checks and the corpus's forkserver landed
  step adversarial 330 python3 benchmarks/adversarial_h200.py --unsafe-sandbox --jobs 4
  step demo-unet-cuda 220 python3 -m kforge.cli optimize --demo unet --language cuda --device cuda --no-static \
    --unsafe-sandbox --out "$logs/unet-cuda.plan.json"
elif [ "${PART:-a}" = c ]; then
  step gpu-tests-checking 200 python3 -m pytest -q -p no:cacheprovider -m "cuda and not slow" tests/forge/checking \
    tests/forge/test_runtime_cuda.py tests/forge/test_optimizer.py
  step adversarial 330 python3 benchmarks/adversarial_h200.py --unsafe-sandbox --jobs 4
else
  for demo in llama unet; do
    step "demo-$demo-cuda" 220 python3 -m kforge.cli optimize --demo "$demo" --language cuda --device cuda --no-static \
      --unsafe-sandbox --benchmark --out "$logs/$demo-cuda.plan.json"
  done
  step gpu-tests 150 python3 -m pytest -q -p no:cacheprovider -m "cuda and not slow" ${GPU_TESTS:-tests/agent/test_cuda_stacking.py tests/agent/test_cuda_launch_check.py tests/agent/test_cuda_language.py tests/agent/sandbox tests/forge/checking}
fi
cat "$logs/summary.txt"
tar -czf "${OUT:-/tmp/out}/session3.tar.gz" -C "$(dirname "$logs")" session3
