// SPDX-License-Identifier: Apache-2.0
// llama2.c "legacy" checkpoint loader: a header of 7 little-endian int32
// (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len) followed by F32 tensors in
// the order of llama2.c's run.c (memory_map_weights). The file is memory-mapped and every
// WeightMatrix points into the mapping; nothing is copied.

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "io/mapped_file.h"
#include "model/loaders.h"
#include "model/tensor_table.h"
#include "protokv/error.h"

namespace protokv {
namespace {

constexpr size_t kHeaderInts = 7;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

int32_t read_le_int32(const unsigned char* p) {
  const uint32_t v = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return static_cast<int32_t>(v);
}

// The tensors of a llama2.c checkpoint in file order (run.c's memory_map_weights), by their
// names in the llama tensor table: per-layer tensors are stacked ([n_layers, rows, cols]).
// run.c's matmul(xout, x, w, n, d) computes xout[d] = W[d, n] x[n]: rows are output features,
// which is the table's convention, so the tensors map without transposition. The precomputed
// RoPE tables (unused: RoPE is computed) sit between output_norm and the classifier.
constexpr std::string_view kFileOrder[] = {
    "token_embd.weight",      "blk.{}.attn_norm.weight", "blk.{}.attn_q.weight",
    "blk.{}.attn_k.weight",   "blk.{}.attn_v.weight",    "blk.{}.attn_output.weight",
    "blk.{}.ffn_norm.weight", "blk.{}.ffn_gate.weight",  "blk.{}.ffn_down.weight",
    "blk.{}.ffn_up.weight",   "output_norm.weight",      "",  // "": the RoPE tables
    "output.weight"};

const TensorEntry& table_entry(const ModelConfig& config, std::string_view name) {
  for (const TensorEntry& e : tensor_table(config.architecture))
    if (e.gguf_name == name) return e;
  fail("llama2.c layout names unknown tensor {}", name);
}

}  // namespace

ModelWeights load_llama2c_model(const std::string& path) {
  size_t file_size = 0;
  std::shared_ptr<const void> mapping =
      map_file(path, kHeaderBytes, "a llama2.c checkpoint", &file_size);
  const auto* bytes = static_cast<const unsigned char*>(mapping.get());

  int32_t header[kHeaderInts];
  for (size_t i = 0; i < kHeaderInts; ++i) header[i] = read_le_int32(bytes + 4 * i);

  ModelConfig config;
  config.architecture = "llama";
  config.dim = header[0];
  config.hidden_dim = header[1];
  config.n_layers = header[2];
  config.n_heads = header[3];
  config.n_kv_heads = header[4];
  // A negative vocabulary size marks a separate classifier matrix (llama2.c export convention).
  config.shared_classifier = header[5] > 0;
  config.vocab_size = header[5] == INT32_MIN ? 0 : (header[5] < 0 ? -header[5] : header[5]);
  config.context_length = header[6];
  config.rope_theta = 10000.0f;
  config.norm_eps = 1e-5f;
  config.rope_neox = false;  // llama2.c checkpoints are in Meta (adjacent-pair) order
  try {
    config.validate();
  } catch (const Error& e) {
    fail("{}: not a valid llama2.c checkpoint: {}", path, e.what());
  }

  // Where each table entry starts in the file, in floats after the header; every count is
  // bounded by validate(), so int64 arithmetic cannot overflow.
  std::vector<std::pair<const TensorEntry*, int64_t>> starts;
  int64_t floats = 0;
  for (std::string_view name : kFileOrder) {
    if (name.empty()) {
      floats += config.context_length * config.head_dim();  // freq_cis_real + freq_cis_imag
      continue;
    }
    const TensorEntry& e = table_entry(config, name);
    if (e.presence == TensorPresence::kUnlessSharedClassifier && config.shared_classifier) continue;
    const TensorShape shape = e.shape(config);
    starts.emplace_back(&e, floats);
    floats += (e.per_layer ? config.n_layers : 1) * shape.rows * shape.cols;
  }
  const auto expected = static_cast<uint64_t>(kHeaderBytes) + static_cast<uint64_t>(floats) * 4;
  if (file_size != expected) {
    fail(
        "{}: size {} bytes does not match its llama2.c header ({} bytes expected for dim {}, "
        "{} layers, vocab {}{})",
        path, file_size, expected, config.dim, config.n_layers, config.vocab_size,
        config.shared_classifier ? "" : ", separate classifier");
  }

  ModelWeights weights;
  weights.config = config;
  weights.layers.resize(static_cast<size_t>(config.n_layers));
  const auto* data = reinterpret_cast<const float*>(bytes + kHeaderBytes);
  for_each_tensor(config, weights, [&](const TensorSlot<ModelWeights>& t) {
    for (const auto& [entry, start] : starts) {
      if (entry != t.spec.entry) continue;
      const int64_t layer_offset = t.spec.layer >= 0 ? t.spec.layer * t.spec.rows * t.spec.cols : 0;
      t.bind(data + start + layer_offset);
      return;
    }
    // Not in a llama2.c file (optional tensors such as biases): absent.
  });
  if (config.shared_classifier) weights.output = weights.token_embd;
  weights.storage.push_back(std::move(mapping));
  return weights;
}

}  // namespace protokv
