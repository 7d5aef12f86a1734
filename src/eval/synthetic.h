// SPDX-License-Identifier: Apache-2.0
#pragma once
// SYNTHETIC model, workload and post-RoPE tensors, generated in memory from a seed, so that the
// demo, tests and the compression benchmark need no download. Nothing here is a trained model:
// every output built from it must say SYNTHETIC.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "protokv/model.h"
#include "protokv/press.h"

namespace protokv::eval {

// Random-weight Llama-shaped model. The query and key projections of a query head and its KV
// head share most of their weights and are scaled up (qk_gain), so a query attends sharply to
// earlier occurrences of its own token (content matching, as induction heads do) rather than
// uniformly: which entries a press keeps then changes the output.
struct SyntheticModelSpec {
  int dim = 256;
  int hidden_dim = 768;
  int n_layers = 4;
  int n_heads = 8;
  int n_kv_heads = 4;
  int vocab_size = 512;
  int context_length = 2048;
  float rope_theta = 1.0e6f;  // large base: content matches stay visible over long distances
  float qk_gain = 1.25f;    // scales W_q and W_k; q·k/√d of a token with itself ≈ 5.7·gain²
  float qk_noise = 0.35f;   // part of W_q a query head does not share with its KV head
  float logit_gain = 3.0f;  // std of the output logits
  uint64_t seed = 20240611;

  // A much smaller variant for tests (fast under sanitizers).
  static SyntheticModelSpec tiny();
  std::string describe() const;  // one line, starts with "SYNTHETIC"
};

// F32 weights in owned buffers (ModelWeights::storage), the same structs as a loaded model.
ModelWeights make_synthetic_model(const SyntheticModelSpec& spec);

// Token ids of the synthetic workload's layout (a model's ids, not a tokenizer: the synthetic
// tokenizer's vocabulary is SyntheticVocab in model/random_model.h).
struct SyntheticTokens {
  static constexpr int32_t kBos = 1;
  static constexpr int32_t kEos = 2;
  static constexpr int32_t kFirstKey = 3;  // planted keys: [3, 3 + n_keys)
  static constexpr int32_t kNumKeys = 32;
  static constexpr int32_t kFirstValue = 35;  // planted values: [35, 35 + n_values)
  static constexpr int32_t kNumValues = 64;
  static constexpr int32_t kFirstFiller = 99;  // filler text: [99, vocab)
};

// A prompt of n_tokens (BOS first) with structure that makes some tokens matter: filler text,
// a few motifs of 8 tokens repeated at random places, and planted "key value" pairs; the prompt
// ends by repeating some planted keys, so the last queries look for the tokens that followed
// those keys earlier. Requires vocab_size > kFirstFiller + 16 and n_tokens >= 16.
std::vector<int32_t> make_synthetic_prompt(int64_t n_tokens, int vocab_size, uint64_t seed);

// One layer's post-RoPE Q/K/V for benchmarking a press's compress_prefill in isolation: keys
// drift locally (consecutive keys are similar), share a mean direction, carry two outlier
// channels of large magnitude; token 0 is a sink with a large norm; a few clusters of
// far-apart tokens share a direction that the last queries look for.
struct SyntheticLayerSpec {
  int64_t n_tokens = 4096;
  int n_kv_heads = 8;
  int group_size = 4;
  int head_dim = 128;
  float rope_theta = 500000.0f;
  uint64_t seed = 7;
};

struct SyntheticLayer {
  SyntheticLayerSpec spec;
  std::vector<float> q;            // [n_heads, n_tokens, head_dim]
  std::vector<float> k;            // [n_kv_heads, n_tokens, head_dim]
  std::vector<float> v;            // [n_kv_heads, n_tokens, head_dim]
  std::vector<int32_t> positions;  // [n_tokens] = 0..n-1
  kernels::RopeTable rope;         // the rotation q and k were given (adjacent pairs)

  LayerView view(int layer, int n_layers) const;
};

SyntheticLayer make_synthetic_layer(const SyntheticLayerSpec& spec);

}  // namespace protokv::eval
