#!/usr/bin/env bash
# Every benchmark, one after another, each printing its figures: the checks whose numbers depend on
# how fast and how steady this machine is, kept out of the test suite (see bench/README.md).
#   bench/run.sh            search speed, rank start-up, the probe, the closed loop's accuracy, the examples walk-through
#   bench/run.sh --torch    also dplan's executor against PyTorch 2.x's DDP, FSDP2 and tensor parallel
#                           (bench/torch_vs_dplan.sh: 3 rounds of 8 runs; DPLAN_TORCH_VENV or PYTHON names the torch)
#   bench/run.sh --rank     also whether dplan orders layouts as this machine does (bench/rank_layouts.py:
#                           30 layouts of gpt-small on 8 ranks, 2 rounds; 45 to 60 minutes on 2 idle cores)
# The options combine (bench/run.sh --torch --rank).
# Needs the full build (./setup.sh --all). Environment: BUILD_DIR (default build).
# Exit status: 0 when every benchmark ran and met its bounds, 1 when one did not (the others still
# run), 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

torch=0
rank=0
for option in "$@"; do
  case "$option" in
    --torch) torch=1 ;;
    --rank) rank=1 ;;
    *) echo "bench/run.sh: unknown option '$option'; valid: --torch, --rank" >&2; exit 2 ;;
  esac
done
build=${BUILD_DIR:-build}
for program in "$build/dplan" "$build/dplan-worker" "$build/bench/search_bench" "$build/bench/machine_bench"; do
  if [[ ! -x $program ]]; then
    echo "bench/run.sh: $program is not built; run ./setup.sh --all first" >&2
    exit 2
  fi
done

failed=()
bench() {  # name, command...
  local name=$1
  shift
  echo "== $name: $*"
  local start=$SECONDS
  if "$@"; then
    echo "== $name: done in $((SECONDS - start)) s"
  else
    echo "== $name: FAILED after $((SECONDS - start)) s"
    failed+=("$name")
  fi
  echo
}

bench "search speed" "$build/bench/search_bench"
bench "rank start-up" python3 bench/startup_bench.py --dplan "$build/dplan"
bench "probe" "$build/bench/machine_bench" "[probe]"
bench "accuracy" "$build/bench/machine_bench" "[accuracy]"
bench "examples walk-through" env DPLAN="$build/dplan" examples/run_all.sh
if ((torch)); then bench "executor vs PyTorch" bench/torch_vs_dplan.sh; fi
if ((rank)); then bench "layout ranking" env BUILD_DIR="$build" python3 bench/rank_layouts.py; fi

if ((${#failed[@]})); then
  echo "bench/run.sh: failed: ${failed[*]}"
  exit 1
fi
echo "bench/run.sh: every benchmark ran"
