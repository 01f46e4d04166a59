#!/usr/bin/env bash
# One device call on a GPU host: install the wheels it was given, run benchmark steps (each with its own time limit
# and log), and pack the logs and every step's outputs into one tarball.
#
# Why: the GPU host has no network (the LLM client, kernel libraries and model libraries travel as wheels:
# `../shared/gpu/wheels.sh .whl`), a device command is killed after 10 minutes, and only a few files come back.
#
#   bash benchmarks/gpu_session.sh [OPTIONS] --step LABEL SECONDS COMMAND [--step LABEL SECONDS COMMAND ...]
#
# Each COMMAND is one (quoted) argument, run by `bash -c` from the repository root, with OUT set to the step's own
# output folder and SESSION to the session's folder: write results under "$OUT" (single-quote the command so that
# $OUT is expanded by the step, not by your shell). Its stdout and stderr go to LABEL.log. PYTHONPATH holds the
# installed wheels and the repository; KFORGE_CACHE_DIR defaults to /tmp/kforge-cache; the caller's environment
# (e.g. KFORGE_UNSAFE_SANDBOX=1 on a host without bubblewrap) passes through.
#
# Options:
#   --name NAME       the session's name: DIR/NAME.tar.gz holds NAME/ (default: session)
#   --out DIR         where NAME.tar.gz and NAME-summary.txt are written (default: $OUT, else runs)
#   --wheels DIR      install DIR/*.whl with `pip --no-index --no-deps` when it holds any (default: .whl;
#                     repeat for several folders; a folder installed earlier on this host is not installed again)
#   --site DIR        where the wheels go, first on PYTHONPATH (default: /tmp/kforge-site)
#   --snapshot TAR    run from this archive of a commit (`git archive HEAD > .gpu/head.tar`), unpacked under /tmp
#                     with .gpu and the wheel folders copied in, so that work in progress in the tree never travels
#   --budget SECONDS  the whole call's limit: a step's limit is cut to what is left and later steps are skipped, so
#                     the tarball is still written (default: 570; 0: no limit)
#   --tail N          last lines of each log copied into the summary (default: 40)
#   --filter REGEX    log lines left out of the summary (default: '^·', progress lines)
#
# The summary (each step's exit status, time and log tail) is also printed at the end. Exit status: 0 when every
# step exited 0, else 1; 2 for a usage error. Example (KernelBench carried in .gpu, the LLM client in .whl):
#
#   KFORGE_UNSAFE_SANDBOX=1 bash benchmarks/gpu_session.sh --name kb --snapshot .gpu/head.tar \
#     --step kb-eager 420 'python3 -m kforge.cli eval .gpu/kernelbench/level1 --source eager --timeout 120 \
#                          --no-plots --problems level1/19_ReLU,level1/23_Softmax --out "$OUT"
#                          python3 benchmarks/kb_level1_sweep.py "$OUT"' \
#     --step adversarial 200 'python3 benchmarks/adversarial_h200.py --unsafe-sandbox --jobs 4'
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
fail() { echo "gpu_session: $*" >&2; exit 2; }

name=session out=${OUT:-runs} site=/tmp/kforge-site snapshot= budget=570 tail=40 filter='^·'
wheels=() labels=() limits=() commands=()
while [ $# -gt 0 ]; do
  case $1 in
    --name|--out|--wheels|--site|--snapshot|--budget|--tail|--filter)
      [ $# -ge 2 ] || fail "$1 needs a value"
      case $1 in
        --name) name=$2 ;; --out) out=$2 ;; --wheels) wheels+=("$2") ;; --site) site=$2 ;;
        --snapshot) snapshot=$2 ;; --budget) budget=$2 ;; --tail) tail=$2 ;; --filter) filter=$2 ;;
      esac
      shift 2 ;;
    --step)
      [ $# -ge 4 ] || fail "--step needs LABEL SECONDS COMMAND"
      [[ $2 =~ ^[A-Za-z0-9._-]+$ ]] || fail "step label '$2': letters, digits, '.', '_' and '-' only"
      [[ $3 =~ ^[0-9]+$ ]] || fail "step $2: SECONDS must be a whole number, not '$3'"
      labels+=("$2") limits+=("$3") commands+=("$4")
      shift 4 ;;
    -h|--help) usage; exit 0 ;;
    *) fail "unknown argument '$1' (see --help)" ;;
  esac
done
[ ${#labels[@]} -gt 0 ] || fail "no --step given (see --help)"
[[ $name =~ ^[A-Za-z0-9._-]+$ ]] || fail "--name '$name': letters, digits, '.', '_' and '-' only"
[[ $budget =~ ^[0-9]+$ ]] || fail "--budget must be a whole number of seconds"
[ ${#wheels[@]} -gt 0 ] || wheels=(.whl)
[ -z "$snapshot" ] || [ -f "$snapshot" ] || fail "--snapshot $snapshot: no such file"
started=$(date +%s)
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1

if [ -n "$snapshot" ]; then
  root=$(mktemp -d /tmp/kforge-snapshot.XXXXXX)
  tar -xf "$snapshot" -C "$root" || exit 1
  for carried in .gpu "${wheels[@]}"; do
    case $carried in /*) continue ;; esac
    [ -d "$carried" ] && mkdir -p "$root/$(dirname "$carried")" && cp -r "$carried" "$root/$carried"
  done
  cd "$root" || exit 1
fi

installed=
for folder in "${wheels[@]}"; do
  compgen -G "$folder/*.whl" > /dev/null || continue
  mkdir -p "$site"
  # the wheels' contents and names, not their dates: the snapshot's copy of a folder has new ones, and a second call on
  # a warm host reinstalled everything, one pip warning per file filling the call's output
  marker=$site/.installed-$(cd "$folder" && cksum -- *.whl | cksum | cut -d' ' -f1)
  if [ ! -f "$marker" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$folder"/*.whl \
      || { echo "gpu_session: installing the wheels of $folder failed" >&2; exit 1; }
    touch "$marker"
  fi
  installed=1
done
export PYTHONPATH=${installed:+$site:}$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 KFORGE_CACHE_DIR=${KFORGE_CACHE_DIR:-/tmp/kforge-cache}

session=$(mktemp -d /tmp/kforge-session.XXXXXX)/$name
mkdir -p "$session"
summary=$session/summary.txt
{
  echo "session $name, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), from $PWD"
  [ -z "$snapshot" ] || echo "snapshot $snapshot"
  echo "PYTHONPATH=$PYTHONPATH"
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -1
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv 2>&1
  fi
} > "$session/environment.txt"
cat "$session/environment.txt" > "$summary"

failed=0
for i in "${!labels[@]}"; do
  label=${labels[$i]} limit=${limits[$i]}
  if [ "$budget" -gt 0 ]; then
    left=$(( budget - ($(date +%s) - started) ))
    if [ "$left" -lt 5 ]; then
      echo "== $label: skipped (the session's $budget s are spent)" >> "$summary"
      failed=$(( failed + 1 ))
      continue
    fi
    [ "$limit" -le "$left" ] || limit=$left
  fi
  mkdir -p "$session/$label"
  printf '%s\n' "${commands[$i]}" > "$session/$label.command"
  step_started=$(date +%s)
  OUT=$session/$label SESSION=$session timeout -k 10 "$limit" bash -c "${commands[$i]}" > "$session/$label.log" 2>&1
  status=$?
  [ "$status" -eq 0 ] || failed=$(( failed + 1 ))
  note=; [ "$status" -ne 124 ] && [ "$status" -ne 137 ] || note=" (time limit)"
  echo "== $label: exit $status$note after $(( $(date +%s) - step_started )) s (limit $limit s)" >> "$summary"
  grep -v -- "$filter" "$session/$label.log" | tail -n "$tail" >> "$summary"
  rmdir "$session/$label" 2> /dev/null
done

echo "== $(( ${#labels[@]} - failed )) of ${#labels[@]} steps exited 0, $(( $(date +%s) - started )) s in all" >> "$summary"
cp "$summary" "$out/$name-summary.txt"
tar -czf "$out/$name.tar.gz" -C "$(dirname "$session")" "$name"
cat "$summary"
echo "wrote $out/$name.tar.gz"
[ "$failed" -eq 0 ]
