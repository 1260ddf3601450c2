# shellcheck shell=bash
# Shared by the scheduler tests (sourced, not run): the plan they launch and the checks of the
# run.json it leaves. Expects NAME (the test's name, for error lines), DPLAN, PYTHON and TMP set;
# sets WORKER after checking both binaries.
#
# The plan: gpt-tiny, tp 2 x dp 2 (4 ranks), fp32, 8 sequences of 64 tokens a step, on a copy of
# the local-cpu cluster profile with 2 ranks per node, so the plan spans 2 nodes (tp inside a node,
# dp across the two).
STEPS=4
RANKS=4
# shellcheck disable=SC2034  # used by the scripts that source this
NODES=2  # the plan's nodes: RANKS / 2 ranks per node

fail() { echo "$NAME: error: $*" >&2; exit 1; }

# The dplan-worker beside $DPLAN, both checked executable; sets WORKER.
WORKER=$(dirname "$DPLAN")/dplan-worker
[[ -x $DPLAN ]] || fail "$DPLAN is not an executable dplan"
[[ -x $WORKER ]] || fail "no dplan-worker beside $DPLAN (build the executor)"

# make_plan DIR: writes DIR/cluster.json and DIR/plan.json.
make_plan() {
  local dir=$1 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  sed -e 's/"gpus_per_node": 8/"gpus_per_node": 2/' -e 's/"name": "local-cpu"/"name": "local-cpu-2-per-node"/' \
    "$root/profiles/clusters/local-cpu.json" >"$dir/cluster.json"
  grep -q '"gpus_per_node": 2' "$dir/cluster.json" || fail "could not make a 2-ranks-per-node copy of profiles/clusters/local-cpu.json"
  "$DPLAN" estimate --model gpt-tiny --cluster "$dir/cluster.json" --gpus $RANKS --tp 2 --dp 2 --mbs 1 \
    --global-batch 8 --seq 64 --precision fp32 -o "$dir/plan.json" >"$dir/estimate.out" 2>&1 ||
    { cat "$dir/estimate.out" >&2; fail "dplan estimate failed"; }
}

# check_run PLAN RUN_JSON LAUNCHER: RUN_JSON is a run record of PLAN's 4 ranks, $STEPS steps,
# launched by LAUNCHER (slurm or torchrun), and `dplan compare PLAN RUN_JSON` accepts it.
check_run() {
  local plan=$1 run=$2 launcher=$3
  [[ -s $run ]] || fail "no run.json at $run"
  "$PYTHON" - "$run" "$RANKS" "$STEPS" "$launcher" <<'EOF' || fail "$run is not the run record expected (above)"
import json, sys
path, ranks, steps, launcher = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
run = json.load(open(path))
problems = []
def want(what, got, expected):
    if got != expected:
        problems.append(f"{what} is {got!r}, expected {expected!r}")
want("environment.world_size", run.get("environment", {}).get("world_size"), ranks)
want("config.launcher", run.get("config", {}).get("launcher"), launcher)
want("config.steps", run.get("config", {}).get("steps"), steps)
want("layout (tp, dp)", (run.get("layout", {}).get("tp"), run.get("layout", {}).get("dp")), (2, 2))
want("ranks in phases_by_rank_s", len(run.get("phases_by_rank_s", [])), ranks)
for p in problems:
    print(p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
  "$DPLAN" compare "$plan" "$run" >"$TMP/compare.out" 2>&1 || { cat "$TMP/compare.out" >&2; fail "dplan compare $plan $run failed"; }
  echo "$NAME: $run: $RANKS ranks, $STEPS steps, launcher $launcher; dplan compare accepts it:"
  sed -n '1p;/^summary:/p' "$TMP/compare.out"
}
