// SPDX-License-Identifier: Apache-2.0
// safetensors header + tensor table (convert's input): the file is opened as `protokv convert`
// opens each shard, and every tensor's bytes are read, so a range the header got wrong shows.
#include <nlohmann/json.hpp>

#include "fuzz_target.h"
#include "io/safetensors.h"

namespace protokv::fuzz {
namespace {

Outcome run(Bytes data) {
  const MemoryFile file(data);
  return accept_or_refuse([&] {
    const SafetensorsFile st = SafetensorsFile::open(file.path());
    unsigned checksum = 0;
    for (const SafetensorsTensor& t : st.tensors()) {
      if (st.find(t.name) != &t) finding("find() does not return the listed tensor");
      const auto* bytes = static_cast<const uint8_t*>(t.data);
      for (size_t i = 0; i < t.nbytes; ++i) checksum += bytes[i];
      (void)t.element_count();
    }
    // Used, so the reads are not optimised away.
    if (checksum == 0xdeadbeef) (void)st.path();
  });
}

// A file from a header and data: 8-byte little-endian header length, the JSON, the data.
std::string safetensors_bytes(const nlohmann::json& header, const std::string& payload) {
  const std::string text = header.dump();
  std::string out;
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + text + payload;
}

void write_seeds(const std::filesystem::path& dir, const std::filesystem::path&) {
  using nlohmann::json;
  // Layouts a Llama checkpoint has: F32 norms, F16 / BF16 matrices, metadata, padding.
  json header = {
      {"__metadata__", {{"format", "pt"}}},
      {"model.norm.weight", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
      {"model.layers.0.self_attn.q_proj.weight",
       {{"dtype", "F16"}, {"shape", {4, 4}}, {"data_offsets", {16, 48}}}},
      {"lm_head.weight", {{"dtype", "BF16"}, {"shape", {2, 4}}, {"data_offsets", {48, 64}}}}};
  std::string payload(64, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  write_seed(dir, "three-dtypes", safetensors_bytes(header, payload));
  write_seed(dir, "empty", safetensors_bytes(json::object(), ""));
  json scalar = {{"scalar", {{"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {0, 4}}}},
                 {"zero", {{"dtype", "F16"}, {"shape", {0, 3}}, {"data_offsets", {4, 4}}}}};
  write_seed(dir, "scalar-and-empty", safetensors_bytes(scalar, std::string(4, '\x01')));
}

}  // namespace

extern const Target kSafetensors = {"safetensors", "a safetensors checkpoint shard", run,
                                    write_seeds};

}  // namespace protokv::fuzz
