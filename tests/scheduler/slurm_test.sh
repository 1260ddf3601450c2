#!/usr/bin/env bash
# The exported Slurm job, run through a real Slurm: tests/scheduler/slurm-up.sh starts a private
# Slurm 22.05 on this machine with two nodes (two slurmd, `slurmd -N`, named 127.0.0.1 and
# 127.0.0.2), and the test submits `dplan export PLAN --to slurm`'s dplan.sbatch to it with sbatch.
# The job asks for the plan's 2 nodes x 2 tasks; srun starts the 4 dplan-worker ranks, which meet at
# MASTER_ADDR (the job's first node), train gpt-tiny tp 2 x dp 2 for a few steps and write run.json,
# which must be a run record of 4 ranks launched by Slurm that `dplan compare` accepts.
#
#   tests/scheduler/slurm_test.sh DPLAN PYTHON
#
# DPLAN is build/dplan (dplan-worker beside it), PYTHON any python3 (reads run.json). Needs root and
# Slurm (./setup.sh --slurm): without them the test fails with one line saying so, never skips.
# Slurm is stopped and the temporary folder removed on every exit; on failure the job's output and
# the daemons' log tails are printed first.
set -euo pipefail
NAME=slurm_test
if [[ $# -ne 2 ]]; then
  echo "usage: $0 DPLAN PYTHON" >&2
  exit 2
fi
DPLAN=$1
PYTHON=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
for tool in sbatch slurmd slurmctld munged; do
  command -v $tool >/dev/null || fail "$tool not found: Slurm is not installed; run ./setup.sh --slurm (Debian's slurm-wlm and munge)"
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dplan-slurm-test-XXXXXX")
chmod 0711 "$TMP"  # munged's socket is below it (slurm-up.sh)
status=1
finish() {
  if ((status != 0)); then
    for log in "$TMP"/submit/job.out "$TMP"/slurm/slurmctld.log "$TMP"/slurm/slurmd-*.log; do
      [[ -s $log ]] && { echo "--- tail of $log" >&2; tail -n 15 "$log" >&2; }
    done
  fi
  "$HERE/slurm-down.sh" "$TMP/slurm" >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap finish EXIT

make_plan "$TMP"
"$DPLAN" export "$TMP/plan.json" --to slurm -o "$TMP/export" >"$TMP/export.out" 2>&1 ||
  { cat "$TMP/export.out" >&2; fail "dplan export --to slurm failed"; }
[[ -x $TMP/export/dplan.sbatch ]] || fail "dplan export --to slurm wrote no executable dplan.sbatch"
grep -Eq -- '--nodes[= ]+2\b' "$TMP/export/dplan.sbatch" || fail "dplan.sbatch does not ask for the plan's 2 nodes"

"$HERE/slurm-up.sh" "$TMP/slurm" "$NODES"
export SLURM_CONF=$TMP/slurm/slurm.conf

# Submitted from a folder of its own, so the job's ranks (which start there) write run.json there;
# the script finds plan.json beside itself. sbatch passes this environment on (DPLAN_WORKER, and a
# free MASTER_PORT: dplan-worker's default 29500 may be taken by another test).
mkdir -p "$TMP/submit"
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cd "$TMP/submit"
echo "$NAME: sbatch --wait $TMP/export/dplan.sbatch --steps $STEPS (DPLAN_WORKER=$WORKER MASTER_PORT=$port)"
rc=0
DPLAN_WORKER=$WORKER MASTER_PORT=$port timeout 240 sbatch --parsable --wait --job-name dplan-test --time 4 -o job.out \
  "$TMP/export/dplan.sbatch" --steps "$STEPS" >job.id || rc=$?
((rc != 124)) || fail "the Slurm job was not done in 240 s"
((rc == 0)) || fail "the Slurm job failed (sbatch --wait: exit $rc)"
job=$(<job.id)
echo "--- the output of job $job ($TMP/submit/job.out):"
cat job.out
# Both nodes started tasks of the job's step (srun's step 0): each slurmd logs its launch.
for log in "$TMP"/slurm/slurmd-*.log; do
  grep -q "launch task StepId=$job.0 " "$log" || fail "$log has no launch of job $job's srun step: the tasks did not run on both nodes"
done
echo "$NAME: job $job's srun step ran on both nodes ($(cd "$TMP/slurm" && echo slurmd-*.log))"
check_run "$TMP/plan.json" "$TMP/submit/run.json" slurm
status=0
