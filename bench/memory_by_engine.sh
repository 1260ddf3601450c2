#!/usr/bin/env bash
# Memory per GPU of canonical layouts, engine by engine, every component of the worst pipeline
# stage as dplan's memory model counts it (docs/cost-model.md, "What the memory model counts"):
# Llama 3 70B and Mixtral 8x22B on 64 H100, DeepSeek-V3 on 1,024 H100. Each row is `dplan
# estimate --engine E` of the layout that engine's own recipes use, or the search's pick for it
# where none is published; a layout an engine cannot run is said so. Predictions, not
# measurements: the measured checks are tests/costmodel/memory_golden_test.cpp and the executor's.
#
#   bench/memory_by_engine.sh
#
# Environment: DPLAN (default ./build/dplan), PYTHON (for reading JSON, default python3).

set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2
DPLAN=${DPLAN:-./build/dplan}
PYTHON=${PYTHON:-python3}
[[ -x $DPLAN ]] || { echo "$0: $DPLAN is not built (./setup.sh)" >&2; exit 2; }

# model | gpus | engine | where the layout comes from | dplan estimate flags
rows=(
    "llama-3-70b|64|megatron|NeMo's Llama 3 70B recipe|--tp 4 --pp 4 --cp 2 --vpp 5 --schedule interleaved --dist-opt --sp"
    "llama-3-70b|64|torchtitan|torchtitan's llama3_70b.toml: tp 8, FSDP, full AC|--tp 8 --zero 3 --sp --recompute full"
    "llama-3-70b|64|torchtitan|op-level selective AC instead|--tp 8 --zero 3 --sp --recompute selective"
    "llama-3-70b|64|deepspeed|the search's pick|--zero 3 --recompute full --mbs 2"
    "mixtral-8x22b|64|megatron|the search's pick|--tp 2 --pp 4 --cp 4 --ep 8 --etp 1 --vpp 7 --schedule interleaved --dist-opt --sp"
    "mixtral-8x22b|64|deepspeed|the search's pick|--zero 3 --recompute full --mbs 4"
    "deepseek-v3|1024|megatron|Megatron-MoE-ModelZoo's H100 run without its vpp 4 (its explicit layout)|--tp 2 --pp 8 --ep 64 --etp 1 --dist-opt --sp --seq 4096 --global-batch 8192 --precision fp8 --recompute selective --recompute-modules mla_up_proj,mlp --first-stage-layers 5 --last-stage-layers 8"
    "deepseek-v3|1024|megatron|the same with Megatron's default selective recompute (core_attn)|--tp 2 --pp 8 --ep 64 --etp 1 --dist-opt --sp --seq 4096 --global-batch 8192 --precision fp8 --recompute selective --first-stage-layers 5 --last-stage-layers 8"
    "deepseek-v3|1024|megatron|the same with its bf16 Adam moments|--tp 2 --pp 8 --ep 64 --etp 1 --dist-opt --sp --seq 4096 --global-batch 8192 --precision fp8 --recompute selective --recompute-modules mla_up_proj,mlp --first-stage-layers 5 --last-stage-layers 8 --bf16-adam-moments"
    "deepseek-v3|1024|deepspeed|the search's pick, without the MTP module DeepSpeed cannot train|--tp 32 --etp 32 --zero 2 --recompute full --mbs 2 --mtp-layers 0"
)

# Reads one `dplan estimate --json` and prints the worst stage's components in GiB.
read -r -d '' row_of <<'PY'
import json, sys
d = json.loads(sys.argv[1])
m = d["memory"]
s = m["stages"][m["worst_stage"]]
p = d["parallel"]
g = 2.0**30
lay = " ".join("%s %d" % (k, p[k]) for k in ("tp", "pp", "dp", "cp", "ep") if p.get(k, 1) > 1)
lay += " mbs %d zero %d%s %s" % (p["micro_batch"], p["zero_stage"], " dist-opt" if p["distributed_optimizer"] else "", p["recompute"])
parts = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes", "buffers_bytes",
         "reserve_bytes", "total_bytes")
print("%-62s" % lay + "".join(" %6.1f" % (s[k] / g) for k in parts) + " %7s" % ("fits" if m["fits"] else "misses"))
PY

printf '%-14s %-11s %-62s %6s %6s %6s %6s %6s %6s %6s %6s %7s\n' model engine layout weights grads optim activ logits buffers outside total verdict
for row in "${rows[@]}"; do
    IFS='|' read -r model gpus engine origin flags <<<"$row"
    # shellcheck disable=SC2086  # the flags are words
    out=$("$DPLAN" estimate --model "$model" --gpus "$gpus" --engine "$engine" $flags --json 2>&1)
    if ! line=$("$PYTHON" -c "$row_of" "$out" 2>/dev/null); then
        line="refused: $(printf '%s' "$out" | head -1)"
    fi
    printf '%-14s %-11s %s   (%s)\n' "$model" "$engine" "$line" "$origin"
done
echo "GiB per GPU, worst pipeline stage; 'outside' is what the device holds outside the caching allocator"
echo "(the profile's reserve and NCCL's buffers); 'fits' means within the usable memory at the default headroom."
