// SPDX-License-Identifier: Apache-2.0
// GGUF reader + model load (metadata, tensor infos, offsets, every weight type), and llama2.c
// checkpoints (load_model tells them apart by magic): the file is opened and loaded as `protokv
// generate -m` would, its tokenizer encodes and decodes a text, and a small model runs a forward
// pass and a decode step, so every weight type's kernels read the fuzzed tensor bytes.
#include <cstring>
#include <random>

#include "fuzz_target.h"
#include "model/gguf_export.h"
#include "model/random_model.h"
#include "model/tensor_table.h"
#include "protokv/engine.h"
#include "protokv/gguf.h"
#include "protokv/model.h"
#include "protokv/tokenizer.h"

namespace protokv::fuzz {
namespace {

// A forward pass reads every weight once: bounded by the file (tensors must lie inside it), but
// a model whose activations are large relative to its file (a long context, a wide FFN of F16
// rows) is skipped, to keep each input in the milliseconds.
constexpr size_t kMaxForwardWeightBytes = size_t{4} << 20;
constexpr int kMaxForwardDim = 4096;

Outcome run(Bytes data) {
  const MemoryFile file(data);
  return accept_or_refuse([&] {
    const LoadedModel model = load_model(file.path());
    if (model.tokenizer) {
      const Tokenizer& tokenizer = *model.tokenizer;
      const std::vector<int32_t> ids =
          tokenizer.encode("Once upon a time, <s> 42 \xc3\xa9\xe2\x96\x81 \xf0\x9f\x98\x80", true);
      (void)tokenizer.decode(ids);
    }
    const ModelConfig& c = model.weights.config;
    if (model.weights.weight_bytes() > kMaxForwardWeightBytes || c.dim > kMaxForwardDim ||
        c.hidden_dim > 4 * kMaxForwardDim)
      return;
    Session session(model.weights);
    const std::vector<int32_t> prompt = {0, std::min(1, c.vocab_size - 1), c.vocab_size - 1};
    (void)session.prefill(prompt);
    (void)session.decode(std::min(2, c.vocab_size - 1));
  });
}

ModelConfig tiny_config(const std::string& arch, int dim, int heads, int kv_heads, int hidden) {
  ModelConfig c;
  c.architecture = arch;
  c.dim = dim;
  set_architecture_constants(c);
  c.n_layers = 2;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.hidden_dim = hidden;
  c.vocab_size = kMinSyntheticVocab;
  c.context_length = 64;
  if (arch == "gemma3") {
    c.sliding_window = 4;
    c.local_layers = sliding_window_pattern(c.n_layers, 2);
  }
  return c;
}

// A model whose matrices are random bytes of `type` (every type protokv reads, including those
// it cannot quantise to): valid structure, arbitrary block contents.
std::string random_bytes_model(const ModelConfig& config, DType type, const std::string& path) {
  GgufWriter writer;
  set_llama_metadata(writer, config, DType::F16, "fuzz-seed");  // file type: any the writer knows
  synthetic_tokenizer(config.vocab_size)->write_gguf(writer);
  std::mt19937 rng(static_cast<uint32_t>(type));
  for (const auto& spec : tensor_specs(config, /*with_optional=*/false)) {
    const DType stored = storage_type(spec, type);
    std::vector<int64_t> dims = spec.is_vector() ? std::vector<int64_t>{spec.cols}
                                                 : std::vector<int64_t>{spec.cols, spec.rows};
    writer.add_tensor(spec.name, std::move(dims), stored, [&rng, stored](void* dst, size_t n) {
      auto* bytes = static_cast<uint8_t*>(dst);
      if (stored == DType::F32) {  // norms: ones
        for (size_t i = 0; i + 4 <= n; i += 4) {
          const float one = 1.0f;
          std::memcpy(bytes + i, &one, 4);
        }
        return;
      }
      for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(rng() & 0x3f);
    });
  }
  writer.write(path);
  return read_file_bytes(path);
}

void write_seeds(const std::filesystem::path& dir, const std::filesystem::path&) {
  const std::filesystem::path scratch = dir / ".scratch.gguf";
  struct Seed {
    const char* name;
    ModelConfig config;
    DType type;
  };
  const Seed seeds[] = {
      {"llama-f32", tiny_config("llama", 16, 2, 2, 32), DType::F32},
      {"qwen2-q8_0", tiny_config("qwen2", 32, 4, 2, 64), DType::Q8_0},
      {"qwen3-f16", tiny_config("qwen3", 32, 4, 1, 64), DType::F16},
      {"gemma3-q4_0", tiny_config("gemma3", 32, 2, 1, 64), DType::Q4_0},
      {"llama-bf16", tiny_config("llama", 32, 2, 2, 32), DType::BF16},
  };
  for (const Seed& seed : seeds) {
    RandomModelOptions options;
    options.config = seed.config;
    options.type = seed.type;
    write_random_model(options, scratch.string());
    write_seed(dir, seed.name, read_file_bytes(scratch));
  }
  // Every other block type, as random blocks (K-quants need rows of 256).
  for (const DType type : {DType::Q4_1, DType::Q5_0, DType::Q5_1})
    write_seed(dir, "llama-random-" + std::string(dtype_name(type)),
               random_bytes_model(tiny_config("llama", 32, 2, 2, 64), type, scratch.string()));
  for (const DType type : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    ModelConfig c = tiny_config("llama", 256, 1, 1, 256);
    c.n_layers = 1;
    write_seed(dir, "llama-random-" + std::string(dtype_name(type)),
               random_bytes_model(c, type, scratch.string()));
  }
  std::filesystem::remove(scratch);

  // A llama.2c checkpoint: 7 int32 (dim 8, hidden 16, 1 layer, 2 heads, 2 KV heads, vocab 32,
  // context 8), then the F32 tensors in llama2.c's order (952 floats for this shape).
  const int32_t header[7] = {8, 16, 1, 2, 2, 32, 8};
  std::string checkpoint(reinterpret_cast<const char*>(header), sizeof(header));
  std::vector<float> weights(952, 0.125f);
  checkpoint.append(reinterpret_cast<const char*>(weights.data()), weights.size() * sizeof(float));
  write_seed(dir, "llama2c", checkpoint);
}

}  // namespace

extern const Target kGgufModel = {"gguf_model", "a GGUF model file or llama2.c checkpoint", run,
                                  write_seeds};

}  // namespace protokv::fuzz
