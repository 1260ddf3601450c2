#!/usr/bin/env bash
# Starts a private Slurm on this machine for tests: munged, slurmctld and NODES slurmd daemons
# (default 2), each slurmd a node of its own on this host (`slurmd -N NAME`, every node on its own
# port), in one partition, with no cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
# JobAcctGatherType=jobacct_gather/none), and waits until sinfo shows every node idle.
#
#   tests/scheduler/slurm-up.sh STATE_DIR [NODES]
#   export SLURM_CONF=STATE_DIR/slurm.conf    # then sbatch, srun, sinfo, squeue use this Slurm
#   tests/scheduler/slurm-down.sh STATE_DIR   # stops it
#
# Everything is written under STATE_DIR (created if missing, made mode 0755; munged requires every
# folder above its socket, those above STATE_DIR too, to be searchable by all): slurm.conf, munge's
# own key (munge.key) and socket, the daemons' pid files, logs, spool and state folders. Nothing is
# written outside it: munged runs with --key-file, --socket, --pid-file, --log-file and --seed-file
# there, and slurm.conf points Slurm at that socket (AuthInfo=socket=...), so neither
# /etc/munge/munge.key nor /run/munge is used.
#
# The nodes are named by loopback addresses: 127.0.0.1, 127.0.0.2, ... (Linux routes all of
# 127.0.0.0/8 to this machine), because a job script takes its MASTER_ADDR from `scontrol show
# hostnames "$SLURM_JOB_NODELIST"`, as on a real cluster, so a node's name must reach it; names from
# /etc/hosts would not do: Slurm reads NodeName=localhost as this host's own name, and slurmd refuses
# two nodes with one NodeHostname ("Duplicated NodeHostName"). Each node has this machine's CPU
# count and 1/NODES of its memory.
#
# Needs root (slurmd starts job steps as the submitting user) and Debian's slurm-wlm and munge
# (./setup.sh --slurm installs them). Environment: SLURM_UP_PORT, the first of NODES + 1
# consecutive TCP ports (default: the first free run from 16817); SLURM_UP_TIMEOUT_S (default 60),
# how long to wait for the nodes. On failure: one error line naming the log to read, exit 1 (bad
# arguments: exit 2), and whatever was started is stopped again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

fail() { echo "slurm-up: error: $*" >&2; exit 1; }
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 STATE_DIR [NODES]" >&2
  exit 2
fi
state=$1
nodes=${2:-2}
if ! [[ $nodes =~ ^[1-9][0-9]*$ ]]; then
  echo "slurm-up: error: NODES '$nodes' is not a positive integer" >&2
  exit 2
fi
timeout_s=${SLURM_UP_TIMEOUT_S:-60}

for tool in munged mungekey munge unmunge slurmctld slurmd sinfo scontrol sbatch srun; do
  command -v "$tool" >/dev/null ||
    fail "$tool not found: install Slurm and munge with ./setup.sh --slurm (Debian's slurm-wlm and munge)"
done
[[ $(id -u) -eq 0 ]] || fail "needs root: slurmd starts job steps as the submitting user"

mkdir -p "$state"
state=$(cd "$state" && pwd)
chmod 0755 "$state"
# munged refuses a socket below a folder that not everyone may search (execute permission).
dir=$state
while [[ $dir != / ]]; do
  dir=$(dirname "$dir")
  (( 8#$(stat -c %a "$dir") & 1 )) ||
    fail "$dir is mode $(stat -c %a "$dir"): munged needs every folder above its socket searchable by all (chmod o+x $dir)"
done
[[ -e $state/slurmctld.pid ]] && fail "$state already holds a running or stale Slurm (slurmctld.pid): run slurm-down.sh $state first"

# The nodes' names: loopback addresses, 127.0.0.1, 127.0.0.2, ... (see the header).
((nodes <= 254)) || fail "at most 254 nodes (127.0.0.1 to 127.0.0.254), not $nodes"
names=()
for ((i = 1; i <= nodes; ++i)); do names+=("127.0.0.$i"); done

# Ports: NODES + 1 consecutive ones that nothing listens on.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=${SLURM_UP_PORT:-}
if [[ -z $base ]]; then
  for ((try = 16817; try < 16817 + 100 * (nodes + 1); try += nodes + 1)); do
    ok=1
    for ((p = try; p <= try + nodes; ++p)); do port_free "$p" || { ok=0; break; }; done
    if ((ok)); then base=$try; break; fi
  done
  [[ -n $base ]] || fail "no $((nodes + 1)) consecutive free TCP ports from 16817; set SLURM_UP_PORT"
fi

cleanup_on_failure() { "$here/slurm-down.sh" "$state" >/dev/null 2>&1 || true; }
trap cleanup_on_failure ERR

# munge: a key of its own, a daemon of its own.
if [[ ! -s $state/munge.key ]]; then
  mungekey --create --keyfile="$state/munge.key" || fail "mungekey could not create $state/munge.key"
fi
chmod 0600 "$state/munge.key"
munged --socket="$state/munge.socket" --key-file="$state/munge.key" --pid-file="$state/munged.pid" \
  --log-file="$state/munged.log" --seed-file="$state/munged.seed" ||
  { cleanup_on_failure; fail "munged did not start; see $state/munged.log"; }
echo ok | munge --socket="$state/munge.socket" | unmunge --socket="$state/munge.socket" >/dev/null ||
  { cleanup_on_failure; fail "munge cannot encode and decode a credential; see $state/munged.log"; }

cpus=$(nproc)
mem_mib=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
node_mem_mib=$((mem_mib / nodes))
mkdir -p "$state/ctld"
{
  echo "# Written by tests/scheduler/slurm-up.sh: a private Slurm 22.05 on $(hostname -s), no cgroups."
  echo "ClusterName=dplantest"
  echo "SlurmctldHost=$(hostname -s)(127.0.0.1)"
  echo "SlurmctldPort=$base"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$state/munge.socket"
  echo "StateSaveLocation=$state/ctld"
  echo "SlurmdSpoolDir=$state/slurmd-%n"
  echo "SlurmctldPidFile=$state/slurmctld.pid"
  echo "SlurmdPidFile=$state/slurmd-%n.pid"
  echo "SlurmctldLogFile=$state/slurmctld.log"
  echo "SlurmdLogFile=$state/slurmd-%n.log"
  echo "SlurmctldDebug=info"
  echo "SlurmdDebug=info"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "SwitchType=switch/none"
  echo "MpiDefault=none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  # A node's CPUs and memory are those written here even where the hardware reports others.
  echo "SlurmdParameters=config_overrides"
  echo "ReturnToService=2"
  echo "SlurmdTimeout=60"
  echo "InactiveLimit=0"
  echo "KillWait=5"
  echo "Waittime=0"
  echo "MinJobAge=300"
  for ((i = 0; i < nodes; ++i)); do
    echo "NodeName=${names[i]} NodeHostname=${names[i]} NodeAddr=${names[i]} Port=$((base + 1 + i)) CPUs=$cpus RealMemory=$node_mem_mib State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$state/slurm.conf.tmp"
mv "$state/slurm.conf.tmp" "$state/slurm.conf"
export SLURM_CONF=$state/slurm.conf

slurmctld -f "$SLURM_CONF" || { cleanup_on_failure; fail "slurmctld did not start; see $state/slurmctld.log"; }
for name in "${names[@]}"; do
  mkdir -p "$state/slurmd-$name"
  slurmd -f "$SLURM_CONF" -N "$name" ||
    { cleanup_on_failure; fail "slurmd -N $name did not start; see $state/slurmd-$name.log"; }
done

deadline=$((SECONDS + timeout_s))
while :; do
  states=$(sinfo -h -N -o '%N=%T' 2>/dev/null | sort -u | tr '\n' ' ' || true)
  idle=$(grep -o '=idle' <<<"$states" | wc -l || true)
  ((idle == nodes)) && break
  if ((SECONDS >= deadline)); then
    cleanup_on_failure
    fail "the nodes are not all idle after ${timeout_s} s (sinfo: ${states:-no answer}); see $state/slurmctld.log and $state/slurmd-*.log"
  fi
  sleep 1
done
trap - ERR
echo "slurm-up: $nodes node(s) idle (${names[*]}), slurmctld on port $base; export SLURM_CONF=$SLURM_CONF" >&2
