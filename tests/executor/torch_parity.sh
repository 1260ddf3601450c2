#!/usr/bin/env bash
# dplan's executor against PyTorch 2.x's own engines, step by step, from the same start.
#
#   tests/executor/torch_parity.sh DPLAN PYTHON
#
# DPLAN is build/dplan (dplan-worker beside it); PYTHON a Python whose torch is >= 2 (FSDP2 and
# DTensor tensor parallel). A one-rank `dplan run --save-reference` writes gpt-tiny's initial
# weights and the token ids of every step; then for each pairing
#
#   dplan dp 2            vs  torch DistributedDataParallel, world 2
#   dplan dp 2, ZeRO-3    vs  torch FSDP2 (fully_shard, reshard_after_forward), world 2
#   dplan tp 2            vs  torch tensor parallel (parallelize_module, Colwise/Rowwise), world 2
#
# and tp 2 once more on gpt-tiny with a vocabulary of 259 tokens (tests/data/executor/
# gpt-tiny-odd-vocab), which the executor pads to a multiple of tp; both train those steps (fp32,
# CPU, Gloo) and every step's loss, and its gradient norm before clipping, must agree within 1e-4
# relative. Prints the table (step, dplan loss, torch loss, relative difference, the gradient
# norms and theirs). Exit status 0 when every step of every pairing agrees, 1 otherwise; a
# missing piece (a binary, torch < 2, a failed run) fails too: this test never passes by skipping.
#
# DPLAN_PARITY_PERTURB=NAME perturbs one weight in the PyTorch side's copy (torch_gpt.py
# --perturb): the test must then fail, which shows it can.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 DPLAN PYTHON" >&2
    exit 2
fi
DPLAN=$1
PYTHON=$2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TORCH_GPT=$ROOT/bench/torch_gpt.py
STEPS=6
GLOBAL_BATCH=4
SEQ=64
TOLERANCE=1e-4
# Ten times dplan run's default learning rate, so that a few steps move the weights enough for a
# wrong update (weight decay on the wrong tensors, a missing bias correction) to show in the loss.
LR=1e-2

fail() { echo "torch_parity: error: $*" >&2; exit 1; }
[[ -x $DPLAN ]] || fail "$DPLAN is not an executable dplan"
[[ -x $(dirname "$DPLAN")/dplan-worker ]] || fail "no dplan-worker beside $DPLAN (build the executor)"
[[ -f $TORCH_GPT ]] || fail "$TORCH_GPT is missing"
version=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null) || fail "$PYTHON cannot import torch"
[[ ${version%%.*} -ge 2 ]] || fail "$PYTHON has torch $version; FSDP2 and DTensor tensor parallel need torch >= 2"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dplan-torch-parity-XXXXXX")
trap 'rm -rf "$TMP"' EXIT

estimate() {  # MODEL NAME TP DP [extra flags...]
    local model=$1 name=$2 tp=$3 dp=$4
    shift 4
    "$DPLAN" estimate --model "$model" --cluster local-cpu --gpus $((tp * dp)) --tp "$tp" --pp 1 --dp "$dp" \
        --mbs 1 --global-batch $GLOBAL_BATCH --seq $SEQ --precision fp32 "$@" -o "$TMP/$name.json" >/dev/null ||
        fail "dplan estimate for $name failed"
}
run() {  # NAME [extra flags...]
    local name=$1
    shift
    "$DPLAN" run "$TMP/$name.json" --steps $STEPS --warmup 0 --lr $LR --quiet -o "$TMP/$name.run.json" "$@" \
        2>"$TMP/$name.err" || { cat "$TMP/$name.err" >&2; fail "dplan run of $name failed"; }
}

perturb=()
[[ -n ${DPLAN_PARITY_PERTURB:-} ]] && perturb=(--perturb "$DPLAN_PARITY_PERTURB")
status=0
# MODEL|pairing;pairing...: each pairing is "NAME TP DP ENGINE [dplan flags]". gpt-tiny-odd-vocab
# (259 tokens) checks the executor's vocabulary padding: with --vocab-pad-multiple 1, tp 2 pads it
# to 260 rows and masks the padding out of the softmax, while PyTorch's tensor parallel leaves the
# embedding whole (259 rows, as the one-rank reference has it). (With Megatron's default 128 x tp
# both sides hold padding rows, 384 and 512, whose other GEMM shapes alone move step 5's gradient
# norm by 1e-4 at this learning rate, in PyTorch as in dplan.)
ODD_VOCAB=$ROOT/tests/data/executor/gpt-tiny-odd-vocab/config.json
for suite in "gpt-tiny|dp2 1 2 ddp;zero3 1 2 fsdp2 --zero 3;tp2 2 1 tp" "$ODD_VOCAB|odd-tp2 2 1 tp"; do
    model=${suite%%|*}
    label=$model
    [[ $model == */config.json ]] && label=$(basename "$(dirname "$model")")  # a config file's folder names it
    IFS=';' read -r -a suite_pairings <<<"${suite#*|}"
    model_flags=()
    [[ $model == "$ODD_VOCAB" ]] && model_flags=(--vocab-pad-multiple 1)
    # The reference inputs: one rank, the same seed and data stream as the two-rank runs.
    ref=$TMP/$label.safetensors
    estimate "$model" one 1 1 "${model_flags[@]}"
    run one --save-reference "$ref"
    [[ -s $ref ]] || fail "dplan run --save-reference wrote no file"
    for pairing in "${suite_pairings[@]}"; do
        read -r name tp dp engine extra <<<"$pairing"
        # shellcheck disable=SC2086  # extra is empty or "--zero 3"
        estimate "$model" "$name" "$tp" "$dp" $extra "${model_flags[@]}"
        run "$name"
        "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 2 "$TORCH_GPT" --engine "$engine" \
            --reference "$ref" "${perturb[@]}" >"$TMP/$name.torch.json" 2>"$TMP/$name.torch.err" ||
            { tail -20 "$TMP/$name.torch.err" >&2; fail "torch_gpt.py --engine $engine failed"; }
        "$PYTHON" - "$TMP/$name.run.json" "$TMP/$name.torch.json" \
            "$label $name ($([[ -n $extra ]] && echo "$extra, ")tp $tp dp $dp)" \
            "$engine" $TOLERANCE <<'EOF' || status=1
import json, sys
run_path, torch_path, what, engine, tol = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
run = json.load(open(run_path))
lines = [l for l in open(torch_path) if l.startswith("{")]
if not lines:
    sys.exit(f"torch_parity: error: {torch_path}: torch_gpt.py printed no result")
ref = json.loads(lines[-1])
dplan_loss = [s["loss"] for s in run["steps"]]
dplan_norm = [s["grad_norm"] for s in run["steps"]]
if len(dplan_loss) != len(ref["losses"]):
    sys.exit(f"torch_parity: error: {what}: dplan ran {len(dplan_loss)} steps, torch {len(ref['losses'])}")
print(f"dplan {what} vs torch {engine} world {ref['world_size']} (torch {ref['torch_version']})")
print(f"{'step':>4} {'dplan loss':>12} {'torch loss':>12} {'rel diff':>10} "
      f"{'dplan grad norm':>16} {'torch grad norm':>16} {'rel diff':>10}")
worst = 0.0
for i, (a, b) in enumerate(zip(dplan_loss, ref["losses"])):
    na, nb = dplan_norm[i], ref["grad_norms"][i]
    rel, rel_norm = abs(a - b) / abs(b), abs(na - nb) / abs(nb)
    worst = max(worst, rel, rel_norm)
    print(f"{i:>4} {a:>12.7f} {b:>12.7f} {rel:>10.2e} {na:>16.7f} {nb:>16.7f} {rel_norm:>10.2e}")
verdict = "ok" if worst <= tol else "MISMATCH"
print(f"largest relative difference (losses and gradient norms) {worst:.2e} (tolerance {tol:g}): {verdict}\n")
sys.exit(0 if worst <= tol else 1)
EOF
    done
done
[[ $status -eq 0 ]] || fail "dplan and PyTorch disagree beyond $TOLERANCE relative (table above)"
echo "torch_parity: all pairings agree within $TOLERANCE relative"
