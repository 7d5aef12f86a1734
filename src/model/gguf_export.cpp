// SPDX-License-Identifier: Apache-2.0
#include "model/gguf_export.h"
#include "core/parallel.h"

#include <cstring>

#include "model/gguf_names.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/tokenizer.h"

namespace protokv {
namespace {

namespace names = gguf_names;

std::vector<int64_t> gguf_dims(const TensorSpec& spec) {
  if (spec.is_vector()) return {spec.cols};
  return {spec.cols, spec.rows};
}

// Converts `src` row by row into `type` at `dst` (threads over rows).
void convert_rows(const WeightMatrix& src, DType type, void* dst) {
  if (src.type == type) {
    std::memcpy(dst, src.data, src.bytes());
    return;
  }
  const size_t dst_row_bytes = dtype_row_bytes(type, src.cols);
  ParallelErrors errors;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(src.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < src.rows; ++r) {
      errors.run([&] {
        dequantize_row(src.type, src.row(r), row.data(), src.cols);
        quantize_row(type, row.data(),
                     static_cast<char*>(dst) + static_cast<size_t>(r) * dst_row_bytes, src.cols);
      });
    }
  }
  errors.rethrow();
}

}  // namespace

DType storage_type(const TensorSpec& spec, DType requested) {
  if (spec.is_vector()) return DType::F32;
  if (spec.cols % dtype_block_size(requested) != 0) return DType::F16;
  return requested;
}

std::vector<std::string> storage_notes(const ModelConfig& config, DType requested) {
  std::vector<std::string> notes;
  for (const auto& spec : tensor_specs(config, /*with_optional=*/false)) {
    const DType stored = storage_type(spec, requested);
    if (spec.is_vector() || stored == requested) continue;
    notes.push_back(
        fmt::format("{}: rows of {} values are not a multiple of {}, stored as {} "
                    "instead of {}",
                    spec.name, spec.cols, dtype_block_size(requested), dtype_name(stored),
                    dtype_name(requested)));
  }
  return notes;
}

uint64_t llama_file_bytes(const ModelConfig& config, DType requested) {
  uint64_t total = 0;
  for (const auto& spec : tensor_specs(config, /*with_optional=*/false)) {
    total += static_cast<uint64_t>(spec.rows) *
             dtype_row_bytes(storage_type(spec, requested), spec.cols);
  }
  return total;
}

void set_llama_metadata(GgufWriter& w, const ModelConfig& c, DType requested,
                        const std::string& name) {
  const std::string& arch = c.architecture;
  PROTOKV_CHECK(c.rope_neox == architecture_rope_neox(arch),
                "cannot write a {} model with {} RoPE: llama.cpp's {} uses {} RoPE", arch,
                c.rope_neox ? "NeoX" : "Meta-order", arch,
                architecture_rope_neox(arch) ? "NeoX" : "Meta-order");
  PROTOKV_CHECK(dtype_quantizable(requested),
                "cannot write {} weights: protokv has no {} quantiser (quantise an f16 file "
                "with llama-quantize)",
                dtype_name(requested), dtype_name(requested));
  auto u32 = [](int v) { return static_cast<uint32_t>(v); };
  w.set_string(std::string(names::kArchitecture), arch);
  w.set_string(std::string(names::kName), name);
  w.set_u32(std::string(gguf_container::kAlignment), gguf_container::kDefaultAlignment);
  w.set_u32(std::string(names::kFileType), dtype_traits(requested).file_type);
  if (dtype_block_size(requested) > 1) {
    w.set_u32(std::string(names::kQuantizationVersion), names::kQuantizationVersionValue);
  }
  w.set_u32(names::arch_key(arch, names::kContextLength), u32(c.context_length));
  w.set_u32(names::arch_key(arch, names::kEmbeddingLength), u32(c.dim));
  w.set_u32(names::arch_key(arch, names::kBlockCount), u32(c.n_layers));
  w.set_u32(names::arch_key(arch, names::kFeedForwardLength), u32(c.hidden_dim));
  w.set_u32(names::arch_key(arch, names::kRopeDimensionCount), u32(c.rope_dims()));
  if (c.explicit_head_dim > 0) {
    w.set_u32(names::arch_key(arch, names::kKeyLength), u32(c.head_dim()));
    w.set_u32(names::arch_key(arch, names::kValueLength), u32(c.head_dim()));
  }
  w.set_u32(names::arch_key(arch, names::kHeadCount), u32(c.n_heads));
  w.set_u32(names::arch_key(arch, names::kHeadCountKv), u32(c.n_kv_heads));
  w.set_f32(names::arch_key(arch, names::kRmsNormEps), c.norm_eps);
  w.set_f32(names::arch_key(arch, names::kRopeFreqBase), c.rope_theta);
  if (c.rope_linear_factor != 1.0f) {
    w.set_string(names::arch_key(arch, names::kRopeScalingType), "linear");
    w.set_f32(names::arch_key(arch, names::kRopeScalingFactor), c.rope_linear_factor);
  }
  w.set_u32(names::arch_key(arch, names::kVocabSize), u32(c.vocab_size));
  if (c.has_local_layers()) {
    // llama.cpp reads the pattern as a period p (layer l local unless l % p == p - 1).
    int period = -1;
    for (int p = 0; p <= c.n_layers + 1 && period < 0; ++p)
      if (sliding_window_pattern(c.n_layers, p) == c.local_layers) period = p;
    PROTOKV_CHECK(period >= 0,
                  "cannot write sliding-window layers that follow no period (llama.cpp's {})",
                  names::arch_key(arch, names::kSlidingWindowPattern));
    w.set_u32(names::arch_key(arch, names::kSlidingWindow), u32(c.sliding_window));
    w.set_u32(names::arch_key(arch, names::kSlidingWindowPattern), u32(period));
    w.set_f32(names::arch_key(arch, names::kRopeFreqBaseSwa), c.rope_theta_local);
  }
  if (c.final_logit_softcap > 0.0f)
    w.set_f32(names::arch_key(arch, names::kFinalLogitSoftcapping), c.final_logit_softcap);
}

std::vector<std::string> export_gguf(const ModelWeights& weights, const Tokenizer* tokenizer,
                                     const std::string& path, const GgufExportOptions& options) {
  const ModelConfig& c = weights.config;
  c.validate();
  PROTOKV_CHECK(static_cast<int>(weights.layers.size()) == c.n_layers,
                "model has {} layers but its config says {}", weights.layers.size(), c.n_layers);
  if (tokenizer) {
    PROTOKV_CHECK(tokenizer->vocab_size() == c.vocab_size,
                  "tokenizer has {} tokens but the model's vocabulary is {}",
                  tokenizer->vocab_size(), c.vocab_size);
  }
  GgufWriter writer;
  set_llama_metadata(writer, c, options.type, options.name);
  if (tokenizer) tokenizer->write_gguf(writer);

  for_each_tensor(c, weights, [&](const TensorSlot<const ModelWeights>& t) {
    const TensorSpec& spec = t.spec;
    if (!t.present()) {
      PROTOKV_CHECK(!spec.required(), "model tensor {} is missing", spec.name);
      return;  // an optional tensor the model does not have
    }
    const WeightMatrix src = t.view();
    PROTOKV_CHECK(src.rows == spec.rows && src.cols == spec.cols,
                  "model tensor {} has the wrong shape", spec.name);
    const DType type = storage_type(spec, options.type);
    writer.add_tensor(spec.name, gguf_dims(spec), type,
                      [src, type](void* dst, size_t) { convert_rows(src, type, dst); });
  });
  writer.write(path);
  return storage_notes(c, options.type);
}

}  // namespace protokv
