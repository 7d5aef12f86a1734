// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one declarative table of an architecture's tensors (docs/DESIGN.md §3.1): name, shape from
// the config, required or optional, and where it lives in ModelWeights. Loading (GGUF, llama2.c),
// export, weight checks, byte / parameter / FLOP counts and the random-model builder all walk it
// through for_each_tensor, so adding a tensor (a bias, a q/k norm) or an architecture is a table
// entry, not a dozen edits. After gemma.cpp's ForEachTensor (gemma/weights.h).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "protokv/error.h"
#include "protokv/model.h"

namespace protokv {

class GgufFile;

struct TensorShape {
  int64_t rows = 0;  // vectors: 1
  int64_t cols = 0;
};

enum class TensorPresence {
  kRequired,
  kOptional,                // e.g. llama q/k/v biases: used when the model has them
  kUnlessSharedClassifier,  // output.weight: absent when the classifier reuses token_embd
  kWithRopeFreqFactors,     // rope_freqs.weight: present exactly when config.rope_freq_factors
};

// How the random-model builder initialises a tensor (random_model.cpp).
enum class TensorInit {
  kOnes,             // norm weights
  kEmbedding,        // standard deviation 1
  kFanIn,            // standard deviation 1/sqrt(cols)
  kResidual,         // 1/sqrt(cols) / sqrt(2 n_layers): outputs that add into the residual stream
  kBias,             // standard deviation 0.5: q/k/v biases, large enough for tests to see them
  kNearOnes,         // 1 + 0.25 * normal: q/k norm weights, so that swapping them shows in tests
  kLlama3RopeFreqs,  // Llama 3.1's "llama3" RoPE factors (random_model.cpp), not random
};

struct TensorEntry {
  std::string_view gguf_name;  // per-layer names hold "{}" for the layer index
  bool per_layer = false;
  bool is_vector = false;  // one F32 row (norms, biases), held as const float*
  TensorPresence presence = TensorPresence::kRequired;
  TensorShape (*shape)(const ModelConfig&) = nullptr;
  TensorInit init = TensorInit::kFanIn;
  bool projection = false;  // a per-token matrix product of a block (counted in FLOPs)
  uint64_t seed_key = 0;    // stable id of the tensor in random-model streams
  // Where the tensor lives: exactly one of these is set.
  WeightMatrix ModelWeights::*model_matrix = nullptr;
  const float* ModelWeights::*model_vector = nullptr;
  WeightMatrix LayerWeights::*layer_matrix = nullptr;
  const float* LayerWeights::*layer_vector = nullptr;
};

// One row per architecture protokv runs (docs/DESIGN.md §3.1, "Adding an architecture"): every
// fact about it that is not read from a file. The GGUF loader, the exporter, the Hugging Face
// converter, make-model and their error messages all read this registry, so an architecture is
// one row here plus its tensor table.
struct Architecture {
  std::string_view name{};                 // GGUF general.architecture
  std::string_view summary{};              // what sets it apart, for --help
  std::span<const TensorEntry> tensors{};  // in GGUF file order (globals, then each block)
  // NeoX RoPE pairs (i, i + n_rot/2) rather than Meta's adjacent pairs (llama.cpp's
  // llama_model_rope_type: NORM for llama, NEOX for the others).
  bool rope_neox = false;
  // The head width may differ from dim / n_heads (attention.key_length); when false,
  // n_heads x head_dim must equal dim, as llama.cpp's shapes of that architecture assume.
  bool free_head_dim = false;
  bool q_spans_dim = false;             // attn_q / attn_output are [dim, dim] (llama.cpp's qwen2)
  bool rope_freq_factors = false;       // rope_freqs.weight (Llama 3.x "llama3" scaling) is allowed
  bool sliding_window = false;          // interleaved local (sliding-window) and global layers
  bool scaled_embedding_geglu = false;  // embeddings x sqrt(dim) and a GeGLU FFN (Gemma)
  // Hugging Face classes converted to it (`protokv convert`); empty: no converter.
  std::span<const std::string_view> hf_classes{};
  // The Llama converter's Q/K row permutation (LlamaModel.permute) from Hugging Face's
  // rotate-half order back to Meta's pairs; NeoX architectures keep Hugging Face's order.
  bool hf_undo_qk_permute = false;
  bool hf_biases_required = false;  // q/k/v biases are always in its checkpoints (Qwen2)
  // llama.cpp's graph for it is the one SessionOptions::llama_cpp_arithmetic follows
  // (kernels/llama_cpp_order.h: Q unscaled, the scale inside the softmax, SwiGLU), checked
  // against llama.cpp's logits (tests/test_llama_cpp_oracle.cpp).
  bool llama_cpp_order = false;
  // Reads the GGUF keys of its own beyond the Llama block's (Gemma 3: soft-capping, the
  // sliding-window pattern, the local RoPE base), after those; nullptr: none.
  void (*read_gguf_config)(const GgufFile& file, ModelConfig& config) = nullptr;
};

// Every architecture, in the order messages list them.
std::span<const Architecture> architectures();
// The row of `name`; throws Error naming the supported ones for any other.
const Architecture& architecture(std::string_view name);
// The names of the architectures with `flag` set ("qwen3, gemma3"; every one without a flag:
// "llama, qwen2, qwen3, gemma3"), for messages and --help.
std::string architecture_names(bool Architecture::*flag = nullptr);
// Every Hugging Face class `protokv convert` takes ("LlamaForCausalLM, ...").
std::string hf_class_names();

// The tensor table of `architecture` (Architecture::tensors). Throws Error for an architecture
// protokv cannot run.
std::span<const TensorEntry> tensor_table(std::string_view architecture);

// Architecture::rope_neox of `architecture`.
bool architecture_rope_neox(std::string_view architecture);

// Sets what `config.architecture` fixes rather than stores in GGUF, from the config's shape:
// rope_neox, and for Gemma the embedding scale sqrt(dim) and GeGLU; returns the architecture's
// row. Throws Error for an unsupported architecture.
const Architecture& set_architecture_constants(ModelConfig& config);

// llama.cpp's sliding-window layer pattern of period p (llama_hparams::set_swa_pattern): layer l
// is local unless l % p == p - 1; p = 0 makes every layer local.
std::vector<uint8_t> sliding_window_pattern(int n_layers, int period);

// One tensor of a concrete config.
struct TensorSpec {
  const TensorEntry* entry = nullptr;
  int layer = -1;  // -1 outside the blocks
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  bool is_vector() const { return entry->is_vector; }
  bool required() const { return entry->presence != TensorPresence::kOptional; }
  uint64_t elements() const { return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols); }
};

// Every tensor `config` can have, in file order: output.weight only without a shared classifier,
// optional tensors only with `with_optional`.
std::vector<TensorSpec> tensor_specs(const ModelConfig& config, bool with_optional);

// A tensor of `weights` as for_each_tensor hands it out; `Weights` is ModelWeights or
// const ModelWeights.
template <class Weights>
struct TensorSlot {
  static constexpr bool kConst = std::is_const_v<Weights>;
  using Matrix = std::conditional_t<kConst, const WeightMatrix, WeightMatrix>;
  using Vector = std::conditional_t<kConst, const float* const, const float*>;

  const TensorSpec& spec;
  Matrix* matrix = nullptr;  // set for matrices
  Vector* vector = nullptr;  // set for vectors

  bool present() const { return matrix != nullptr ? matrix->data != nullptr : *vector != nullptr; }
  // The tensor as a matrix (a vector as one F32 row); data null when absent.
  WeightMatrix view() const {
    if (matrix != nullptr) return *matrix;
    return WeightMatrix{DType::F32, *vector, 1, spec.cols};
  }
  // Points the slot at `data` (an F32 vector, or a matrix of the spec's shape in `type`).
  void bind(const void* data, DType type = DType::F32) const requires(!kConst) {
    if (matrix != nullptr) {
      *matrix = WeightMatrix{type, data, spec.rows, spec.cols};
    } else {
      PROTOKV_CHECK(type == DType::F32, "vector tensor {} must be F32", spec.name);
      *vector = static_cast<const float*>(data);
    }
  }
};

// Calls f(TensorSlot) for every tensor `config` can have (optional ones included: a slot says
// whether it is present), in file order. `weights.layers` must hold config.n_layers layers.
// When the classifier is shared, output is not visited (it aliases token_embd).
template <class Weights, class F>
void for_each_tensor(const ModelConfig& config, Weights& weights, F&& f) {
  PROTOKV_CHECK(static_cast<int>(weights.layers.size()) == config.n_layers,
                "model has {} layers of weights, config says {}", weights.layers.size(),
                config.n_layers);
  for (const TensorSpec& spec : tensor_specs(config, /*with_optional=*/true)) {
    const TensorEntry& e = *spec.entry;
    TensorSlot<Weights> slot{spec};
    if (e.per_layer) {
      auto& layer = weights.layers[static_cast<size_t>(spec.layer)];
      if (e.layer_matrix != nullptr) slot.matrix = &(layer.*e.layer_matrix);
      if (e.layer_vector != nullptr) slot.vector = &(layer.*e.layer_vector);
    } else {
      if (e.model_matrix != nullptr) slot.matrix = &(weights.*e.model_matrix);
      if (e.model_vector != nullptr) slot.vector = &(weights.*e.model_vector);
    }
    f(slot);
  }
}

// The tensor `spec` names inside `weights` (a vector as one F32 row; data null when absent).
WeightMatrix tensor_view(const ModelWeights& weights, const TensorSpec& spec);

// Throws Error unless every required tensor is present and every present one has its shape
// (and, for matrices, whole quantisation blocks per row).
void check_tensors(const ModelWeights& weights);

}  // namespace protokv
