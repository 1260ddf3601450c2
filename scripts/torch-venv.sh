#!/usr/bin/env bash
# Makes (once) and reuses a Python virtual environment holding PyTorch 2.x from PyPI, the CUDA
# build (its LibTorch headers, CMake config, CUDA runtime and NCCL inside; several GB), for
# building the executor against PyTorch 2.x (./setup.sh --torch=PYTHON) and for the tests and
# benchmarks that use PyTorch's own engines as the reference. Prints the environment's python on
# the last line of stdout; everything else goes to stderr.
#
#   scripts/torch-venv.sh            make it when missing or incomplete, else reuse it
#   scripts/torch-venv.sh --check    print its python when it is complete, else exit 1
#   scripts/torch-venv.sh --engines  also install the training engines whose own parsers check
#                                    dplan's exports (tests/engines/requirements*.txt: torchtitan,
#                                    DeepSpeed, Accelerate, Megatron-Core; torchtitan 0.3.0 apart,
#                                    in engines/torchtitan-head inside the environment)
#   scripts/torch-venv.sh --engines --check   print its python when the engines are in, else exit 1
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
engines=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    --engines) engines=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "torch-venv: unknown option '$arg'; valid: --check, --engines, --help" >&2; exit 2 ;;
  esac
done

# The engines (--engines): pinned in tests/engines/, whose checkers read the same files. Their own
# marker, written last, names what was installed; the torch marker above is left as it is.
engine_requirements=tests/engines/requirements.txt
head_requirements=tests/engines/requirements-torchtitan-head.txt
engines_marker=$venv/.dplan-engines-complete
head_dir=$venv/engines/torchtitan-head
pins() { grep -v '^[[:space:]]*\(#\|$\)' "$1" | tr '\n' ' '; }
engines_wanted="$(pins "$engine_requirements")| $(pins "$head_requirements")"
engines_usable() {
  [[ -f $engines_marker && $(cat "$engines_marker") == "$engines_wanted" ]] || return 1
  # The installed versions are the pinned ones (package metadata: no import, a fraction of a second).
  "$venv/bin/python" - "$engine_requirements" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, pinned = line.split("==")
        if version(name) != pinned:
            sys.exit(1)
PY
}
install_engines() {
  if engines_usable; then
    echo "torch-venv: engines already in $venv ($(pins "$engine_requirements"))" >&2
    return 0
  fi
  if ((check_only)); then
    echo "torch-venv: the engines are not in $venv (install them with scripts/torch-venv.sh --engines)" >&2
    exit 1
  fi
  echo "torch-venv: installing $(pins "$engine_requirements")and apart $(pins "$head_requirements")" >&2
  rm -f "$engines_marker"
  # DS_BUILD_OPS=0: DeepSpeed compiles none of its C++/CUDA ops at install (they are built on first
  # use, and the config checks use none).
  # The torch already there stays: an engine asking for another one fails the install instead.
  local torch_version
  torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
  DS_BUILD_OPS=0 "$venv/bin/python" -m pip install --quiet -r "$engine_requirements" "torch==$torch_version" >&2
  rm -rf "$head_dir"
  "$venv/bin/python" -m pip install --quiet --no-deps --target "$head_dir" -r "$head_requirements" >&2
  "$venv/bin/python" -c 'import torchtitan, deepspeed, accelerate, megatron.core' >/dev/null 2>&1 || {
    echo "torch-venv: the engines do not import after installing them; run $venv/bin/python -c 'import torchtitan, deepspeed, accelerate, megatron.core'" >&2
    exit 1
  }
  echo "$engines_wanted" >"$engines_marker"
}

# The environment is usable when its marker names the packages asked for and its torch imports as 2.x.
usable() {
  [[ -f $marker && $(cat "$marker") == "${packages[*]}" ]] || return 1
  "$venv/bin/python" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' \
    2>/dev/null
}

if usable; then
  echo "torch-venv: reusing $venv ($("$venv/bin/python" -c 'import torch; print(torch.__version__)'))" >&2
  if ((engines)); then install_engines; fi
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
if ((engines)); then install_engines; fi
echo "$venv/bin/python"
