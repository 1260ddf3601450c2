#!/usr/bin/env bash
# Runs every example in examples/README.md, in order, and fails if any command fails.
#   examples/run_all.sh                       uses $DPLAN, else dplan on PATH, else build/dplan
#   DPLAN=/path/to/dplan examples/run_all.sh
#   examples/run_all.sh --plan-only           examples 1 to 5 only: planning, no training
# The test suite runs the planning examples (tests/cli/cli_test.cpp); the whole walk-through, which
# trains, probes and calibrates on this machine, is a benchmark (bench/run.sh).
set -euo pipefail

plan_only=0
case "${1:-}" in
  "") ;;
  --plan-only) plan_only=1 ;;
  *) echo "run_all: unknown option '$1'; valid: --plan-only" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
if [[ -n "${DPLAN:-}" ]]; then
  dplan=$DPLAN
elif command -v dplan >/dev/null 2>&1; then
  dplan=dplan
else
  dplan="$repo/build/dplan"
fi
if ! command -v "$dplan" >/dev/null 2>&1; then
  echo "run_all: no dplan binary at \"$dplan\"; build it (./setup.sh) or set DPLAN=/path/to/dplan" >&2
  exit 1
fi

# The README's commands are written from the repository root.
cd "$repo"
model=examples/custom-model/config.json

# Prints the command as the README shows it, then runs it; `set -e` stops the script on failure.
run() {
  echo "\$ dplan $*"
  "$dplan" "$@"
  echo
}

# 1. A model that is not a preset: its Hugging Face config.json, planned with the default layout.
run --model "$model" --cluster dgx-a100-80g --gpus 8

# 2. One layout of it, evaluated: tensor parallel 2 inside the node, data parallel 4.
run estimate --model "$model" --cluster dgx-a100-80g --gpus 8 --tp 2 --dp 4

# 3. The same layout with ZeRO stage 3: weights, gradients and optimizer states sharded over dp.
run estimate --model "$model" --cluster dgx-a100-80g --gpus 8 --tp 2 --dp 4 --zero 3

# 4. The same layout with full activation recompute: only each layer's input is kept.
run estimate --model "$model" --cluster dgx-a100-80g --gpus 8 --tp 2 --dp 4 --recompute full

# 5. The JSON form, for scripts: check that it answers whether the layout fits.
echo "\$ dplan estimate --model $model --cluster dgx-a100-80g --gpus 8 --tp 2 --dp 4 --json | grep '\"fits\"'"
json=$("$dplan" estimate --model "$model" --cluster dgx-a100-80g --gpus 8 --tp 2 --dp 4 --json)
if ! grep '"fits": ' <<<"$json"; then
  echo "run_all: the JSON output has no \"fits\" key" >&2
  exit 1
fi
echo
if ((plan_only)); then
  echo "run_all: all planning examples ran"
  exit 0
fi

# 6. Train a layout for real on this machine and compare: gpt-tiny over 4 local ranks, tensor
#    parallel 2 and pipeline parallel 2, then the prediction next to the measurement. Needs the
#    executor (dplan-worker beside dplan, built when LibTorch is found).
worker="$(dirname "$(command -v "$dplan")")/dplan-worker"
if [[ ! -x $worker && -z ${DPLAN_WORKER:-} ]]; then
  echo "run_all: examples 6 to 8 train, and this build has no executor (no dplan-worker beside $dplan):" \
       "build it with ./setup.sh --all, or run the planning examples alone with --plan-only" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run estimate --model gpt-tiny --cluster local-cpu --gpus 4 --tp 2 --pp 2 --mbs 1 --global-batch 8 \
    --precision fp32 -o "$work/plan.json"
run run "$work/plan.json" --steps 10 -o "$work/run.json"
run compare "$work/plan.json" "$work/run.json"

# 7. When the model does not fit: ZeRO-3 (parameters, gradients and optimizer states sharded
#    over data parallel) with full recompute, on 4 local ranks; then what each stage holds.
run estimate --model gpt-tiny --cluster local-cpu --gpus 4 --dp 4 --zero 3 --recompute full --mbs 1 \
    --global-batch 8 --precision fp32 -o "$work/zero3.json"
run run "$work/zero3.json" --steps 5 -o "$work/zero3-run.json"
run compare "$work/zero3.json" "$work/zero3-run.json"

# 8. Close the loop on this machine: probe it, run four layouts, calibrate the profile on
#    them, and compare predicted with measured scaling on the calibrated profile.
run probe --cluster local-cpu --ranks 2 -o "$work/machine.json"
runs=()
for layout in "--tp 1 --pp 1 --dp 1" "--tp 1 --pp 1 --dp 2" "--tp 2 --pp 1 --dp 1" "--tp 1 --pp 2 --dp 1"; do
  name=$(echo "$layout" | tr -d ' -')
  # shellcheck disable=SC2086
  run estimate --model gpt-tiny --cluster "$work/machine.json" --gpus $(( $(echo $layout | awk '{print $2*$4*$6}') )) \
      $layout --mbs 1 --global-batch 8 --precision fp32 -o "$work/$name.json" >/dev/null
  run run "$work/$name.json" --steps 5 --quiet -o "$work/run-$name.json"
  runs+=("$work/run-$name.json")
done
run calibrate "${runs[@]}" --profile "$work/machine.json" -o "$work/calibrated.json"
run scale --model gpt-tiny --cluster "$work/calibrated.json" --gpus 1,2,4 --global-batch 8 --precision fp32 \
    --steps 4 -o "$work/scale"
echo "run_all: all examples ran"
