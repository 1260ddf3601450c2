#!/usr/bin/env bash
# Stops the Slurm that tests/scheduler/slurm-up.sh STATE_DIR started: cancels its jobs, then stops
# each slurmd, slurmctld and munged by the pid in its pid file under STATE_DIR (TERM, then KILL
# after 10 s), and only a process whose name is that daemon's. STATE_DIR itself (logs, spool) is
# left for the caller to read or remove. Safe to run twice or on a half-started Slurm.
#
#   tests/scheduler/slurm-down.sh STATE_DIR
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 STATE_DIR" >&2
  exit 2
fi
state=$1
[[ -d $state ]] || { echo "slurm-down: error: $state is not a folder" >&2; exit 2; }
status=0

# stop PIDFILE NAME: the process in PIDFILE, when it is NAME.
stop() {
  local file=$1 name=$2 pid
  [[ -s $file ]] || return 0
  pid=$(<"$file")
  if [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]]; then
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 100; ++i)); do
      [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] || break
      sleep 0.1
    done
    if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]]; then
      echo "slurm-down: $name (pid $pid) ignored TERM for 10 s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null
      status=1
    fi
  fi
  rm -f "$file"
}

if [[ -s $state/slurmctld.pid && -f $state/slurm.conf ]]; then
  export SLURM_CONF=$state/slurm.conf
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null || true)
  if [[ -n $jobs ]]; then
    # shellcheck disable=SC2086  # one argument per job id
    timeout 10 scancel $jobs 2>/dev/null || true
    for ((i = 0; i < 30; ++i)); do
      [[ -z $(timeout 10 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 1
    done
  fi
fi
for file in "$state"/slurmd-*.pid; do
  [[ -e $file ]] && stop "$file" slurmd
done
stop "$state/slurmctld.pid" slurmctld
stop "$state/munged.pid" munged
exit $status
