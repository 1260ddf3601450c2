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
# and run.json files in DIR (for `dplan calibrate`), ROUNDS=N runs every layout once in each of N
# rounds (default 1) and pools their steps.

set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2

profile=${1:?usage: $0 PROFILE [steps]}
steps=${2:-4}
rounds=${ROUNDS:-1}
DPLAN=${DPLAN:-./build/dplan}
PYTHON=${PYTHON:-python3}
model=${MODEL:-gpt-small}

if ! [[ $steps =~ ^[0-9]+$ ]] || (( steps < 2 )); then
    echo "usage: $0 PROFILE [steps]   (at least 2: the first step is left out)" >&2
    exit 2
fi
if ! [[ $rounds =~ ^[0-9]+$ ]] || (( rounds < 1 )); then
    echo "$0: ROUNDS must be a whole number of at least 1, not '$rounds'" >&2
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

# Each layout is planned once; every round runs every layout once, so with ROUNDS > 1 each layout's steps
# are spread over the whole measurement (a drifting machine's fast and slow moments fall on all).
status=0
selected=()
for entry in "${all[@]}"; do
    IFS='|' read -r name flags <<<"$entry"
    if [[ -n ${LAYOUTS:-} && " $LAYOUTS " != *" $name "* ]]; then continue; fi
    # shellcheck disable=SC2086
    gpus=$(( $(echo $flags | sed -E 's/.*--tp ([0-9]+).*--pp ([0-9]+).*--dp ([0-9]+).*/\1*\2*\3/') ))
    # shellcheck disable=SC2086
    if ! "$DPLAN" estimate --model "$model" --cluster "$profile" --gpus "$gpus" $flags --mbs 1 --global-batch 8 \
            --precision fp32 -o "$out/plan-$name.json" >"$out/estimate-$name.log" 2>&1; then
        echo "$name: dplan estimate failed; see $out/estimate-$name.log (KEEP=DIR)" >&2
        status=1
        continue
    fi
    selected+=("$name")
done
for (( round = 1; round <= rounds; round++ )); do
    for name in "${selected[@]}"; do
        run=$out/run-$name-$round.json
        if ! "$DPLAN" run "$out/plan-$name.json" --steps "$steps" --warmup 1 --quiet -o "$run" \
                >"$out/run-$name-$round.log" 2>&1 ||
           ! "$DPLAN" compare "$out/plan-$name.json" "$run" --json >"$out/compare-$name-$round.json" \
                2>"$out/compare-$name-$round.log"; then
            echo "$name: round $round failed; see the logs (KEEP=DIR)" >&2
            status=1
        fi
    done
done

printf '%-16s %9s %9s %7s %7s   %s\n' layout "pred ms" "meas ms" "err %" "spread" \
    "phases pred/meas ms (fwd bwd rec tp cp ep p2p bubble dp gather opt)"
for name in "${selected[@]}"; do
    "$PYTHON" - "$name" "$out" "$rounds" <<'PY'
import glob, json, statistics, sys
name, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
compares = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/compare-{name}-*.json")) if open(f).read().strip()]
runs = [json.load(open(f"{out}/run-{name}-{r}.json")) for r in range(1, rounds + 1)
        if glob.glob(f"{out}/run-{name}-{r}.json")]
if not compares or not runs:
    sys.exit(0)
# The measured steps of all rounds, pooled: their median is the step time, (p90 - p10) / median the spread.
steps = sorted(s["time_s"] for r in runs for s in r["steps"] if not s["warmup"])
def q(p):
    x = p * (len(steps) - 1)
    i = int(x)
    return steps[i] + (x - i) * (steps[min(i + 1, len(steps) - 1)] - steps[i])
measured, spread = q(0.5), (q(0.9) - q(0.1)) / q(0.5)
predicted = compares[0]["step_time_s"]["predicted"]
keys = ("forward", "backward", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "pp_bubble", "dp_comm",
        "param_gather", "optimizer")
ph = [c["phases"] for c in compares]
parts = " ".join(f"{1e3 * ph[0][k]['predicted']:.0f}/{1e3 * statistics.mean(p[k]['measured'] for p in ph):.0f}"
                 for k in keys if k in ph[0])
err = 100.0 * (predicted - measured) / measured
print(f"{name:16s} {1e3 * predicted:9.1f} {1e3 * measured:9.1f} {err:+7.1f} {100 * spread:6.1f}%   {parts}")
PY
done
echo "err % = (predicted - measured) / measured; the measured step time is the median of every round's steps"
exit $status
