# Shared by the benchmarks/*_h200.sh scripts (sourced, not run): the set-up every H200 device call repeats and the
# `step` that runs one capped command into the log folder. The GPU host has no network, so the LLM client travels as
# wheels in .whl (../shared/gpu/wheels.sh .whl); KernelBench and a snapshot of the commit travel in .gpu.

h200_snapshot() {  # run from a snapshot of a commit (`git archive HEAD > .gpu/head.tar`), so work in progress never travels
  local root=/tmp/head
  rm -rf "$root"; mkdir -p "$root"; tar -xf .gpu/head.tar -C "$root"; cp -r .gpu .whl "$root/"; cd "$root" || exit 1
}

h200_setup() {  # log folder name: install the wheels (SKIP_WHEELS=1: already there), export the environment, make $logs
  [ "${SKIP_WHEELS:-0}" = 1 ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KFORGE_CACHE_DIR=/tmp/kforge-cache
  logs=${OUT:-/tmp/out}/$1; mkdir -p "$logs"
}

step() {  # name, seconds, command...: its log in $logs/NAME.log, its exit and tail in $logs/summary.txt
  local name=$1 limit=$2; shift 2
  local start; start=$(date +%s)
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  echo "== $name: exit $? after $(( $(date +%s) - start )) s" | tee -a "$logs/summary.txt"
  grep -v "${STEP_FILTER:-^·}" "$logs/$name.log" | tail -"${TAIL:-45}" >> "$logs/summary.txt"
}
