#!/usr/bin/env bash
# Issue 8 on the H200 in one device call: the harness at KernelBench level-1 shipped sizes (eager as its own
# candidate, so harness_s is the harness alone: validation + timing of candidate and baselines), then the built-in
# suite's compile and sdpa sources re-measured with plain torch.compile and the CUDA-graphs baseline.
# Needs the KernelBench level-1 files in .gpu/kernelbench/level1 (carried). Output: $OUT/issue8.tar.gz.
set -uo pipefail
source "$(dirname "$0")/h200_common.sh"
h200_setup issue8
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv | tee "$logs/gpu.txt"
KB=${KB_PROBLEMS:-level1/33_BatchNorm,level1/34_InstanceNorm,level1/35_GroupNorm_,level1/36_RMSNorm_,level1/40_LayerNorm,level1/23_Softmax,level1/19_ReLU,level1/99_TripletMarginLoss,level1/98_KLDivLoss,level1/1_Square_matrix_multiplication_}
[ "${SKIP_KB:-0}" = 1 ] || step kb-eager "${KB_TIMEOUT:-420}" python3 -m kforge.cli eval .gpu/kernelbench/level1 --source eager \
  --problems "$KB" --timeout 300 --no-plots --out "$logs/kb-eager"
[ "${SKIP_BUILTIN:-0}" = 1 ] || step builtin-compile 300 python3 -m kforge.cli eval builtin --source compile --quick --no-plots --out "$logs/builtin-compile"
[ "${SKIP_BUILTIN:-0}" = 1 ] || step builtin-sdpa 200 python3 -m kforge.cli eval builtin --source sdpa --quick --no-plots \
  --problems llama3_8b.prefill.sdpa,llama3_8b.decode32.sdpa,vit_b16.sdpa,sd15_unet.sdpa,mistral_7b.prefill4k.sdpa --out "$logs/builtin-sdpa"
for extra in ${EXTRA_STEPS:-}; do step "$(basename "$extra" .py)" 300 python3 "$extra"; done
tar -czf "${OUT:-/tmp/out}/issue8.tar.gz" -C "$(dirname "$logs")" issue8
