// SPDX-License-Identifier: Apache-2.0
#include "model/tensor_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "model/gguf_names.h"
#include "model/loaders.h"

namespace protokv {
namespace {

int64_t q_width(const ModelConfig& c) {
  return int64_t{c.n_heads} * c.head_dim();
}
int64_t kv_width(const ModelConfig& c) {
  return int64_t{c.n_kv_heads} * c.head_dim();
}

TensorShape vocab_by_dim(const ModelConfig& c) {
  return {c.vocab_size, c.dim};
}
TensorShape dim_vector(const ModelConfig& c) {
  return {1, c.dim};
}
TensorShape q_by_dim(const ModelConfig& c) {
  return {q_width(c), c.dim};
}
TensorShape kv_by_dim(const ModelConfig& c) {
  return {kv_width(c), c.dim};
}
TensorShape dim_by_q(const ModelConfig& c) {
  return {c.dim, q_width(c)};
}
TensorShape q_vector(const ModelConfig& c) {
  return {1, q_width(c)};
}
TensorShape kv_vector(const ModelConfig& c) {
  return {1, kv_width(c)};
}
TensorShape head_vector(const ModelConfig& c) {
  return {1, c.head_dim()};
}
TensorShape rope_pair_vector(const ModelConfig& c) {
  return {1, c.rope_dims() / 2};
}
TensorShape hidden_by_dim(const ModelConfig& c) {
  return {c.hidden_dim, c.dim};
}
TensorShape dim_by_hidden(const ModelConfig& c) {
  return {c.dim, c.hidden_dim};
}

using P = TensorPresence;
using I = TensorInit;
using MW = ModelWeights;
using LW = LayerWeights;

// Tensor names and shapes follow llama.cpp (src/llama-arch.cpp,
// src/models/{llama,qwen2,qwen3}.cpp). seed_key values are fixed forever: they select the random
// streams of make-model, so changing one changes every random model.
// clang-format off
#define PROTOKV_GLOBAL_TENSORS \
    {"token_embd.weight",       false, false, P::kRequired, vocab_by_dim, I::kEmbedding, false, 0, &MW::token_embd, nullptr, nullptr, nullptr}, \
    {"output_norm.weight",      false, true,  P::kRequired, dim_vector, I::kOnes, false, 1, nullptr, &MW::output_norm, nullptr, nullptr}, \
    {"output.weight",           false, false, P::kUnlessSharedClassifier, vocab_by_dim, I::kFanIn, false, 2, &MW::output, nullptr, nullptr, nullptr}
#define PROTOKV_FFN_TENSORS \
    {"blk.{}.ffn_norm.weight",    true, true,  P::kRequired, dim_vector, I::kOnes, false, 8, nullptr, nullptr, nullptr, &LW::ffn_norm}, \
    {"blk.{}.ffn_gate.weight",    true, false, P::kRequired, hidden_by_dim, I::kFanIn, true, 9, nullptr, nullptr, &LW::w_gate, nullptr}, \
    {"blk.{}.ffn_up.weight",      true, false, P::kRequired, hidden_by_dim, I::kFanIn, true, 10, nullptr, nullptr, &LW::w_up, nullptr}, \
    {"blk.{}.ffn_down.weight",    true, false, P::kRequired, dim_by_hidden, I::kResidual, true, 11, nullptr, nullptr, &LW::w_down, nullptr}

// The attention block without biases (Qwen3, Gemma 3).
#define PROTOKV_UNBIASED_ATTENTION_TENSORS \
    {"blk.{}.attn_norm.weight",   true, true,  P::kRequired, dim_vector, I::kOnes, false, 3, nullptr, nullptr, nullptr, &LW::attn_norm}, \
    {"blk.{}.attn_q.weight",      true, false, P::kRequired, q_by_dim, I::kFanIn, true, 4, nullptr, nullptr, &LW::wq, nullptr}, \
    {"blk.{}.attn_k.weight",      true, false, P::kRequired, kv_by_dim, I::kFanIn, true, 5, nullptr, nullptr, &LW::wk, nullptr}, \
    {"blk.{}.attn_v.weight",      true, false, P::kRequired, kv_by_dim, I::kFanIn, true, 6, nullptr, nullptr, &LW::wv, nullptr}, \
    {"blk.{}.attn_output.weight", true, false, P::kRequired, dim_by_q, I::kResidual, true, 7, nullptr, nullptr, &LW::wo, nullptr}

// Llama (Llama 2/3.x, Mistral, TinyLlama, SmolLM2): Meta-order RoPE; optional q/k/v biases;
// rope_freqs.weight carries Llama 3.x "llama3" RoPE scaling.
const TensorEntry kLlama[] = {
    PROTOKV_GLOBAL_TENSORS,
    {"rope_freqs.weight",       false, true,  P::kWithRopeFreqFactors, rope_pair_vector, I::kLlama3RopeFreqs, false, 15, nullptr, &MW::rope_freqs, nullptr, nullptr},
    {"blk.{}.attn_norm.weight",   true, true,  P::kRequired, dim_vector, I::kOnes, false, 3, nullptr, nullptr, nullptr, &LW::attn_norm},
    {"blk.{}.attn_q.weight",      true, false, P::kRequired, q_by_dim, I::kFanIn, true, 4, nullptr, nullptr, &LW::wq, nullptr},
    {"blk.{}.attn_q.bias",        true, true,  P::kOptional, q_vector, I::kBias, false, 12, nullptr, nullptr, nullptr, &LW::bq},
    {"blk.{}.attn_k.weight",      true, false, P::kRequired, kv_by_dim, I::kFanIn, true, 5, nullptr, nullptr, &LW::wk, nullptr},
    {"blk.{}.attn_k.bias",        true, true,  P::kOptional, kv_vector, I::kBias, false, 13, nullptr, nullptr, nullptr, &LW::bk},
    {"blk.{}.attn_v.weight",      true, false, P::kRequired, kv_by_dim, I::kFanIn, true, 6, nullptr, nullptr, &LW::wv, nullptr},
    {"blk.{}.attn_v.bias",        true, true,  P::kOptional, kv_vector, I::kBias, false, 14, nullptr, nullptr, nullptr, &LW::bv},
    {"blk.{}.attn_output.weight", true, false, P::kRequired, dim_by_q, I::kResidual, true, 7, nullptr, nullptr, &LW::wo, nullptr},
    PROTOKV_FFN_TENSORS,
};

// Qwen2 / Qwen2.5: llama's block with q/k/v biases (always present in Qwen2 files) and NeoX RoPE.
const TensorEntry kQwen2[] = {
    PROTOKV_GLOBAL_TENSORS,
    {"blk.{}.attn_norm.weight",   true, true,  P::kRequired, dim_vector, I::kOnes, false, 3, nullptr, nullptr, nullptr, &LW::attn_norm},
    {"blk.{}.attn_q.weight",      true, false, P::kRequired, q_by_dim, I::kFanIn, true, 4, nullptr, nullptr, &LW::wq, nullptr},
    {"blk.{}.attn_q.bias",        true, true,  P::kRequired, q_vector, I::kBias, false, 12, nullptr, nullptr, nullptr, &LW::bq},
    {"blk.{}.attn_k.weight",      true, false, P::kRequired, kv_by_dim, I::kFanIn, true, 5, nullptr, nullptr, &LW::wk, nullptr},
    {"blk.{}.attn_k.bias",        true, true,  P::kRequired, kv_vector, I::kBias, false, 13, nullptr, nullptr, nullptr, &LW::bk},
    {"blk.{}.attn_v.weight",      true, false, P::kRequired, kv_by_dim, I::kFanIn, true, 6, nullptr, nullptr, &LW::wv, nullptr},
    {"blk.{}.attn_v.bias",        true, true,  P::kRequired, kv_vector, I::kBias, false, 14, nullptr, nullptr, nullptr, &LW::bv},
    {"blk.{}.attn_output.weight", true, false, P::kRequired, dim_by_q, I::kResidual, true, 7, nullptr, nullptr, &LW::wo, nullptr},
    PROTOKV_FFN_TENSORS,
};

// Qwen3: no biases; per-head RMSNorm of q and k (weights [head_dim]) before NeoX RoPE; heads may
// be wider than dim / n_heads (attention.key_length).
const TensorEntry kQwen3[] = {
    PROTOKV_GLOBAL_TENSORS,
    PROTOKV_UNBIASED_ATTENTION_TENSORS,
    {"blk.{}.attn_k_norm.weight", true, true,  P::kRequired, head_vector, I::kNearOnes, false, 16, nullptr, nullptr, nullptr, &LW::attn_k_norm},
    {"blk.{}.attn_q_norm.weight", true, true,  P::kRequired, head_vector, I::kNearOnes, false, 17, nullptr, nullptr, nullptr, &LW::attn_q_norm},
    PROTOKV_FFN_TENSORS,
};
// Gemma 3 (llama.cpp src/models/gemma3.cpp): per-head q/k RMSNorm before NeoX RoPE, RMSNorm of
// the attention output and of the FFN output before each joins the residual stream, GeGLU FFN,
// tied classifier (output.weight optional). Norm weights are stored as 1 + w by the converter.
const TensorEntry kGemma3[] = {
    PROTOKV_GLOBAL_TENSORS,
    PROTOKV_UNBIASED_ATTENTION_TENSORS,
    {"blk.{}.post_attention_norm.weight", true, true,  P::kRequired, dim_vector, I::kNearOnes, false, 18, nullptr, nullptr, nullptr, &LW::attn_post_norm},
    {"blk.{}.attn_k_norm.weight",         true, true,  P::kRequired, head_vector, I::kNearOnes, false, 16, nullptr, nullptr, nullptr, &LW::attn_k_norm},
    {"blk.{}.attn_q_norm.weight",         true, true,  P::kRequired, head_vector, I::kNearOnes, false, 17, nullptr, nullptr, nullptr, &LW::attn_q_norm},
    PROTOKV_FFN_TENSORS,
    {"blk.{}.post_ffw_norm.weight",       true, true,  P::kRequired, dim_vector, I::kNearOnes, false, 19, nullptr, nullptr, nullptr, &LW::ffn_post_norm},
};
#undef PROTOKV_GLOBAL_TENSORS
#undef PROTOKV_FFN_TENSORS
#undef PROTOKV_UNBIASED_ATTENTION_TENSORS
// clang-format on

constexpr std::string_view kLlamaHfClasses[] = {"LlamaForCausalLM", "MistralForCausalLM"};
constexpr std::string_view kQwen2HfClasses[] = {"Qwen2ForCausalLM"};
constexpr std::string_view kQwen3HfClasses[] = {"Qwen3ForCausalLM"};

// The registry (tensor_table.h's Architecture). Gemma 3 has no Hugging Face converter (its
// checkpoints store norms as w, GGUF as 1 + w, and use GeGLU): its GGUF files load directly.
const Architecture kArchitectures[] = {
    {.name = gguf_names::kArchLlama,
     .summary = "Meta-order RoPE, optional q/k/v biases, Llama 3.x rope_freqs",
     .tensors = kLlama,
     .rope_freq_factors = true,
     .hf_classes = kLlamaHfClasses,
     .hf_undo_qk_permute = true,
     .llama_cpp_order = true},
    {.name = gguf_names::kArchQwen2,
     .summary = "q/k/v biases, NeoX RoPE",
     .tensors = kQwen2,
     .rope_neox = true,
     .q_spans_dim = true,
     .hf_classes = kQwen2HfClasses,
     .hf_biases_required = true,
     .llama_cpp_order = true},
    {.name = gguf_names::kArchQwen3,
     .summary = "per-head q/k RMSNorm, NeoX RoPE, free head width",
     .tensors = kQwen3,
     .rope_neox = true,
     .free_head_dim = true,
     .hf_classes = kQwen3HfClasses,
     .llama_cpp_order = true},
    {.name = gguf_names::kArchGemma3,
     .summary = "q/k norms, post-norms, GeGLU, embeddings x sqrt(dim), sliding-window layers",
     .tensors = kGemma3,
     .rope_neox = true,
     .free_head_dim = true,
     .sliding_window = true,
     .scaled_embedding_geglu = true,
     .read_gguf_config = read_gemma3_gguf_config},
};

}  // namespace

std::span<const Architecture> architectures() {
  return kArchitectures;
}

std::string architecture_names(bool Architecture::*flag) {
  std::vector<std::string_view> names;
  for (const Architecture& a : kArchitectures)
    if (flag == nullptr || a.*flag) names.push_back(a.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string hf_class_names() {
  std::vector<std::string_view> names;
  for (const Architecture& a : kArchitectures)
    names.insert(names.end(), a.hf_classes.begin(), a.hf_classes.end());
  return fmt::format("{}", fmt::join(names, ", "));
}

const Architecture& architecture(std::string_view name) {
  for (const Architecture& a : kArchitectures)
    if (a.name == name) return a;
  fail("unsupported model architecture '{}' (supported: {})", name, architecture_names());
}

std::span<const TensorEntry> tensor_table(std::string_view architecture_name) {
  return architecture(architecture_name).tensors;
}

bool architecture_rope_neox(std::string_view architecture_name) {
  return architecture(architecture_name).rope_neox;
}

const Architecture& set_architecture_constants(ModelConfig& config) {
  const Architecture& arch = architecture(config.architecture);
  config.rope_neox = arch.rope_neox;
  if (arch.scaled_embedding_geglu) {
    config.embedding_scale = std::sqrt(static_cast<float>(config.dim));
    config.ffn_activation = FfnActivation::kGeluTanh;
  }
  return arch;
}

std::vector<uint8_t> sliding_window_pattern(int n_layers, int period) {
  std::vector<uint8_t> local(static_cast<size_t>(std::max(0, n_layers)));
  for (int l = 0; l < n_layers; ++l)
    local[static_cast<size_t>(l)] = period == 0 || l % period < period - 1;
  return local;
}

std::vector<TensorSpec> tensor_specs(const ModelConfig& config, bool with_optional) {
  const std::span<const TensorEntry> table = tensor_table(config.architecture);
  std::vector<TensorSpec> specs;
  auto add = [&](const TensorEntry& e, int layer) {
    if (e.presence == P::kOptional && !with_optional) return;
    if (e.presence == P::kUnlessSharedClassifier && config.shared_classifier) return;
    if (e.presence == P::kWithRopeFreqFactors && !config.rope_freq_factors) return;
    const TensorShape shape = e.shape(config);
    std::string name =
        layer >= 0 ? fmt::format(fmt::runtime(e.gguf_name), layer) : std::string(e.gguf_name);
    specs.push_back({&e, layer, std::move(name), shape.rows, shape.cols});
  };
  for (const TensorEntry& e : table)
    if (!e.per_layer) add(e, -1);
  for (int l = 0; l < config.n_layers; ++l)
    for (const TensorEntry& e : table)
      if (e.per_layer) add(e, l);
  return specs;
}

WeightMatrix tensor_view(const ModelWeights& w, const TensorSpec& spec) {
  const TensorEntry& e = *spec.entry;
  if (e.per_layer) {
    const LayerWeights& l = w.layers.at(static_cast<size_t>(spec.layer));
    if (e.layer_matrix != nullptr) return l.*e.layer_matrix;
    return WeightMatrix{DType::F32, l.*e.layer_vector, 1, spec.cols};
  }
  if (e.model_matrix != nullptr) return w.*e.model_matrix;
  return WeightMatrix{DType::F32, w.*e.model_vector, 1, spec.cols};
}

void check_tensors(const ModelWeights& weights) {
  const ModelConfig& c = weights.config;
  c.validate();
  for_each_tensor(c, weights, [](const TensorSlot<const ModelWeights>& t) {
    const TensorSpec& s = t.spec;
    if (!t.present()) {
      PROTOKV_CHECK(!s.required(), "model is missing weight {}", s.name);
      return;
    }
    const WeightMatrix w = t.view();
    PROTOKV_CHECK(w.rows == s.rows && w.cols == s.cols,
                  "weight {} has shape [{}, {}], expected [{}, {}]", s.name, w.rows, w.cols, s.rows,
                  s.cols);
    PROTOKV_CHECK(w.cols % dtype_block_size(w.type) == 0,
                  "weight {}: {} columns are not a multiple of the {} block size", s.name, w.cols,
                  dtype_name(w.type));
  });
  if (c.shared_classifier) {  // output aliases token_embd and is not in the table walk
    PROTOKV_CHECK(weights.output.data != nullptr && weights.output.rows == c.vocab_size &&
                      weights.output.cols == c.dim,
                  "model with a shared classifier must view token_embd as its output");
  }
}

}  // namespace protokv
