#!/usr/bin/env bash
# Issues 8, 10 and 12 on the H200, batched (the session's device time is short). PART=a: the harness at KernelBench
# shipped sizes after the memory-bounded oracle (eager as its own candidate) and the oracle's peak memory; PART=b:
# the CUDA-marked tests, the CUDA language's compile/launch/fault benchmark and the adversarial corpus.
# Output: $OUT/session-$PART.tar.gz. Needs .whl (LLM client wheels) and .gpu/kernelbench/level1 carried.
set -uo pipefail
source "$(dirname "$0")/h200_common.sh"
PART=${PART:-a}
h200_setup "session-$PART"
export KFORGE_UNSAFE_SANDBOX=1 STEP_FILTER="^·\|UserWarning\|warnings.warn" TAIL=${TAIL:-40}
if [ "$PART" = a ]; then
  step oracle-memory 200 python3 -m benchmarks.oracle_memory
  step kb-eager "${KB_TIMEOUT:-330}" python3 -m kforge.cli eval .gpu/kernelbench/level1 --source eager --timeout 240 --no-plots \
    --problems "${KB_PROBLEMS:-level1/35_GroupNorm_,level1/36_RMSNorm_,level1/19_ReLU,level1/99_TripletMarginLoss,level1/33_BatchNorm,level1/1_Square_matrix_multiplication_}" \
    --out "$logs/kb-eager"
elif [ "$PART" = c ]; then  # everything at once, each step capped (what one device call can hold)
  step kb-eager 200 python3 -m kforge.cli eval .gpu/kernelbench/level1 --source eager --timeout 110 --no-plots \
    --problems "${KB_PROBLEMS:-level1/19_ReLU,level1/35_GroupNorm_,level1/1_Square_matrix_multiplication_}" --out "$logs/kb-eager"
  step adversarial 170 python3 benchmarks/adversarial_h200.py --unsafe-sandbox --jobs 4
  step cuda-tests 110 python3 -m pytest -q -p no:cacheprovider tests/agent/test_cuda_language.py tests/agent/sandbox \
    tests/forge/checking/test_checking_cuda.py tests/evals/test_eval_cuda.py -m "cuda and not slow"
  step cuda-language 90 python3 benchmarks/cuda_language_h200.py --quick --only compile,launch,fault_child
else
  step cuda-tests 200 python3 -m pytest -q -m cuda -x -p no:cacheprovider tests/evals/test_eval_cuda.py \
    tests/forge/checking/test_probes.py tests/forge/checking/test_integrity.py tests/forge/checking/test_checking_cuda.py \
    tests/agent/test_cuda_language.py -m "cuda and not slow"
  step cuda-language 200 python3 benchmarks/cuda_language_h200.py --quick
  step adversarial 200 python3 benchmarks/adversarial_h200.py --unsafe-sandbox --jobs 4
fi
tar -czf "${OUT:-/tmp/out}/session-$PART.tar.gz" -C "$(dirname "$logs")" "session-$PART"
