#!/usr/bin/env bash
# Fuzzes every reader of dplan with libFuzzer under ASan and UBSan (docs/fuzzing.md): configures and
# builds the clang build folder build-fuzz/, makes the seed corpus with the dplan it built
# (fuzz/make_corpus.sh), replays the kept reproducers of fuzz/regressions/, runs each target for N
# seconds and prints what each did. Exits 1 if a reproducer still fails or a target found something.
#   fuzz/run.sh                         every target, 60 seconds each
#   fuzz/run.sh --seconds-per-target N  N seconds each (CI: 12)
#   fuzz/run.sh --targets plan,gpu_probe --seconds-per-target 600
#   fuzz/run.sh --measure               seeds from this machine too (dplan probe, dplan run with
#                                       the executor of build/: ./setup.sh --all first)
#   fuzz/run.sh --replay-only           build, then replay fuzz/regressions/ alone
# Environment: BUILD_DIR (default build-fuzz), JOBS (default: number of cores), CXX (default
# clang++). Findings land in BUILD_DIR/fuzz-findings/<target>/ (crash-*, timeout-*, oom-*, leak-*);
# what the targets learned stays in BUILD_DIR/fuzz-work/<target>/ for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
all_targets=(model_config gpu_profile cluster_profile plan run_record nccl_tests nccl_import gpu_probe engine_log checkpoint)
seconds=60
targets=("${all_targets[@]}")
measure=0
replay_only=0
while (($#)); do
  case "$1" in
    --seconds-per-target)
      [[ ${2:-} =~ ^[0-9]+$ && $2 -gt 0 ]] || { echo "fuzz: --seconds-per-target takes a positive number of seconds" >&2; exit 2; }
      seconds=$2; shift 2 ;;
    --targets)
      IFS=, read -r -a targets <<<"${2:-}"; shift 2
      for t in "${targets[@]}"; do
        [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t'; valid: ${all_targets[*]}" >&2; exit 2; }
      done ;;
    --measure) measure=1; shift ;;
    --replay-only) replay_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fuzz: unknown option '$1'; valid: --seconds-per-target N, --targets A,B, --measure, --replay-only, --help" >&2; exit 2 ;;
  esac
done

build=${BUILD_DIR:-build-fuzz}
jobs=${JOBS:-$(nproc)}
cxx=${CXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found; ./setup.sh --all installs clang" >&2; exit 1; }
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# Each target's longest input: its largest seed with room to grow (plans and probes hold tables).
max_len() {
  case "$1" in
    model_config) echo 4096 ;;
    cluster_profile|run_record) echo 16384 ;;
    nccl_tests|nccl_import) echo 16384 ;;
    engine_log) echo 32768 ;;
    checkpoint) echo 131072 ;;  # a manifest and a small shard (tests/data/checkpoint/)
    *) echo 65536 ;;
  esac
}
seeds_of() { if [[ $1 == nccl_import ]]; then echo "$build/fuzz-corpus/nccl_tests"; else echo "$build/fuzz-corpus/$1"; fi; }
dict_of() {
  case "$1" in
    nccl_*) echo "$src/fuzz/nccl_tests.dict" ;;
    engine_log) echo "$src/fuzz/engine_log.dict" ;;
    *) echo "$build/fuzz-corpus/json.dict" ;;
  esac
}

# Symbolized stack traces; a UBSan report aborts (the build has -fno-sanitize-recover=undefined).
symbolizer=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)
export ASAN_OPTIONS=${ASAN_OPTIONS:-symbolize=1${symbolizer:+:external_symbolizer_path=$symbolizer}}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1${symbolizer:+:external_symbolizer_path=$symbolizer}}

echo "fuzz: building the targets in $build/ ($cxx, ASan + UBSan + libFuzzer)"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DDPLAN_FUZZ=ON \
  -DDPLAN_BUILD_TESTS=OFF >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" --target fuzz_targets dplan >"$build/build.log" 2>&1 || { tail -50 "$build/build.log" >&2; exit 1; }

# The lines of a target's output that say what it found.
what_it_found() {
  grep -aE '^finding: |runtime error: |ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|^SUMMARY: |^==[0-9]+== ?ERROR' "$1" |
    head -3 || true
}

failed=0
echo
echo "fuzz: replaying fuzz/regressions/"
replayed=0
for t in "${targets[@]}"; do
  for f in "$src"/fuzz/regressions/"$t"/*; do
    [[ -f $f ]] || continue
    replayed=$((replayed + 1))
    log=$build/replay.log
    if ! timeout 120 "$build/fuzz/${t}_fuzz" -timeout=5 -rss_limit_mb=2048 "$f" >"$log" 2>&1; then
      failed=1
      echo "  FAIL $t ${f#"$src"/}"
      what_it_found "$log" | sed 's/^/       /'
    fi
  done
done
echo "  $replayed reproducers replayed"
((replay_only)) && exit "$failed"

echo
if ((measure)); then
  echo "fuzz: making the seed corpus with build/dplan and its executor (--measure)"
  fuzz/make_corpus.sh build/dplan "$build/fuzz-corpus" --measure | sed 's/^/  /'
else
  echo "fuzz: making the seed corpus with $build/dplan"
  fuzz/make_corpus.sh "$build/dplan" "$build/fuzz-corpus" | sed 's/^/  /'
fi

echo
echo "fuzz: ${#targets[@]} targets, $seconds s each"
stamp=$build/fuzz-run.stamp
touch "$stamp"
rows=()
for t in "${targets[@]}"; do
  work=$build/fuzz-work/$t
  findings=$build/fuzz-findings/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$work" "$findings" "$(dirname "$log")"
  # -fork=1 with -ignore_*: a finding is kept and the run goes on for its whole time.
  timeout $((seconds + 120)) "$build/fuzz/${t}_fuzz" "$work" "$(seeds_of "$t")" \
    -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -max_len="$(max_len "$t")" -dict="$(dict_of "$t")" \
    -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -print_funcs=0 \
    -artifact_prefix="$findings/" >"$log" 2>&1 || true
  # The last status line of fork mode: "#N: cov: C ft: F corp: K exec/s E oom/timeout/crash: o/t/c time: Ss ..."
  status=$(grep -aE '^#[0-9]+: cov: ' "$log" | tail -1 || true)
  execs=$(sed -nE 's/^#([0-9]+): .*/\1/p' <<<"$status")
  cov=$(sed -nE 's/.* cov: ([0-9]+) .*/\1/p' <<<"$status")
  ft=$(sed -nE 's/.* ft: ([0-9]+) .*/\1/p' <<<"$status")
  corp=$(sed -nE 's/.* corp: ([0-9]+) .*/\1/p' <<<"$status")
  took=$(sed -nE 's/.* time: ([0-9]+)s.*/\1/p' <<<"$status")
  rate=$([[ -n $execs && ${took:-0} -gt 0 ]] && echo $((execs / took)) || true)  # over the run, not the last job
  new=$(find "$findings" -maxdepth 1 -type f -newer "$stamp" \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | sort)
  count=$(grep -c . <<<"$new" || true)
  rows+=("$(printf '%-16s %8s %10s %8s %7s %7s %7s %9s' "$t" "${took:-?}" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$count")")
  if [[ -z $status ]]; then
    failed=1
    echo "  $t: did not fuzz (log: $log):"
    tail -5 "$log" | sed 's/^/    /'
  fi
  if ((count)); then
    failed=1
    echo "  $t: $count new finding(s) in $findings/ (log: $log)"
    while read -r f; do
      timeout 120 "$build/fuzz/${t}_fuzz" -timeout=5 -rss_limit_mb=2048 "$f" >"$build/replay.log" 2>&1 || true
      echo "    ${f##*/}"
      what_it_found "$build/replay.log" | sed 's/^/      /'
    done <<<"$new"
  fi
done

echo
printf '%-16s %8s %10s %8s %7s %7s %7s %9s\n' target "time (s)" executions "exec/s" cov ft corpus findings
printf '%s\n' "${rows[@]}"
echo "(cov: code edges reached; ft: features, libFuzzer's finer coverage; corpus: inputs kept in $build/fuzz-work/)"
if ((failed)); then
  echo "fuzz: FAILED: a reproducer of fuzz/regressions/ still fails or a target found something (above);" \
       "keep a new finding's input as fuzz/regressions/<target>/<name> (docs/fuzzing.md)"
fi
exit "$failed"
