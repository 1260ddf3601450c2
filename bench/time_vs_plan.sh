#!/usr/bin/env bash
# Measured step time against the plan's prediction on this machine's local-cpu cluster, over a
# fixed set of layouts at world sizes 1, 2 and 4 (dp, tp, pp, ZeRO 1-3 mixes). Each layout is
# planned with `dplan estimate` on PROFILE, trained with `dplan run` (fp32 on CPU), and read back
# with `dplan compare --json`. Prints one row per layout: predicted and measured step time and
# the phases, and the error. See bench/README.md.
#
#   bench/time_vs_plan.sh PROFILE [steps]     # PROFILE: a cluster (e.g. from `dplan probe`)
#
# Environment: DPLAN (default ./build/dplan), PYTHON (default python3), MODEL (default
# gpt-small), LAYOUTS (a subset of the names below, space separated), KEEP=DIR keeps the plans
# and run.json files in DIR (for `dplan calibrate`).

set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2

profile=${1:?usage: $0 PROFILE [steps]}
steps=${2:-4}
DPLAN=${DPLAN:-./build/dplan}
PYTHON=${PYTHON:-python3}
model=${MODEL:-gpt-small}

if ! [[ $steps =~ ^[0-9]+$ ]] || (( steps < 2 )); then
    echo "usage: $0 PROFILE [steps]   (at least 2: the first step is left out)" >&2
    exit 2
fi

if [[ -n ${KEEP:-} ]]; then out=$KEEP; mkdir -p "$out"; else out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi

# name | dplan estimate layout flags
all=(
    "single|--tp 1 --pp 1 --dp 1"
    "dp2|--tp 1 --pp 1 --dp 2 --zero 1"
    "tp2|--tp 2 --pp 1 --dp 1"
    "pp2|--tp 1 --pp 2 --dp 1"
    "dp4-zero2|--tp 1 --pp 1 --dp 4 --zero 2"
    "tp2-dp2|--tp 2 --pp 1 --dp 2 --zero 1"
    "pp2-dp2-zero3|--tp 1 --pp 2 --dp 2 --zero 3"
    "tp2-pp2-sp|--tp 2 --pp 2 --dp 1 --sp"
    "dp2-zero3|--tp 1 --pp 1 --dp 2 --zero 3"
)

printf '%-16s %9s %9s %7s   %s\n' layout "pred ms" "meas ms" "err %" "phases pred/meas ms (fwd bwd tp pp dp opt)"
status=0
for entry in "${all[@]}"; do
    IFS='|' read -r name flags <<<"$entry"
    if [[ -n ${LAYOUTS:-} && " $LAYOUTS " != *" $name "* ]]; then continue; fi
    # shellcheck disable=SC2086
    gpus=$(( $(echo $flags | sed -E 's/.*--tp ([0-9]+).*--pp ([0-9]+).*--dp ([0-9]+).*/\1*\2*\3/') ))
    plan=$out/plan-$name.json run=$out/run-$name.json
    # shellcheck disable=SC2086
    if ! "$DPLAN" estimate --model "$model" --cluster "$profile" --gpus "$gpus" $flags --mbs 1 --global-batch 8 \
            --precision fp32 -o "$plan" >"$out/estimate-$name.log" 2>&1 ||
       ! "$DPLAN" run "$plan" --steps "$steps" --quiet -o "$run" >"$out/run-$name.log" 2>&1 ||
       ! "$DPLAN" compare "$plan" "$run" --json >"$out/compare-$name.json" 2>"$out/compare-$name.log"; then
        echo "$name: failed; see the logs (KEEP=DIR)" >&2
        status=1
        continue
    fi
    "$PYTHON" - "$name" "$out/compare-$name.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
ph = json.load(open(path))["phases"]
step = json.load(open(path))["step_time_s"]
keys = ("forward", "backward", "tp_comm", "pp_wait", "dp_comm", "optimizer")
parts = " ".join(f"{1e3 * ph[k]['predicted']:.0f}/{1e3 * ph[k]['measured']:.0f}" for k in keys if k in ph)
err = 100.0 * (step["predicted"] - step["measured"]) / step["measured"]
print(f"{name:16s} {1e3 * step['predicted']:9.1f} {1e3 * step['measured']:9.1f} {err:+7.1f}   {parts}")
PY
done
echo "err % = (predicted - measured) / measured"
exit $status
