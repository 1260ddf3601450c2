#!/usr/bin/env bash
# Runs the cost model's and the planner's tests under AddressSanitizer and UndefinedBehaviorSanitizer
# (docs/fuzzing.md): configures the clang build folder build-sanitize/ with DPLAN_SANITIZE=ON (no
# executor: LibTorch is not built with sanitizers), builds costmodel_tests, planner_tests and the
# dplan binary their CLI tests run, all sanitized, and runs them with ctest. Every sanitizer report,
# in a test binary or in a dplan it started, is written to BUILD_DIR/sanitizer-logs/ and printed at
# the end. Exits 1 if a test failed or any report was written.
#   fuzz/sanitize.sh                    every test
#   fuzz/sanitize.sh -R compare         ctest's arguments after the script's own
# Environment: BUILD_DIR (default build-sanitize), JOBS (default: number of cores), CXX (default
# clang++).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
build=${BUILD_DIR:-build-sanitize}
jobs=${JOBS:-$(nproc)}
cxx=${CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "sanitize: $cxx not found; ./setup.sh --all installs clang" >&2; exit 1; }
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

echo "sanitize: building costmodel_tests, planner_tests and dplan in $build/ ($cxx, ASan + UBSan)"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DDPLAN_SANITIZE=ON \
  -DDPLAN_BUILD_TESTS=ON >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" --target costmodel_tests planner_tests dplan >"$build/build.log" 2>&1 ||
  { tail -50 "$build/build.log" >&2; exit 1; }

# Reports go to files (log_path: one per process), so that those of the dplan processes the CLI tests
# start are seen too; a UBSan report aborts like an ASan one.
logs=$(realpath "$build")/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
symbolizer=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1${symbolizer:+:external_symbolizer_path=$symbolizer}"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1${symbolizer:+:external_symbolizer_path=$symbolizer}"

status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@" || status=1

reports=$(find "$logs" -type f | sort)
if [[ -n $reports ]]; then
  status=1
  echo
  echo "sanitize: $(grep -c . <<<"$reports") sanitizer report(s) in $logs/:"
  while read -r f; do
    echo "--- ${f##*/}"
    head -40 "$f"
  done <<<"$reports"
else
  echo "sanitize: no sanitizer reports"
fi
exit "$status"
