#!/usr/bin/env bash
# Same small GPT, same batch, same machine: PyTorch's own engines (bench/torch_gpt.py under
# torchrun, Gloo, CPU) against `dplan run` of the matching layout, in alternating rounds in one
# run. Prints per pairing the median over rounds of the ratio dplan / torch of the median step
# times, its spread (min-max over rounds), and a verdict against the target ratio <= 1.0.
# See bench/README.md.
#
#   bench/torch_vs_dplan.sh [steps] [rounds]   # steps per run, warm-up included (default 12);
#                                              # rounds (default 3)
#
#   pairing     torch                             dplan
#   ddp w1      DistributedDataParallel, 1 rank   dp 1
#   ddp w2      DistributedDataParallel, 2 ranks  dp 2
#   fsdp2 w2    fully_shard (ZeRO-3), 2 ranks     dp 2, ZeRO-3
#   tp w2       parallelize_module, 2 ranks       tp 2
#
# Environment: DPLAN (default ./build/dplan); CONFIG, the GPT-2-style config.json (default
# bench/gpt-bench/config.json); PYTHON, a Python with torch >= 2 (1.13 will do for
# PAIRINGS="ddp-w1 ddp-w2") (default
# $DPLAN_TORCH_VENV/bin/python when DPLAN_TORCH_VENV is set, else python3); TORCHRUN (default
# beside that Python, else torchrun); PAIRINGS="ddp-w1 tp-w2" picks some; KEEP_TMP=1 keeps every
# log, plan and run.json.
# Exit status: 0 when every run was measured, 1 when any failed, 2 on bad usage.

set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2

steps=${1:-12}
rounds=${2:-3}
warmup=2
global_batch=16
seq=128
config=${CONFIG:-bench/gpt-bench/config.json}
DPLAN=${DPLAN:-./build/dplan}
if [[ -n ${DPLAN_TORCH_VENV:-} ]]; then
    PYTHON=${PYTHON:-$DPLAN_TORCH_VENV/bin/python}
    TORCHRUN=${TORCHRUN:-$DPLAN_TORCH_VENV/bin/torchrun}
else
    PYTHON=${PYTHON:-python3}
    TORCHRUN=${TORCHRUN:-torchrun}
fi
all_pairings=(ddp-w1 ddp-w2 fsdp2-w2 tp-w2)
read -r -a pairings <<<"${PAIRINGS:-${all_pairings[*]}}"

if ! [[ $steps =~ ^[0-9]+$ ]] || (( steps <= warmup )) || ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [steps] [rounds]   (steps: a whole number above the $warmup warm-up steps; rounds >= 1)" >&2
    exit 2
fi
for p in "${pairings[@]}"; do
    [[ " ${all_pairings[*]} " == *" $p "* ]] || { echo "$0: PAIRINGS: unknown $p; valid: ${all_pairings[*]}" >&2; exit 2; }
done
# FSDP2 and DTensor tensor parallel need torch >= 2; DDP alone also runs on torch 1.13 (Debian's
# python3-torch, whose libtorch_cpu and BLAS are the ones a Debian-built dplan-worker links: the
# like-for-like control, PAIRINGS="ddp-w1 ddp-w2").
needs_torch2=0
for p in "${pairings[@]}"; do [[ $p == ddp-* ]] || needs_torch2=1; done
version=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)
if [[ -z $version ]] || (( needs_torch2 && ${version%%.*} < 2 )); then
    echo "$0: $PYTHON has no torch >= 2 (${version:-none}), which FSDP2 and tensor parallel need; set DPLAN_TORCH_VENV or PYTHON" >&2
    exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/torch_vs_dplan.XXXXXX") || exit 1
if [[ ${KEEP_TMP:-0} == 1 ]]; then
    trap 'echo "logs and JSON kept in $tmp" >&2' EXIT
else
    trap 'rm -rf "$tmp"' EXIT
fi

say() { echo "[$(date +%H:%M:%S)] $*" >&2; }
show_tail() { [[ -s $1 ]] && tail -n "${2:-15}" "$1" | sed 's/^/    | /' >&2; }

# pairing -> "engine world dplan-layout-flags"
declare -A spec=(
    [ddp-w1]="ddp 1 --tp 1 --dp 1"
    [ddp-w2]="ddp 2 --tp 1 --dp 2"
    [fsdp2-w2]="fsdp2 2 --tp 1 --dp 2 --zero 3"
    [tp-w2]="tp 2 --tp 2 --dp 1"
)

failures=()

# Debian's torch 1.13 under Python 3.11: torchrun's Std.from_str("0") returns None, so its default
# --redirects 0 / --tee 0 crash the launcher; a mapping that names only local rank 9 leaves ranks
# 0..8 at the default (no redirection).
torchrun_args=()
if "$PYTHON" -c '
import sys
from torch.distributed.elastic.multiprocessing.api import Std
sys.exit(0 if Std.from_str("0") is None else 1)' 2>/dev/null; then
    torchrun_args=(--redirects 9:0 --tee 9:0)
fi

# run_torch PAIRING ROUND: the median step time into $tmp/PAIRING.ROUND.torch.s
run_torch() {
    local pairing=$1 round=$2 engine world
    read -r engine world _ <<<"${spec[$pairing]}"
    local out=$tmp/$pairing.$round.torch.out err=$tmp/$pairing.$round.torch.err
    say "round $round $pairing: torch $engine, world $world"
    # numpy's own OpenBLAS (torch imports numpy) would otherwise keep a thread per core spinning
    # beside each rank: one thread per rank on both sides.
    if ! OPENBLAS_NUM_THREADS=1 "$TORCHRUN" --standalone --nproc_per_node "$world" "${torchrun_args[@]}" bench/torch_gpt.py --engine "$engine" \
            --config "$config" --steps "$steps" --warmup "$warmup" --global-batch "$global_batch" \
            --seq "$seq" >"$out" 2>"$err"; then
        show_tail "$err"
        failures+=("torch $pairing round $round")
        return
    fi
    "$PYTHON" -c '
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
result = json.loads(lines[-1])
json.dump(result.get("phases_s", {}), open(sys.argv[2], "w"))
print(result["median_step_s"])' "$out" "$tmp/$pairing.$round.torch.phases.json" >"$tmp/$pairing.$round.torch.s" ||
        failures+=("torch $pairing round $round (no result)")
}

# run_dplan PAIRING ROUND: estimate + run; run.json in $tmp/PAIRING.ROUND.run.json
run_dplan() {
    local pairing=$1 round=$2 engine world layout
    read -r engine world layout <<<"${spec[$pairing]}"
    local plan=$tmp/$pairing.plan.json run=$tmp/$pairing.$round.run.json
    local dp=${layout##*--dp }
    dp=${dp%% *}
    say "round $round $pairing: dplan $layout"
    # shellcheck disable=SC2086  # layout is a list of flags
    if [[ ! -f $plan ]] && ! "$DPLAN" estimate --model "$config" --cluster local-cpu --gpus "$world" $layout \
            --pp 1 --mbs $(( global_batch / dp )) --global-batch "$global_batch" --seq "$seq" --precision fp32 \
            -o "$plan" >"$tmp/$pairing.estimate.log" 2>&1; then
        show_tail "$tmp/$pairing.estimate.log"
        failures+=("dplan estimate $pairing")
        return
    fi
    if ! "$DPLAN" run "$plan" --steps "$steps" --warmup "$warmup" -o "$run" >"$tmp/$pairing.$round.run.log" 2>&1; then
        show_tail "$tmp/$pairing.$round.run.log"
        failures+=("dplan run $pairing round $round")
    fi
}

# Alternate torch and dplan, and which goes first from round to round, so that a drift in the
# machine's speed hits both alike.
for (( round = 1; round <= rounds; ++round )); do
    for pairing in "${pairings[@]}"; do
        if (( round % 2 )); then
            run_torch "$pairing" "$round"
            run_dplan "$pairing" "$round"
        else
            run_dplan "$pairing" "$round"
            run_torch "$pairing" "$round"
        fi
    done
done

echo
echo "GPT $config, global batch $global_batch x seq $seq, fp32, CPU, $(nproc) cores, 1 thread per rank;" \
     "$rounds rounds of $steps steps ($warmup warm-up); torch $version"
"$PYTHON" - "$tmp" "$rounds" "${pairings[@]}" <<'EOF'
import json, os, statistics, sys
tmp, rounds, pairings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'pairing':<9} {'torch step (ms)':>16} {'dplan step (ms)':>16} {'dplan/torch':>12} {'min-max':>13}  "
      f"phases, last round (ms): torch fwd bwd opt | dplan fwd bwd tp dp opt overhead")
worst = None
for p in pairings:
    ratios, t_ms, d_ms, phases, torch_phases = [], [], [], None, {}
    for r in range(1, rounds + 1):
        tf, df = f"{tmp}/{p}.{r}.torch.s", f"{tmp}/{p}.{r}.run.json"
        if not (os.path.exists(tf) and os.path.exists(df)):
            continue
        t = float(open(tf).read())
        run = json.load(open(df))
        d = run["step_time_s"]["median"]
        ratios.append(d / t)
        t_ms.append(t * 1e3)
        d_ms.append(d * 1e3)
        phases = run["phases_s"]
        pf = f"{tmp}/{p}.{r}.torch.phases.json"
        torch_phases = json.load(open(pf)) if os.path.exists(pf) else {}
    if not ratios:
        print(f"{p:<9} {'failed':>16}")
        continue
    med = statistics.median(ratios)
    worst = med if worst is None else max(worst, med)
    tph = " ".join(f"{torch_phases[k] * 1e3:.0f}" if k in torch_phases else "-" for k in ("forward", "backward", "optimizer"))
    ph = tph + " | " + " ".join(f"{phases.get(k, 0) * 1e3:.0f}" for k in ("forward", "backward", "tp_comm", "dp_comm", "optimizer", "overhead"))
    print(f"{p:<9} {statistics.median(t_ms):>16.1f} {statistics.median(d_ms):>16.1f} {med:>12.3f} "
          f"{min(ratios):>6.3f}-{max(ratios):.3f}  {ph}")
if worst is not None:
    if worst <= 1.0:
        print(f"verdict: dplan meets the target (median ratio <= 1.0 in every pairing; worst {worst:.3f})")
    else:
        print(f"verdict: dplan misses the target ratio <= 1.0 (worst pairing's median ratio {worst:.3f})")
EOF

if (( ${#failures[@]} > 0 )); then
    msg=$(printf '%s; ' "${failures[@]}")
    echo "incomplete, failed: ${msg%; }"
    exit 1
fi
