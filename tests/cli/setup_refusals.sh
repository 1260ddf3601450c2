#!/usr/bin/env bash
# setup.sh refuses bad options with one line naming the problem and the valid choices, exit 2,
# and configures nothing (the build directory it is given is never made).
#   setup_refusals.sh SETUP_SH BUILD_DIR
set -u
setup=$1
build_dir=$2
rm -rf "$build_dir"
failures=0
expect() {  # expect MESSAGE ARGS...: setup.sh ARGS prints exactly MESSAGE and exits 2
  local message=$1
  shift
  local out rc
  out=$(BUILD_DIR="$build_dir" "$setup" "$@" 2>&1)
  rc=$?
  if [[ $rc != 2 || $out != "$message" ]]; then
    echo "setup.sh $*: exit $rc, printed:"
    echo "$out"
    echo "expected exit 2 and: $message"
    failures=$((failures + 1))
  fi
}
expect "setup: unknown option '--bogus'; valid: --all, --executor, --slurm, --torch=auto|debian|PYTHON, --help" --bogus
# `false` is a command, but not a python: the same as a python without PyTorch 2.x.
expect "setup: --torch=false: not a python that imports PyTorch 2.x; valid: auto, debian, or such a python" \
  --all --torch=false
expect "setup: --torch=/no/such/python: not a python that imports PyTorch 2.x; valid: auto, debian, or such a python" \
  --executor --torch=/no/such/python
if [[ -e $build_dir ]]; then
  echo "setup.sh made $build_dir although it refused its options"
  failures=$((failures + 1))
fi
exit $((failures > 0))
