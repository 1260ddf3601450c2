#!/usr/bin/env bash
# Makes (once) and reuses a Python virtual environment holding PyTorch 2.x from PyPI, the CUDA
# build (its LibTorch headers, CMake config, CUDA runtime and NCCL inside; several GB), for
# building the executor against PyTorch 2.x (./setup.sh --torch=PYTHON) and for the tests and
# benchmarks that use PyTorch's own engines as the reference. Prints the environment's python on
# the last line of stdout; everything else goes to stderr.
#
#   scripts/torch-venv.sh            make it when missing or incomplete, else reuse it
#   scripts/torch-venv.sh --check    print its python when it is complete, else exit 1
#
# Environment: DPLAN_TORCH_VENV, where it lives (default $XDG_CACHE_HOME/dplan/torch-venv, else
# ~/.cache/dplan/torch-venv: outside the clone, so a fresh clone reuses it); PYTHON, the python
# that makes it (default python3); DPLAN_TORCH_SPEC, what pip installs (default below).
set -euo pipefail
cd "$(dirname "$0")/.."

# The version the executor's 2.x build and its reference tests are checked with (docs/executor.md).
# Any 2.x from 2.4 on builds (c10d's Backend API and fully_shard are there from then); a newer one
# is a DPLAN_TORCH_SPEC away.
spec=${DPLAN_TORCH_SPEC:-torch==2.15.*}
# numpy: torch warns on import without it, and the reference scripts read arrays with it.
packages=("$spec" numpy)
venv=${DPLAN_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dplan/torch-venv}
python=${PYTHON:-python3}
# Written last, so that an install cut short is made again rather than reused.
marker=$venv/.dplan-torch-complete

check_only=0
case "${1:-}" in
  "") ;;
  --check) check_only=1 ;;
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "torch-venv: unknown option '$1'; valid: --check, --help" >&2; exit 2 ;;
esac

# The environment is usable when its marker names the packages asked for and its torch imports as 2.x.
usable() {
  [[ -f $marker && $(cat "$marker") == "${packages[*]}" ]] || return 1
  "$venv/bin/python" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' \
    2>/dev/null
}

if usable; then
  echo "torch-venv: reusing $venv ($("$venv/bin/python" -c 'import torch; print(torch.__version__)'))" >&2
  echo "$venv/bin/python"
  exit 0
fi
if ((check_only)); then
  echo "torch-venv: no complete environment at $venv (make it with scripts/torch-venv.sh)" >&2
  exit 1
fi

# Debian's python3 makes virtual environments only with python3-venv installed.
if ! "$python" -m venv --help >/dev/null 2>&1; then
  echo "torch-venv: installing python3-venv" >&2
  if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi

echo "torch-venv: making $venv with ${packages[*]} from PyPI (several GB the first time)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet "${packages[@]}" >&2
"$venv/bin/python" -c 'import torch; print("torch-venv: torch", torch.__version__, "CUDA", torch.version.cuda)' >&2
echo "${packages[*]}" >"$marker"
echo "$venv/bin/python"
