#pragma once
// Internal state of protokv::Session, shared by session.cpp (lifecycle), prefill.cpp and
// decode.cpp. Not part of the public API.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "protokv/engine.h"

namespace protokv {

// Buffers of one decode step, allocated once per Session so that a step allocates nothing but
// cache growth.
struct DecodeScratch {
  std::vector<float> x;     // [dim] residual stream
  std::vector<float> xb;    // [dim] normalised input of a sub-block
  std::vector<float> q;     // [n_heads * head_dim]
  std::vector<float> k;     // [n_kv_heads * head_dim]
  std::vector<float> v;     // [n_kv_heads * head_dim]
  std::vector<float> att;   // [n_heads * head_dim] attention output before wo
  std::vector<float> proj;  // [dim] output of wo / w_down
  std::vector<float> gate;  // [hidden_dim]
  std::vector<float> up;    // [hidden_dim]
  // Softmax weights for observers: KV head h owns slots [h * group, (h + 1) * group) of
  // probs_stride floats each, filled as [group, entries] rows by the group attention kernel.
  std::vector<float> probs;  // [n_heads * probs_stride]
  int64_t probs_stride = 0;
};

struct Session::Impl {
  Impl(const ModelWeights& w, SessionOptions opts);

  std::span<const float> prefill(std::span<const int32_t> tokens);
  std::span<const float> decode(int32_t token);
  void reset();

  // Throws Error for a token id outside the vocabulary.
  void check_token(int32_t token) const;
  // Entries to reserve beyond what a head holds after prefill, so that the first decode steps
  // append without reallocating.
  int64_t decode_headroom(int64_t n_past_after_prefill) const;
  // Grows the per-head probability scratch to hold `n` entries per head.
  void ensure_probs_capacity(int64_t n);

  const ModelWeights& weights;
  const ModelConfig& config;
  SessionOptions options;
  KvCache cache;
  int64_t n_past = 0;
  bool press_begun = false;  // press->begin() ran for the current sequence
  PrefillStats stats;
  DecodeObserver* observer = nullptr;
  std::vector<float> logits;  // [vocab]
  DecodeScratch scratch;
};

// x[i] += bias[i] when a bias is present (Qwen2 q/k/v biases).
inline void add_bias(float* x, const float* bias, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < n; ++i) x[i] += bias[i];
}

// SwiGLU: gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g).
inline void swiglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace protokv
