#!/usr/bin/env bash
# Issue 7 on the H200 in one device call: the demo cassettes' prompts re-rendered there, then each demo optimized
# from its cassette with the six-variant end-to-end report. Output: $OUT/issue7.tar.gz (logs and plans).
# Run from the repo root with the .whl folder carried (the LLM client's wheels; ../shared/gpu/wheels.sh .whl).
set -uo pipefail
[ "${SKIP_WHEELS:-0}" = 1 ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE_DIR=/tmp/kforge-cache
logs=${OUT:-/tmp/out}/issue7; mkdir -p "$logs"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv | tee "$logs/gpu.txt"
check() {  # demo functions: re-render the first requests here and compare with the shipped cassette
  KFORGE_LLM_MODEL=frontier-standin python3 -m kforge.cli prompts --demo "$1" --functions "$2" --out "$logs/prompts-$1.jsonl"
  python3 - "$1" "$logs/prompts-$1.jsonl" <<'PY'
import json, sys
demo, path = sys.argv[1], sys.argv[2]
shipped = {json.loads(l)["tag"]: json.loads(l)["request"] for l in open(f"agent/cassettes/demo-{demo}-nvidia-h200.jsonl")}
for line in open(path):
    item = json.loads(line)
    print(f"{demo} {item['function']}: {'identical' if shipped.get(item['function']) == item['request'] else 'DIFFERENT'}")
PY
}
check unet group_norm,silu,layer_norm 2>&1 | tail -4 | tee -a "$logs/summary.txt"
check llama softmax,rms_norm 2>&1 | tail -3 | tee -a "$logs/summary.txt"
for spec in ${RUNS:-unet:cuda_graphs llama:eager}; do
  demo=${spec%%:*}; execution=${spec##*:}
  echo "== kforge optimize --demo $demo --execution $execution --benchmark ==" | tee -a "$logs/summary.txt"
  start=$(date +%s)
  timeout ${STEP_TIMEOUT:-400} python3 -m kforge.cli optimize --demo "$demo" --execution "$execution" \
    --benchmark --unsafe-sandbox ${EXTRA_ARGS:-} --out "$logs/$demo-$execution.plan.json" > "$logs/$demo-$execution.log" 2>&1
  echo "exit $? after $(( $(date +%s) - start )) s" >> "$logs/$demo-$execution.log"
  grep -v "^·" "$logs/$demo-$execution.log" | tail -60 | tee -a "$logs/summary.txt"
done
tar -czf "${OUT:-/tmp/out}/issue7.tar.gz" -C "$(dirname "$logs")" issue7
