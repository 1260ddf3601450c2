#!/usr/bin/env bash
# Measured memory against the plan's prediction, per pipeline stage, on the layouts of the
# executor's memory tests (ZeRO 0-3, recompute none / selective / full, pp 1 and 2, sp, standard
# and flash attention, gpt-tiny and a Llama-style model; Nemotron, GPT-NeoX, gpt-oss with ep and
# cp, Qwen2-MoE with ep, DeepSeek-V3 and V2). Each layout is planned with `dplan estimate`, trained for a few steps
# with `dplan run` (fp32 on CPU), and read back with `dplan compare --json`. Prints one row per
# stage: weights + gradients + optimizer states and activations (the two bounds the test checks:
# 1 % and 15 %), and buffers. See bench/README.md.
#
#   bench/memory_vs_plan.sh [steps]     # steps per run (default 3; the first is left out)
#
# Environment: DPLAN (default ./build/dplan), PYTHON (for reading JSON, default python3),
# KEEP_TMP=1 keeps the plans and run.json files.

set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2

steps=${1:-3}
DPLAN=${DPLAN:-./build/dplan}
PYTHON=${PYTHON:-python3}
data=tests/data/executor
llama=$data/llama-tiny/config.json

if ! [[ $steps =~ ^[0-9]+$ ]] || (( steps < 2 )); then
    echo "usage: $0 [steps]   (at least 2: the first step is left out of the activations)" >&2
    exit 2
fi

tmp=$(mktemp -d)
if [[ ${KEEP_TMP:-0} == 1 ]]; then echo "files in $tmp" >&2; else trap 'rm -rf "$tmp"' EXIT; fi

# name | model | dplan estimate layout flags
layouts=(
    "zero0 pp1|gpt-tiny|--tp 1 --pp 1 --dp 1 --zero 0"
    "zero1 pp2 dp2|gpt-tiny|--tp 1 --pp 2 --dp 2 --zero 1"
    "zero2 tp2 dp2 selective standard-attn|gpt-tiny|--tp 2 --pp 1 --dp 2 --zero 2 --recompute selective --attention standard"
    "zero3 dp4|gpt-tiny|--tp 1 --pp 1 --dp 4 --zero 3"
    "zero3 pp2 dp2 full gpipe|gpt-tiny|--tp 1 --pp 2 --dp 2 --zero 3 --recompute full --schedule gpipe"
    "zero1 tp2 pp2 dp2 sp full|gpt-tiny|--tp 2 --pp 2 --dp 2 --sp --zero 1 --recompute full"
    "zero0 pp2 standard-attn|gpt-tiny|--tp 1 --pp 2 --dp 1 --attention standard"
    "llama zero2 tp2 pp2 sp|$llama|--tp 2 --pp 2 --dp 1 --sp --zero 2"
    "nemotron tp2 sp|$data/nemotron-tiny/config.json|--tp 2 --pp 1 --dp 1 --sp"
    "gpt-neox|$data/gpt-neox-tiny/config.json|--tp 1 --pp 1 --dp 1"
    "gpt-oss dp2 ep2|$data/gpt-oss-tiny/config.json|--tp 1 --pp 1 --dp 2 --ep 2 --etp 1"
    "gpt-oss cp2|$data/gpt-oss-tiny/config.json|--tp 1 --pp 1 --dp 1 --cp 2"
    "qwen2-moe dp2 ep2|$data/qwen2-moe-tiny/config.json|--tp 1 --pp 1 --dp 2 --ep 2 --etp 1"
    "deepseek-v3 tp2 dp2 sp ep2|$data/deepseek-v3-tiny/config.json|--tp 2 --pp 1 --dp 2 --sp --ep 2 --etp 1"
    "deepseek-v3 cp2|$data/deepseek-v3-tiny/config.json|--tp 1 --pp 1 --dp 1 --cp 2"
    "deepseek-v2|$data/deepseek-v2-tiny/config.json|--tp 1 --pp 1 --dp 1"
)

printf '%-38s %5s  %12s %12s %7s  %12s %12s %7s  %10s %10s\n' layout stage "W+G+O pred" "W+G+O meas" "err %" \
    "act pred" "act meas" "err %" "buf pred" "buf meas"
status=0
i=0
for entry in "${layouts[@]}"; do
    IFS='|' read -r name model flags <<<"$entry"
    i=$((i + 1))
    # shellcheck disable=SC2086
    gpus=$(( $(echo $flags | sed -E 's/.*--tp ([0-9]+).*--pp ([0-9]+).*--dp ([0-9]+).*/\1*\2*\3/') ))
    if [[ $flags =~ --cp\ ([0-9]+) ]]; then gpus=$((gpus * BASH_REMATCH[1])); fi
    plan=$tmp/plan$i.json run=$tmp/run$i.json
    # shellcheck disable=SC2086
    if ! "$DPLAN" estimate --model "$model" --cluster local-cpu --gpus "$gpus" $flags --mbs 1 --global-batch 8 \
            --precision fp32 -o "$plan" >"$tmp/estimate$i.log" 2>&1 ||
       ! "$DPLAN" run "$plan" --steps "$steps" --warmup 1 --quiet -o "$run" >"$tmp/run$i.log" 2>&1 ||
       ! "$DPLAN" compare "$plan" "$run" --json >"$tmp/compare$i.json" 2>"$tmp/compare$i.log"; then
        echo "$name: failed; see the logs (KEEP_TMP=1)" >&2
        status=1
        continue
    fi
    "$PYTHON" - "$name" "$tmp/compare$i.json" <<'EOF'
import json, sys
name, path = sys.argv[1], sys.argv[2]
for s in json.load(open(path))["memory"]:
    p = sum(s[k]["predicted"] for k in ("weights", "gradients", "optimizer"))
    m = sum(s[k]["measured"] for k in ("weights", "gradients", "optimizer"))
    a, b = s["activations"], s["buffers"]
    pct = lambda pred, meas: 100.0 * (meas - pred) / pred if pred else float("nan")
    print(f"{name:38s} {s['stage']:5d}  {p:12.0f} {m:12.0f} {pct(p, m):+7.2f}  "
          f"{a['predicted']:12.0f} {a['measured']:12.0f} {pct(a['predicted'], a['measured']):+7.1f}  "
          f"{b['predicted']:10.0f} {b['measured']:10.0f}")
EOF
done
echo "bytes; err % = (measured - predicted) / predicted; bounds checked by the memory test: 1 % and 15 %"
exit $status
