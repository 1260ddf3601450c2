#!/usr/bin/env bash
# Makes the fuzz targets' seed corpus (docs/fuzzing.md): the repository's own inputs (profiles/,
# the plans, runs, probes and nccl-tests output under tests/data/) and files the dplan binary
# writes now (plans from the search and from `dplan estimate -o`, cluster and GPU profiles from
# `dplan probe --import-*` and `dplan calibrate -o`); a JSON dictionary of every key the corpus
# holds. Nothing here is kept in the repository: it is remade in the build folder each time.
#   fuzz/make_corpus.sh DPLAN OUT             DPLAN: the dplan binary; OUT: folder to (re)make
#   fuzz/make_corpus.sh DPLAN OUT --measure   also measure this machine with the executor beside
#                                             DPLAN (dplan-worker; ./setup.sh --all builds it):
#                                             dplan probe (a probe JSON, nccl-tests text) and
#                                             dplan run (run.json); about a minute more
# OUT gets one folder per fuzz target (model_config, gpu_profile, cluster_profile, plan,
# run_record, nccl_tests, gpu_probe, engine_log) and json.dict.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)

usage() { sed -n '6,13p' "$0" | sed 's/^# \{0,1\}//'; }
(($# >= 2)) || { usage >&2; exit 2; }
dplan=$(realpath "$1")
out=$2
measure=0
case "${3:-}" in
  "") ;;
  --measure) measure=1 ;;
  *) echo "make_corpus: unknown option '$3'; valid: --measure" >&2; exit 2 ;;
esac
[[ -x $dplan ]] || { echo "make_corpus: $1 is not an executable dplan binary" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out"/{model_config,gpu_profile,cluster_profile,plan,run_record,nccl_tests,gpu_probe,engine_log,checkpoint}
out=$(realpath "$out")
made=$out/made   # what dplan writes, before it is copied into the targets' folders
mkdir -p "$made"
export DPLAN_PROFILES=$src/profiles

# copy TARGET FILE...: each file under a name that says where it came from (a/b/c.json -> a-b-c.json).
copy() {
  local target=$1; shift
  for f in "$@"; do
    local rel=${f#"$src"/}
    cp "$f" "$out/$target/${rel//\//-}"
  done
}
# run_dplan ARGS...: a command whose output files are seeds; its own output is not wanted.
run_dplan() {
  if ! "$dplan" "$@" >"$made/last.log" 2>&1; then
    echo "make_corpus: dplan $* failed:" >&2
    cat "$made/last.log" >&2
    exit 1
  fi
}

# The repository's inputs.
copy model_config "$src"/profiles/models/*.json "$src"/tests/data/executor/*/config.json "$src"/examples/*/config.json
copy gpu_profile "$src"/profiles/gpus/*.json "$src"/tests/data/accuracy/*-gpu.json
copy cluster_profile "$src"/profiles/clusters/*.json "$src"/tests/data/accuracy/machine.json
copy plan "$src"/tests/data/compare/plan.json "$src"/tests/data/compare/plan-offload.json "$src"/tests/data/accuracy/plan-*.json
copy run_record "$src"/tests/data/compare/run.json "$src"/tests/data/compare/run-offload.json "$src"/tests/data/accuracy/run-*.json
copy nccl_tests "$src"/tests/data/nccl-tests/*
copy engine_log "$src"/tests/data/logs/*.log
# A checkpoint folder's manifest, a NUL byte, then its rank-0 shard (checkpoint_fuzz.cpp); a
# manifest alone too.
for ck in "$src"/tests/data/checkpoint/*/; do
  name=$(basename "$ck")
  { cat "$ck/manifest.json"; printf '\0'; cat "$ck/rank-00000.safetensors"; } >"$out/checkpoint/$name-folder"
  cp "$ck/manifest.json" "$out/checkpoint/$name-manifest.json"
done
copy gpu_probe "$src"/tests/data/accuracy/*-probe.json

# Plans the tool writes: the search's winner and layouts of every kind `dplan estimate` takes.
run_dplan --model gpt-tiny --cluster local-cpu --gpus 4 --global-batch 8 --precision fp32 -o "$made/plan-search-gpt-tiny.json"
run_dplan --model 8B --gpus 16 -o "$made/plan-search-llama-3-8b.json"
run_dplan estimate --model gpt-small --cluster local-cpu --gpus 4 --pp 2 --dp 2 --mbs 1 --global-batch 8 \
  --precision fp32 -o "$made/plan-gpt-small-pp2-dp2.json"
run_dplan estimate --model llama-3-70b --gpus 64 --tp 8 --pp 4 --dp 2 --mbs 1 --global-batch 512 --sp \
  --recompute selective -o "$made/plan-llama-3-70b-tp8-pp4-sp.json"
run_dplan estimate --model llama-3-8b --gpus 16 --tp 2 --pp 4 --vpp 2 --dp 2 --global-batch 64 \
  --recompute full -o "$made/plan-llama-3-8b-interleaved.json"
run_dplan estimate --model mixtral-8x7b --gpus 32 --tp 2 --pp 2 --dp 8 --ep 4 --zero 1 --global-batch 64 \
  --precision fp8 -o "$made/plan-mixtral-ep4-fp8.json"
run_dplan estimate --model llama-2-7b --cluster dgx-a100-80g --gpus 16 --cp 2 --dp 8 --zero 3 --offload \
  --global-batch 64 --schedule gpipe -o "$made/plan-llama-2-7b-cp2-zero3-offload.json"
run_dplan estimate --model gpt-tiny --cluster local-cpu --gpus 2 --dp 2 --zero 1 --offload --global-batch 8 \
  --precision fp32 -o "$made/plan-gpt-tiny-dp2-offload.json"
run_dplan estimate --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --tp 8 --pp 8 --mbs 1 --dist-opt \
  --global-batch 64 --precision fp16 --attention standard -o "$made/plan-gpt3-175b-dist-opt.json"
# Cluster and GPU profiles the tool writes: an nccl-tests import, a calibration to the recorded runs.
run_dplan probe --import-nccl-tests "$src/tests/data/nccl-tests/a100-8x-all_reduce.txt" --cluster dgx-a100-80g \
  -o "$made/cluster-nccl-import.json"
(cd "$src/tests/data/accuracy" &&
  run_dplan calibrate run-single-1.json run-dp2-1.json run-tp2-1.json run-pp2-1.json run-dp2-zero3-1.json \
    --profile machine.json -o "$made/cluster-calibrated.json")

if ((measure)); then
  worker=$(dirname "$dplan")/dplan-worker
  [[ -x $worker ]] || { echo "make_corpus: --measure needs $worker (./setup.sh --all)" >&2; exit 2; }
  # This machine measured by the executor: the probe JSON, its nccl-tests text and the profiles
  # made from them; then a short run of one of the plans above.
  run_dplan probe --cluster local-cpu --ranks 2 -o "$made/cluster-measured.json"
  run_dplan run "$made/plan-gpt-small-pp2-dp2.json" --steps 3 -o "$made/run-gpt-small-pp2-dp2.json"
  # Offload: run.json's host_* memory components.
  run_dplan run "$made/plan-gpt-tiny-dp2-offload.json" --steps 3 -o "$made/run-gpt-tiny-dp2-offload.json"
fi

shopt -s nullglob
for f in "$made"/plan-*.json; do cp "$f" "$out/plan/made-${f##*/}"; done
for f in "$made"/run-*.json; do cp "$f" "$out/run_record/made-${f##*/}"; done
for f in "$made"/*-probe.json; do cp "$f" "$out/gpu_probe/made-${f##*/}"; done
for f in "$made"/*_perf.txt; do cp "$f" "$out/nccl_tests/made-${f##*/}"; done
for f in "$made"/cluster-*.json; do
  [[ $f == *-probe.json ]] && continue
  if [[ $f == *-gpu.json ]]; then cp "$f" "$out/gpu_profile/made-${f##*/}"; else cp "$f" "$out/cluster_profile/made-${f##*/}"; fi
done

# The JSON targets' dictionary: fuzz/json.dict (JSON's tokens, numbers at the readers' edges) and
# every key the JSON seeds hold; the nccl-tests target uses fuzz/nccl_tests.dict as it is.
{
  cat "$src/fuzz/json.dict"
  echo "# the keys of the seeds"
  cat "$out"/{model_config,gpu_profile,cluster_profile,plan,run_record,gpu_probe}/* |
    grep -o '"[A-Za-z0-9_.-]*" *:' | sed -E 's/^"([^"]*)".*/"\\"\1\\""/' | sort -u
} >"$out/json.dict"

rm -rf "$made"
for t in model_config gpu_profile cluster_profile plan run_record nccl_tests gpu_probe engine_log; do
  printf '%-16s %3d seeds\n' "$t" "$(ls "$out/$t" | wc -l)"
done
