// Fuzz target: a checkpoint folder's files as `dplan run --resume` reads them (executor/src/
// checkpoint_format.h, safetensors_header.h; no LibTorch): the input is manifest.json's text, a NUL
// byte, then rank 0's shard. The manifest is read strictly (manifest_from_text) and must write and
// read back the same; the shard's safetensors header is read (parse_safetensors_header, whose
// std::invalid_argument the executor turns into its one error line) and checked against the
// manifest's rank-0 entry (check_shard) as the executor does before any tensor is made.
#include <stdexcept>

#include "checkpoint_format.h"
#include "dplan/costmodel/errors.h"
#include "safetensors_header.h"
#include "support.h"

using namespace dplan;
using namespace dplan::executor;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_one([&] {
    const std::string input = fuzz::text_of(data, size);
    const size_t cut = input.find('\0');
    const CheckpointManifest manifest = manifest_from_text(input.substr(0, cut), "manifest.json");
    fuzz::expect_reads_back("checkpoint manifest to_json", [&] {
      if (!(manifest_from_json(to_json(manifest), "manifest.json") == manifest))
        fuzz::finding("manifest_from_json(to_json(manifest)) differs from the manifest");
    });
    if (cut == std::string::npos || manifest.shards.empty()) return;
    SafetensorsHeader header;
    try {
      header = parse_safetensors_header(std::string_view(input).substr(cut + 1));
    } catch (const std::invalid_argument& e) {
      throw dplan::InputError(std::string("shard: ") + e.what());
    }
    const ShardMetadata meta = check_shard(header, manifest, manifest.shards.front(), "ck/step-00000001");
    fuzz::expect_reads_back("shard metadata to_json", [&] {
      if (!(shard_metadata_from_json(to_json(meta), "shard") == meta))
        fuzz::finding("shard_metadata_from_json(to_json(metadata)) differs from the metadata");
    });
  });
  return 0;
}
