#!/usr/bin/env bash
# This session's H200 calls (issue 8's last gap), from a snapshot of a commit (`git archive HEAD > .gpu/head.tar`,
# carried with .gpu and .whl) so that work in progress in the tree never travels. PART=a: the float64 reference's
# cost with and without cuDNN on KernelBench's convolutions, then the level-1 problems not yet swept (83-98, 100)
# and the slowest one (68). PART=b (after the float64 run turned cuDNN off): where the time of two slow convolutions goes
# (cProfile), the slow convolutions again, and the float64 cost with and without cuDNN on every conv, norm and pool
# problem. PART=c (after outputs joined inputs in the size rules): all 100 level-1 problems on nvidia-h200-x2.
# Output: $OUT/session4.tar.gz.
set -uo pipefail
source "$(dirname "$0")/h200_common.sh"
h200_snapshot
h200_setup session4
export KFORGE_UNSAFE_SANDBOX=1
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv | tee "$logs/gpu.txt"
kb() {  # name, seconds, comma-separated problem ids
  step "$1" "$2" python3 -m kforge.cli eval .gpu/kernelbench/level1 --source eager --timeout 120 --no-plots \
    --problems "$3" --out "$logs/$1"
  python3 benchmarks/kb_level1_sweep.py "$logs/$1" >> "$logs/summary.txt" 2>&1
}
ids() { local out=; for n in "$@"; do out+="${out:+,}level1/$(basename .gpu/kernelbench/level1/${n}_*.py .py)"; done; echo "$out"; }
if [ "${PART:-a}" = a ]; then
  step float64-slow 150 python3 benchmarks/float64_reference.py .gpu/kernelbench/level1 --problems 68,61,63,65,69,78 --budget-s 120
  kb sweep-83-100 330 "$(ids 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 100 68)"
elif [ "${PART:-a}" = c ]; then  # the whole level-1 sweep, one worker per GPU (nvidia-h200-x2)
  kb sweep-all 530 "$(ids $(seq 1 100))"
else  # after the float64 run turned cuDNN off
  step profile 120 python3 -m benchmarks.harness_profile .gpu/kernelbench/level1 \
    level1/61_conv_transposed_3D__square_input__square_kernel level1/68_conv_transposed_3D__square_input__asymmetric_kernel
  kb slow-convs 240 "$(ids ${KB_IDS:-68 61 63 65 69 78 86})"
  step float64-all 150 python3 benchmarks/float64_reference.py .gpu/kernelbench/level1 --budget-s 120 \
    --problems 33,34,35,36,37,38,39,40,41,42,43,44,45,46,50,54,55,56,57,58,59,60,62,64,66,67,70,71,72,73,74,75,76,77,79,80,81,82,83,84,85,86,87
fi
cat "$logs/summary.txt"
tar -czf "${OUT:-/tmp/out}/session4.tar.gz" -C "$(dirname "$logs")" session4
