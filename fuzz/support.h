// What every fuzz target shares (docs/fuzzing.md): the verdict on one input and the fixed inputs
// it is combined with. A reader may refuse an input only with dplan::InputError; anything else that
// leaves it (another exception, a crash, a sanitizer report, a hang, unbounded memory) is a finding.
// Where an input reads, the target goes on as dplan would with it (an estimate with a profile, a
// fit with a probe, a comparison with a plan), so that values which read fine but break the model
// are found too; and a value a reader returned must be one dplan's writer writes and its reader
// reads back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "dplan/costmodel/hardware.h"
#include "dplan/costmodel/model.h"
#include "dplan/costmodel/plan_file.h"
#include "dplan/costmodel/run_record.h"

namespace dplan::fuzz {

// Runs `body`: returns normally when it ends or throws InputError; any other exception is a
// finding: printed ("finding: uncaught <type>: <what>") and the process aborts, which libFuzzer
// reports as a crash and keeps the input.
void run_one(const std::function<void()>& body);

// A finding that is not an exception (a result that is not finite, a written file its reader
// refuses): printed as "finding: <what>", then abort().
[[noreturn]] void finding(const std::string& what);

// The fuzzer's bytes as text and, for the JSON readers, parsed by dplan::parse_json_text (which
// refuses malformed JSON with InputError).
std::string text_of(const uint8_t* data, size_t size);
json json_of(const uint8_t* data, size_t size);

// Fixed inputs, read once from the source tree's profiles/ and tests/data/ (DPLAN_SOURCE_DIR).
const costmodel::ModelSpec& small_model();            // profiles/models/gpt-small.json
const costmodel::ClusterSpec& fixed_cluster(const std::string& name);  // profiles/clusters/<name>.json
// The JSON of profiles/clusters/<name>.json and of its GPU's file, as `dplan probe` edits them.
const json& fixed_cluster_file(const std::string& name);
const json& fixed_gpu_file_of_cluster(const std::string& name);
// The GPU a fuzzed cluster names: the profile of that name under profiles/gpus/ (a path's file
// name without .json), else h100-sxm5-80gb, so that a mutated name still gets a GPU.
costmodel::GpuSpec gpu_named(const std::string& name);
// The stored plans and runs (tests/data/compare/, tests/data/accuracy/): the first whose layout
// (tp, pp, dp, cp) is the given one's, else tests/data/compare's, so that `dplan compare` gets
// past its layout check for most fuzzed plans and runs.
const costmodel::Plan& plan_like(const costmodel::RunRecord& run);
const costmodel::RunRecord& run_like(const costmodel::Plan& plan);

// Estimates memory and step time of a few layouts of `model` on `cluster` as `dplan estimate`
// does (validate, estimate_memory, Network, estimate_time): one node and two, pipeline schedules
// 1F1B and interleaved, ZeRO 1 and 3. A layout validate() refuses is skipped; an estimate that is
// not finite is a finding.
void estimate_layouts(const costmodel::ModelSpec& model, const costmodel::ClusterSpec& cluster);

// `cluster` with `gpu` in it (a fuzzed GPU on a fixed machine).
costmodel::ClusterSpec with_gpu(costmodel::ClusterSpec cluster, const costmodel::GpuSpec& gpu);

// A finding unless every figure of the GPU / cluster is finite (a reader that multiplies a
// finite value into infinity).
void check_finite(const costmodel::GpuSpec& gpu, const std::string& what);
void check_finite(const costmodel::ClusterSpec& cluster, const std::string& what);

// Runs `read_back` on what a writer wrote: an InputError there is a finding (dplan would write a
// file it then refuses).
void expect_reads_back(const std::string& what, const std::function<void()>& read_back);

}  // namespace dplan::fuzz
