#!/usr/bin/env bash
# The exported torchrun launch, run as on two nodes: `dplan export PLAN --to torchrun` writes
# launch-torchrun.sh, and the test starts it twice on this machine, each copy a "node" with a
# folder of its own, MASTER_ADDR=127.0.0.1, a free MASTER_PORT and one RUN_ID: the two torchrun
# agents meet in a c10d rendezvous, each starts 2 dplan-worker ranks, and the 4 ranks train gpt-tiny
# tp 2 x dp 2 for a few steps. Rank 0 writes run.json in its node's folder (whichever node the
# rendezvous made first): exactly one run.json, a run record of 4 ranks launched by torchrun that
# `dplan compare` accepts.
#
#   tests/scheduler/torchrun_two_agents_test.sh DPLAN PYTHON TORCHRUN
#
# DPLAN is build/dplan (dplan-worker beside it), PYTHON any python3 (reads run.json), TORCHRUN the
# torchrun to put first on PATH (the launch script runs `torchrun`): PyTorch 2.x's, or Debian's
# /usr/bin/torchrun (PyTorch 1.13). The agents are stopped on every exit (each in a process group of
# its own, killed with its workers); each is given 240 s.
set -euo pipefail
NAME=torchrun_two_agents_test
if [[ $# -ne 3 ]]; then
  echo "usage: $0 DPLAN PYTHON TORCHRUN" >&2
  exit 2
fi
DPLAN=$1
PYTHON=$2
TORCHRUN=$3
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
[[ -x $TORCHRUN && $(basename "$TORCHRUN") == torchrun ]] || fail "$TORCHRUN is not an executable torchrun"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dplan-torchrun-test-XXXXXX")
agents=()
status=1
finish() {
  for pid in "${agents[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 1
  for pid in "${agents[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  if ((status != 0)); then
    for log in "$TMP"/node*/agent.log; do
      [[ -s $log ]] && { echo "--- tail of $log" >&2; tail -n 25 "$log" >&2; }
    done
  fi
  rm -rf "$TMP"
}
trap finish EXIT

make_plan "$TMP"
"$DPLAN" export "$TMP/plan.json" --to torchrun -o "$TMP/export" >"$TMP/export.out" 2>&1 ||
  { cat "$TMP/export.out" >&2; fail "dplan export --to torchrun failed"; }
[[ -x $TMP/export/launch-torchrun.sh ]] || fail "dplan export --to torchrun wrote no executable launch-torchrun.sh"

PATH=$(dirname "$TORCHRUN"):$PATH
[[ $(command -v torchrun) == "$TORCHRUN" ]] || fail "torchrun on PATH is $(command -v torchrun), not $TORCHRUN"
torch_python=$(head -n 1 "$TORCHRUN" | sed 's/^#! *//')
version=$($torch_python -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
  fail "$TORCHRUN's python ($torch_python) cannot import torch"
echo "$NAME: $TORCHRUN, PyTorch $version"
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RUN_ID=dplan-test-$$ DPLAN_WORKER=$WORKER
for node in 0 1; do
  mkdir -p "$TMP/node$node"
  (cd "$TMP/node$node" && exec setsid -w timeout 240 "$TMP/export/launch-torchrun.sh" --steps "$STEPS" >agent.log 2>&1) &
  agents+=($!)
done
failed=0
for i in 0 1; do
  rc=0
  wait "${agents[i]}" || rc=$?
  ((rc == 124)) && echo "$NAME: agent $i (node$i) was not done in 240 s" >&2
  ((rc == 0)) || { echo "$NAME: agent $i (node$i) exited $rc" >&2; failed=1; }
done
agents=()
((failed == 0)) || fail "a torchrun agent failed (logs below)"
for node in 0 1; do
  echo "--- node$node/agent.log (last lines)"
  tail -n 8 "$TMP/node$node/agent.log"
done
runs=("$TMP"/node*/run.json)
[[ -e ${runs[0]} ]] || fail "neither node's folder has a run.json"
((${#runs[@]} == 1)) || fail "both nodes wrote a run.json (${runs[*]}); only rank 0 should"
check_run "$TMP/plan.json" "${runs[0]}" torchrun
status=0
