#!/usr/bin/env bash
# How long `dplan compare` takes to read a Megatron-LM log whose report_memory lines repeat their
# "[Rank R]" prefix (issue 33: the std::regex reader backtracked over them quadratically in the
# line's length), for logs of growing size: the fixture tests/data/logs/megatron-core_v0.15.0.log
# followed by N MB of lines of 1,800 "[Rank 0] " prefixes each, cut after "allocated:". Prints one
# row per size and binary: seconds (wall) and peak memory. An older binary (OLD) is timed beside
# the new one, each run stopped after LIMIT_S seconds.
#
#   bench/engine_log_bench.sh                          this build's dplan, 1, 4 and 16 MB
#   OLD=/path/to/old/dplan SIZES_MB="0.25 0.5 1" bench/engine_log_bench.sh
#
# Environment: DPLAN (default ./build/dplan), OLD (default: none), SIZES_MB (default "1 4 16"),
# LIMIT_S (default 600), PYTHON (default python3, writes the logs).

set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2
DPLAN=${DPLAN:-./build/dplan}
OLD=${OLD:-}
SIZES_MB=${SIZES_MB:-1 4 16}
LIMIT_S=${LIMIT_S:-600}
PYTHON=${PYTHON:-python3}
[[ -x $DPLAN ]] || { echo "$0: $DPLAN is not built (./setup.sh)" >&2; exit 2; }
[[ -z $OLD || -x $OLD ]] || { echo "$0: OLD=$OLD is not an executable" >&2; exit 2; }
plan=tests/data/logs/plan-tp2-pp2-dp2.json
fixture=tests/data/logs/megatron-core_v0.15.0.log
work=$(mktemp -d) || exit 2
trap 'rm -rf "$work"' EXIT

printf '%-8s %-6s %12s %14s %s\n' "log MB" binary "seconds" "peak RSS MB" "exit"
for mb in $SIZES_MB; do
  log=$work/ranks-$mb.log
  "$PYTHON" - "$fixture" "$log" "$mb" <<'PY' || exit 2
import sys
fixture, out, mb = sys.argv[1], sys.argv[2], float(sys.argv[3])
line = "[Rank 0] " * 1800 + "(after 10 iterations) memory (MB) | allocated: 1.0\n"
with open(fixture) as f, open(out, "w") as o:
    o.write(f.read())
    o.write(line * max(1, int(mb * 1e6 / len(line))))
PY
  for which in new old; do
    bin=$DPLAN
    if [[ $which == old ]]; then [[ -n $OLD ]] || continue; bin=$OLD; fi
    start=$(date +%s.%N)
    /usr/bin/env time -f '%M' -o "$work/rss" timeout "$LIMIT_S" "$bin" compare "$plan" "$log" >/dev/null 2>"$work/err"
    status=$?
    end=$(date +%s.%N)
    rss_kb=$(tail -1 "$work/rss" 2>/dev/null)
    [[ $rss_kb =~ ^[0-9]+$ ]] || rss_kb=0
    note=$status
    [[ $status == 124 ]] && note="124 (stopped after $LIMIT_S s)"
    printf '%-8.2f %-6s %12.2f %14.1f %s\n' "$(echo "scale=2; $(stat -c %s "$log") / 1000000" | bc)" "$which" "$(echo "$end - $start" | bc)" \
      "$(echo "scale=1; $rss_kb / 1024" | bc)" "$note"
  done
done
