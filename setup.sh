#!/usr/bin/env bash
# Installs what dplan needs from Debian's packages (only what is missing), then configures and
# builds it in Release under build/. Idempotent: a second run only rebuilds what changed.
#   ./setup.sh            install + build
# Environment: BUILD_DIR (default build), JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")"

# The planner needs the first line; the executor (dplan run) LibTorch with c10d and Gloo; the
# torchrun launch test and the DDP benchmark Debian's PyTorch.
packages=(cmake g++ make pkg-config nlohmann-json3-dev libcli11-dev catch2 libboost-graph-dev
          libtorch-dev libgloo-dev python3-torch)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
if [[ ! -f $build_dir/CMakeCache.txt ]]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build_dir" -j "$jobs"
