#!/usr/bin/env bash
# Same small GPT, same batch, same machine: PyTorch DDP (Gloo, CPU) against `dplan run`,
# world sizes 1 and 2, measured alternately in one run. Prints the median step times and
# their ratio (dplan / DDP). See bench/README.md.
#
#   bench/ddp_vs_dplan.sh [steps]      # steps per run, warm-up included (default 30)
#
# Environment: DPLAN (default ./build/dplan), TORCHRUN (default torchrun), PYTHON (for
# reading JSON, default python3), KEEP_TMP=1 keeps the temp dir with every log and JSON.
# Exit status: 0 when all four runs were measured, 1 when any failed, 2 on bad usage.

set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2

steps=${1:-30}
warmup=5
global_batch=16
seq=128
config=bench/gpt-bench/config.json
worlds=(1 2)
DPLAN=${DPLAN:-./build/dplan}
TORCHRUN=${TORCHRUN:-torchrun}
PYTHON=${PYTHON:-python3}

if ! [[ $steps =~ ^[0-9]+$ ]] || (( steps <= warmup )); then
    echo "usage: $0 [steps]   (steps is a whole number above the $warmup warm-up steps)" >&2
    exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp_vs_dplan.XXXXXX") || exit 1
if [[ ${KEEP_TMP:-0} == 1 ]]; then
    trap 'echo "logs and JSON kept in $tmp" >&2' EXIT
else
    trap 'rm -rf "$tmp"' EXIT
fi

say() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# Print the last lines of a log, indented, after a failure.
show_tail() { [[ -s $1 ]] && tail -n "${2:-15}" "$1" | sed 's/^/    | /' >&2; }

# Debian's torch 1.13 under Python 3.11: torchrun's Std.from_str("0") returns None (IntFlag
# no longer iterates its zero member), so the default --redirects 0 / --tee 0 crash the
# launcher (AttributeError: 'NoneType' object has no attribute 'get').
# A mapping that names only local rank 9 leaves ranks 0..8 at the default (no redirection).
torchrun_args=()
torchrun_path=$(command -v "$TORCHRUN" || true)
if [[ -z $torchrun_path ]]; then
    say "torchrun not found ($TORCHRUN); the DDP half cannot run"
else
    torchrun_py=$(sed -n '1s/^#![[:space:]]*//p' "$torchrun_path" 2>/dev/null)
    # shellcheck disable=SC2086  # the shebang may be "/usr/bin/env python3": split it
    if [[ -n $torchrun_py ]] && $torchrun_py -c '
import sys
from torch.distributed.elastic.multiprocessing.api import Std
sys.exit(0 if Std.from_str("0") is None else 1)' 2>/dev/null; then
        torchrun_args=(--redirects 9:0 --tee 9:0)
    fi
fi

# json_get FILE KIND -> median step time in seconds on stdout, or a message on stderr and rc 1.
#   KIND ddp:   the last stdout line of bench/ddp_gpt.py that is JSON with median_step_s
#   KIND dplan: run.json's step_time_s.median (docs/run-json.md)
json_get() {
    "$PYTHON" - "$1" "$2" <<'EOF'
import json, sys
path, kind = sys.argv[1], sys.argv[2]
try:
    if kind == "ddp":
        value = None
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        value = json.loads(line)["median_step_s"]
                    except (ValueError, KeyError):
                        pass
        if value is None:
            raise ValueError("no JSON line with median_step_s")
    else:
        with open(path) as f:
            value = json.load(f)["step_time_s"]["median"]
    value = float(value)
    if not value > 0:
        raise ValueError(f"median step time {value} is not positive")
    print(repr(value))
except Exception as e:  # noqa: BLE001 - report any malformed output the same way
    print(f"{path}: {e}", file=sys.stderr)
    sys.exit(1)
EOF
}

declare -A ddp_s=() dplan_s=()
failures=()

run_ddp() {
    local world=$1
    local out=$tmp/ddp-$world.out err=$tmp/ddp-$world.err
    say "DDP   world $world: torchrun, $steps steps ($warmup warm-up)"
    if [[ -z $torchrun_path ]]; then
        failures+=("DDP world $world (no torchrun)")
        return
    fi
    if ! "$TORCHRUN" --standalone --nproc_per_node "$world" "${torchrun_args[@]}" \
            bench/ddp_gpt.py --config "$config" --steps "$steps" --warmup "$warmup" \
            --global-batch "$global_batch" --seq "$seq" >"$out" 2>"$err"; then
        say "DDP   world $world: torchrun failed:"
        show_tail "$err"
        failures+=("DDP world $world")
        return
    fi
    local s
    if ! s=$(json_get "$out" ddp); then
        show_tail "$err"
        failures+=("DDP world $world (no result)")
        return
    fi
    ddp_s[$world]=$s
    say "DDP   world $world: median step $(fmt_ms "$s") ms"
}

run_dplan() {
    local world=$1
    local plan=$tmp/plan-$world.json run=$tmp/run-$world.json
    local mbs=$(( global_batch / world ))
    say "dplan world $world: estimate + run, $steps steps ($warmup warm-up)"
    if ! "$DPLAN" estimate --model "$config" --cluster local-cpu --gpus "$world" --dp "$world" \
            --mbs "$mbs" --global-batch "$global_batch" --seq "$seq" --precision fp32 \
            -o "$plan" >"$tmp/estimate-$world.log" 2>&1; then
        say "dplan world $world: dplan estimate failed:"
        show_tail "$tmp/estimate-$world.log"
        failures+=("dplan estimate world $world")
        return
    fi
    if ! "$DPLAN" run "$plan" --steps "$steps" --warmup "$warmup" -o "$run" \
            >"$tmp/run-$world.log" 2>&1; then
        say "dplan world $world: dplan run failed:"
        show_tail "$tmp/run-$world.log"
        failures+=("dplan run world $world")
        return
    fi
    local s
    if ! s=$(json_get "$run" dplan); then
        show_tail "$tmp/run-$world.log"
        failures+=("dplan run world $world (no result)")
        return
    fi
    dplan_s[$world]=$s
    say "dplan world $world: median step $(fmt_ms "$s") ms"
}

fmt_ms() { awk -v s="$1" 'BEGIN { printf "%.1f", s * 1000 }'; }

# Alternate the two so that a drift in the machine's speed hits both alike.
for world in "${worlds[@]}"; do
    run_ddp "$world"
    run_dplan "$world"
done

echo
echo "GPT $config, global batch $global_batch x seq $seq, fp32, CPU, $(nproc) cores;" \
     "median of $(( steps - warmup )) steps after $warmup warm-up"
printf '%5s  %15s  %17s  %11s\n' world "DDP step (ms)" "dplan step (ms)" "dplan/DDP"
worst=""
worst_world=""
for world in "${worlds[@]}"; do
    d=${ddp_s[$world]:-}
    p=${dplan_s[$world]:-}
    ratio=""
    if [[ -n $d && -n $p ]]; then
        ratio=$(awk -v p="$p" -v d="$d" 'BEGIN { printf "%.3f", p / d }')
        if [[ -z $worst ]] || awk -v r="$ratio" -v w="$worst" 'BEGIN { exit !(r > w) }'; then
            worst=$ratio
            worst_world=$world
        fi
    fi
    d_ms=failed p_ms=failed
    [[ -n $d ]] && d_ms=$(fmt_ms "$d")
    [[ -n $p ]] && p_ms=$(fmt_ms "$p")
    printf '%5s  %15s  %17s  %11s\n' "$world" "$d_ms" "$p_ms" "${ratio:-n/a}"
done

if (( ${#failures[@]} > 0 )); then
    msg=$(printf '%s; ' "${failures[@]}")
    echo "verdict: incomplete, failed: ${msg%; }"
    exit 1
fi
if awk -v w="$worst" 'BEGIN { exit !(w <= 1.0) }'; then
    echo "verdict: dplan is at least as fast as DDP at world 1 and 2 (worst ratio $worst, world $worst_world)"
elif awk -v w="$worst" 'BEGIN { exit !(w <= 1.05) }'; then
    echo "verdict: dplan is slower than DDP by under 5 % (ratio $worst at world $worst_world);" \
         "medians move more than that between runs on a shared machine, so rerun before concluding"
else
    echo "verdict: dplan is slower than DDP (ratio $worst at world $worst_world)"
fi
