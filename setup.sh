#!/usr/bin/env bash
# Installs what dplan needs from Debian's packages (only what is missing), then configures and
# builds it in Release under build/. Idempotent: a second run installs nothing and only rebuilds
# what changed.
#   ./setup.sh            the planner: dplan (plan, estimate, compare, calibrate, probe imports)
#   ./setup.sh --all      everything: also the executor (dplan-worker, for dplan run / probe / scale),
#                         the test suite and the benchmarks, with what the tests launch (torchrun)
#   ./setup.sh --executor dplan, the executor, dplan-gpu-probe and the executor's tests only
#   --slurm               also Debian's Slurm and munge (slurm-wlm, munge), which the scheduler tests
#                         (tests/scheduler) start a private Slurm from; with --all, they run them
#   --torch=CHOICE        which LibTorch the executor builds against (with --all or --executor):
#                         auto (default): the PyTorch 2.x that python3 imports when it has one
#                         (with CUDA and NCCL when that install has them), else Debian's LibTorch
#                         1.13 (CPU); debian: Debian's; PYTHON: the PyTorch 2.x that PYTHON imports
#                         (e.g. the one scripts/torch-venv.sh makes). Also DPLAN_TORCH=CHOICE.
# Environment: BUILD_DIR (default build), JOBS (default: number of cores), DPLAN_TORCH.
set -euo pipefail
cd "$(dirname "$0")"

all=0
executor_only=0
slurm=0
torch=${DPLAN_TORCH:-auto}
for arg in "$@"; do
  case "$arg" in
    --all) all=1 ;;
    --executor) all=1; executor_only=1 ;;
    --slurm) slurm=1 ;;
    --torch=*) torch=${arg#--torch=} ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$arg'; valid: --all, --executor, --slurm, --torch=auto|debian|PYTHON, --help" >&2; exit 2 ;;
  esac
done

# The planner needs only these; the executor LibTorch with c10d and Gloo (and zlib for its
# checkpoints' CRC-32), the tests Catch2, the
# torchrun launch test and the DDP benchmark Debian's PyTorch, and the sanitizer tests and fuzz
# targets (fuzz/sanitize.sh, fuzz/run.sh) clang with its ASan, UBSan and libFuzzer runtimes and
# llvm-symbolizer for their stack traces.
packages=(cmake g++ make pkg-config nlohmann-json3-dev libcli11-dev libboost-graph-dev)
# ccache: the executor's second build (against PyTorch 2.x, BUILD_DIR=build-torch2) compiles the
# cost model, the planner and their tests exactly as the first did, and takes them from the cache.
if ((slurm)); then packages+=(slurm-wlm munge); fi
# libopenblas0-pthread: Debian's LibTorch calls the system libblas.so.3, which on a fresh machine is
# netlib's reference BLAS (13-20x slower GEMMs); OpenBLAS registers itself through the alternatives
# system as libblas.so.3 and liblapack.so.3. The threaded build, which is safe to call from several
# threads at once (the tests run ranks as threads of one process; Debian's serial build is not, and
# gave them wrong sums); dplan-worker keeps it to one thread per rank (openblas_set_num_threads).
if ((all)); then packages+=(catch2 libtorch-dev libgloo-dev zlib1g-dev python3-torch libopenblas0-pthread clang libclang-rt-14-dev llvm-14 ccache); fi
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
# torch_of PYTHON: "VERSION CUDA_VERSION_OR_none TORCH_DIR" of the PyTorch that PYTHON imports,
# when it is 2.x; nothing (and status 1) otherwise (scripts/torch_info.py). Debian's python3-torch
# is 1.13: not taken.
torch_of() {
  "$1" scripts/torch_info.py 2>/dev/null
}

if ((all)); then
  # Which LibTorch: printed, and recorded in the cache so that a build directory switched from
  # one to the other is configured afresh (every LibTorch path in the cache would be stale).
  torch_args=(-DCMAKE_PREFIX_PATH= -DDPLAN_TORCH_PYTHON=)
  choice=debian
  reason="(--torch=debian)"
  case "$torch" in
    debian) ;;
    auto)
      if found=$(torch_of python3); then
        choice=python3
      else
        reason="(python3 has no PyTorch 2.x; --torch=PYTHON picks one, scripts/torch-venv.sh makes one)"
      fi ;;
    *)
      if ! command -v "$torch" >/dev/null || ! found=$(torch_of "$torch"); then
        echo "setup: --torch=$torch: not a python that imports PyTorch 2.x; valid: auto, debian, or such a python" >&2
        exit 2
      fi
      choice=$torch ;;
  esac
  if [[ $choice == debian ]]; then
    echo "setup: executor against Debian's LibTorch 1.13, CPU only $reason" >&2
  else
    read -r version cuda torch_dir <<<"$found"
    python_path=$(command -v "$choice")
    if [[ $cuda == none ]]; then with="CPU only"; else with="CUDA $cuda and NCCL"; fi
    echo "setup: executor against PyTorch $version from $python_path ($torch_dir), $with" >&2
    torch_args=(-DCMAKE_PREFIX_PATH="$torch_dir" -DDPLAN_TORCH_PYTHON="$python_path")
    choice="$python_path $version"
  fi
  # Which BLAS Debian's LibTorch (and python3-torch) will call: said, and warned of when it is the
  # reference BLAS (an administrator's manual choice, which this leaves alone).
  blas=$(readlink -f "/usr/lib/$(gcc -print-multiarch)/libblas.so.3" 2>/dev/null || true)
  case "$blas" in
    *openblas*|*blis*|*mkl*) echo "setup: BLAS for Debian's LibTorch: $blas" >&2 ;;
    *) echo "setup: warning: libblas.so.3 is $blas, the reference BLAS (GEMMs 13-20x slower): pick OpenBLAS with" \
            "update-alternatives --config libblas.so.3-$(gcc -print-multiarch)" >&2 ;;
  esac
  fresh=()
  if [[ -f $build_dir/CMakeCache.txt ]] &&
     ! grep -qxF "DPLAN_TORCH_CHOICE:INTERNAL=$choice" "$build_dir/CMakeCache.txt"; then
    fresh=(--fresh)
  fi
  # Configured again each time (seconds): a build first set up for the planner alone finds the
  # executor and the tests now. cmake's own output goes to a log; its dplan lines are shown.
  mkdir -p "$build_dir"
  log=$build_dir/configure.log
  # Paths relative to the clone in ccache's keys, so that one build directory hits another's objects.
  export CCACHE_BASEDIR=$PWD
  if ! cmake "${fresh[@]}" -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDPLAN_BUILD_TESTS=ON \
       -DDPLAN_EXECUTOR=ON "${torch_args[@]}" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DDPLAN_TORCH_CHOICE:INTERNAL="$choice" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    exit 1
  fi
  grep '^-- dplan: ' "$log" | sed 's/^-- /setup: /' >&2
  if ! grep -q '^DPLAN_HAVE_EXECUTOR:INTERNAL=ON' "$build_dir/CMakeCache.txt"; then
    echo "setup: LibTorch was not found, so the executor (dplan-worker) cannot be built; see $log" >&2
    exit 1
  fi
  targets=()
  if ((executor_only)); then
    targets=(--target dplan dplan-worker executor_tests executor_unit_tests)
    if grep -q '^DPLAN_HAVE_GPU_PROBE:INTERNAL=ON' "$build_dir/CMakeCache.txt"; then targets+=(dplan-gpu-probe); fi
  fi
  cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
else

  if [[ ! -f $build_dir/CMakeCache.txt ]]; then
    cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDPLAN_BUILD_TESTS=OFF >/dev/null
  fi
  cmake --build "$build_dir" -j "$jobs" --target dplan
fi
