#!/usr/bin/env bash
# Installs what dplan needs from Debian's packages (only what is missing), then configures and
# builds it in Release under build/. Idempotent: a second run installs nothing and only rebuilds
# what changed.
#   ./setup.sh          the planner: dplan (plan, estimate, compare, calibrate, probe imports)
#   ./setup.sh --all    everything: also the executor (dplan-worker, for dplan run / probe / scale),
#                       the test suite and the benchmarks, with what the tests launch (torchrun)
# Environment: BUILD_DIR (default build), JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")"

all=0
case "${1:-}" in
  "") ;;
  --all) all=1 ;;
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup: unknown option '$1'; valid: --all, --help" >&2; exit 2 ;;
esac

# The planner needs only these; the executor LibTorch with c10d and Gloo, the tests Catch2, the
# torchrun launch test and the DDP benchmark Debian's PyTorch, and the sanitizer tests and fuzz
# targets (fuzz/sanitize.sh, fuzz/run.sh) clang with its ASan, UBSan and libFuzzer runtimes and
# llvm-symbolizer for their stack traces.
packages=(cmake g++ make pkg-config nlohmann-json3-dev libcli11-dev libboost-graph-dev)
if ((all)); then packages+=(catch2 libtorch-dev libgloo-dev python3-torch clang libclang-rt-14-dev llvm-14); fi
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
if ((all)); then
  # Configured again each time (seconds): a build first set up for the planner alone finds the
  # executor and the tests now.
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDPLAN_BUILD_TESTS=ON -DDPLAN_EXECUTOR=ON >/dev/null
  if ! grep -q '^DPLAN_HAVE_EXECUTOR:INTERNAL=ON' "$build_dir/CMakeCache.txt"; then
    echo "setup: LibTorch was not found, so the executor (dplan-worker) cannot be built; see cmake's output" >&2
    exit 1
  fi
  cmake --build "$build_dir" -j "$jobs"
else
  if [[ ! -f $build_dir/CMakeCache.txt ]]; then
    cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDPLAN_BUILD_TESTS=OFF >/dev/null
  fi
  cmake --build "$build_dir" -j "$jobs" --target dplan
fi
