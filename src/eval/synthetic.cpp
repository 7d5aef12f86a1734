// SPDX-License-Identifier: Apache-2.0
#include "eval/synthetic.h"
#include "core/parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "core/rng.h"
#include "kernels/kernels.h"
#include "model/random_model.h"
#include "protokv/error.h"

namespace protokv::eval {
namespace {

// The F32 values behind a matrix of a model we built ourselves (random_model_weights owns
// mutable buffers; ModelWeights only hands out const views).
float* owned_values(const WeightMatrix& w) {
  return static_cast<float*>(const_cast<void*>(w.data));
}

void scale(const WeightMatrix& w, float factor) {
  float* data = owned_values(w);
  for (int64_t i = 0; i < w.rows * w.cols; ++i) data[i] *= factor;
}

}  // namespace

SyntheticModelSpec SyntheticModelSpec::tiny() {
  SyntheticModelSpec spec;
  spec.dim = 64;
  spec.hidden_dim = 128;
  spec.n_layers = 2;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;
  spec.vocab_size = 160;
  spec.context_length = 512;
  return spec;
}

std::string SyntheticModelSpec::describe() const {
  return fmt::format(
      "SYNTHETIC random-weight model (seed {}): dim {}, {} layers, {} heads, {} KV heads, vocab "
      "{}, "
      "context {}",
      seed, dim, n_layers, n_heads, n_kv_heads, vocab_size, context_length);
}

ModelWeights make_synthetic_model(const SyntheticModelSpec& spec) {
  ModelConfig c;
  c.architecture = "llama";
  c.dim = spec.dim;
  c.hidden_dim = spec.hidden_dim;
  c.n_layers = spec.n_layers;
  c.n_heads = spec.n_heads;
  c.n_kv_heads = spec.n_kv_heads;
  c.vocab_size = spec.vocab_size;
  c.context_length = spec.context_length;
  c.rope_theta = spec.rope_theta;
  c.norm_eps = 1e-5f;
  c.rope_neox = false;
  c.shared_classifier = false;
  c.validate();
  PROTOKV_CHECK(spec.vocab_size > SyntheticTokens::kFirstFiller + 16,
                "synthetic model needs a vocabulary above {} tokens",
                SyntheticTokens::kFirstFiller + 16);

  // The library's random weights (random_model_weights: token embeddings of standard deviation
  // 1, matrices 1/sqrt(cols), residual outputs a further 1/sqrt(2 n_layers), norms 1), then the
  // synthetic model's structure on top.
  ModelWeights w = random_model_weights(c, spec.seed);
  const int64_t hd = c.head_dim();
  const int64_t dim = c.dim;
  const float residual = std::sqrt(2.0f * static_cast<float>(c.n_layers));
  for (auto& layer : w.layers) {
    // W_k = gain·A_j for KV head j; W_q = gain·(√(1−ε²)·A_j + ε·B_h) for its query heads, so
    // q·k is large exactly when the query and key tokens carry the same content.
    const float* wk = owned_values(layer.wk);
    float* wq = owned_values(layer.wq);
    const float shared = std::sqrt(1.0f - spec.qk_noise * spec.qk_noise);
    for (int h = 0; h < c.n_heads; ++h) {
      const float* a = wk + static_cast<int64_t>(h / c.group_size()) * hd * dim;
      float* q = wq + static_cast<int64_t>(h) * hd * dim;
      for (int64_t i = 0; i < hd * dim; ++i) {
        q[i] = spec.qk_gain * (shared * a[i] + spec.qk_noise * q[i]);
      }
    }
    scale(layer.wk, spec.qk_gain);
    // Attention output about as large as the residual stream: the cache matters to the logits.
    scale(layer.wo, residual);             // standard deviation 1/sqrt(n_heads·head_dim)
    scale(layer.w_down, 0.5f * residual);  // 0.5/sqrt(hidden_dim)
  }
  scale(w.output, spec.logit_gain);  // logits of standard deviation about logit_gain
  return w;
}

std::vector<int32_t> make_synthetic_prompt(int64_t n_tokens, int vocab_size, uint64_t seed) {
  using V = SyntheticTokens;
  PROTOKV_CHECK(n_tokens >= 16, "synthetic prompt needs at least 16 tokens, got {}", n_tokens);
  PROTOKV_CHECK(vocab_size > V::kFirstFiller + 16, "synthetic prompt needs a vocabulary above {}",
                V::kFirstFiller + 16);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> filler(V::kFirstFiller, vocab_size - 1);
  std::uniform_int_distribution<int32_t> value_token(V::kFirstValue,
                                                     V::kFirstValue + V::kNumValues - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  tokens[0] = V::kBos;
  for (int64_t i = 1; i < n_tokens; ++i) tokens[static_cast<size_t>(i)] = filler(rng);

  const int64_t n_pairs = std::clamp<int64_t>(n_tokens / 64, 1, V::kNumKeys / 2);
  const int64_t n_recalled = std::min<int64_t>(n_pairs, 4);
  const int64_t tail = 2 * n_recalled - 1;   // "k v k v ... k": ends on a key
  const int64_t body_end = n_tokens - tail;  // planted material lives in [1, body_end)

  // Motifs: 8 filler tokens repeated at three random places each (later ones may overwrite).
  constexpr int64_t kMotifLen = 8;
  const int64_t n_motifs = std::clamp<int64_t>(n_tokens / 128, 1, 8);
  if (body_end - 1 > kMotifLen) {
    std::uniform_int_distribution<int64_t> motif_start(1, body_end - kMotifLen);
    for (int64_t m = 0; m < n_motifs; ++m) {
      std::vector<int32_t> motif(kMotifLen);
      for (auto& t : motif) t = filler(rng);
      for (int rep = 0; rep < 3; ++rep) {
        std::copy(motif.begin(), motif.end(), tokens.begin() + motif_start(rng));
      }
    }
  }

  // Planted pairs after the motifs, so they survive.
  std::vector<int32_t> values(static_cast<size_t>(n_pairs));
  std::uniform_int_distribution<int64_t> pair_start(1, std::max<int64_t>(1, body_end - 2));
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int64_t p = pair_start(rng);
    values[static_cast<size_t>(i)] = value_token(rng);
    tokens[static_cast<size_t>(p)] = V::kFirstKey + static_cast<int32_t>(i);
    tokens[static_cast<size_t>(p + 1)] = values[static_cast<size_t>(i)];
  }

  // Tail: recall the last planted pairs, ending on a key whose value the model should look up.
  int64_t at = body_end;
  for (int64_t r = 0; r < n_recalled; ++r) {
    const int64_t i = n_pairs - n_recalled + r;
    tokens[static_cast<size_t>(at++)] = V::kFirstKey + static_cast<int32_t>(i);
    if (at < n_tokens) tokens[static_cast<size_t>(at++)] = values[static_cast<size_t>(i)];
  }
  return tokens;
}

LayerView SyntheticLayer::view(int layer, int n_layers) const {
  LayerView view;
  view.layer = layer;
  view.n_layers = n_layers;
  view.n_tokens = spec.n_tokens;
  view.head_dim = spec.head_dim;
  view.n_heads = spec.n_kv_heads * spec.group_size;
  view.n_kv_heads = spec.n_kv_heads;
  view.q = q.data();
  view.k = k.data();
  view.v = v.data();
  view.positions = positions.data();
  view.rope = {rope.inv_freq, rope.rot_dims, rope.neox};
  return view;
}

SyntheticLayer make_synthetic_layer(const SyntheticLayerSpec& spec) {
  PROTOKV_CHECK(spec.n_tokens >= 16 && spec.n_tokens <= (int64_t{1} << 24),
                "synthetic tensors: token count {} outside [16, 2^24]", spec.n_tokens);
  PROTOKV_CHECK(spec.n_kv_heads >= 1 && spec.n_kv_heads <= 256, "invalid KV head count {}",
                spec.n_kv_heads);
  PROTOKV_CHECK(spec.group_size >= 1 && spec.group_size <= 64, "invalid group size {}",
                spec.group_size);
  PROTOKV_CHECK(spec.head_dim >= 8 && spec.head_dim <= 1024 && spec.head_dim % 2 == 0,
                "invalid head dimension {} (even, 8..1024)", spec.head_dim);
  const int64_t n = spec.n_tokens, d = spec.head_dim;
  const int n_heads = spec.n_kv_heads * spec.group_size;
  SyntheticLayer out;
  out.spec = spec;
  out.q.resize(static_cast<size_t>(n_heads * n * d));
  out.k.resize(static_cast<size_t>(spec.n_kv_heads * n * d));
  out.v.resize(static_cast<size_t>(spec.n_kv_heads * n * d));
  out.positions.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) out.positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  out.rope = kernels::make_rope_table(spec.head_dim, spec.rope_theta, /*neox=*/false);

  constexpr int kClusters = 3;
  constexpr int kClusterSize = 6;
  constexpr float kDrift = 0.9f;  // correlation of consecutive keys
  const int64_t n_recent = std::min<int64_t>(64, n / 4);

  // Each KV head and its query group come from their own seed: the result does not depend on the
  // thread count.
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1)
  for (int h = 0; h < spec.n_kv_heads; ++h) {
    errors.run([&] {
      std::mt19937_64 rng(stream_seed(spec.seed, static_cast<uint64_t>(h)));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> mean(static_cast<size_t>(d)), step(static_cast<size_t>(d));
      for (auto& x : mean) x = normal(rng);
      std::uniform_int_distribution<int64_t> channel(0, d - 1);
      const int64_t outlier_a = channel(rng), outlier_b = channel(rng);

      float* k = out.k.data() + static_cast<int64_t>(h) * n * d;  // [n, d]
      float* v = out.v.data() + static_cast<int64_t>(h) * n * d;  // [n, d]
      std::vector<float> drift(static_cast<size_t>(d));
      for (auto& x : drift) x = normal(rng);
      const float innovation = std::sqrt(1.0f - kDrift * kDrift);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < d; ++c) {
          drift[static_cast<size_t>(c)] =
              kDrift * drift[static_cast<size_t>(c)] + innovation * normal(rng);
          k[t * d + c] = mean[static_cast<size_t>(c)] + drift[static_cast<size_t>(c)];
          v[t * d + c] = normal(rng);
        }
        k[t * d + outlier_a] += 8.0f;
        k[t * d + outlier_b] -= 6.0f;
      }
      // Sink: token 0 with a large norm.
      for (int64_t c = 0; c < d; ++c) k[c] = 6.0f * normal(rng);

      // Clusters: far-apart tokens sharing one direction.
      std::vector<float> centres(static_cast<size_t>(kClusters * d));
      for (auto& x : centres) x = normal(rng);
      std::uniform_int_distribution<int64_t> where(1, std::max<int64_t>(1, n - n_recent - 1));
      for (int m = 0; m < kClusters; ++m) {
        for (int j = 0; j < kClusterSize; ++j) {
          const int64_t t = where(rng);
          for (int64_t c = 0; c < d; ++c) {
            k[t * d + c] = 1.5f * centres[static_cast<size_t>(m * d + c)] + 0.3f * normal(rng);
          }
        }
      }

      // Queries: their own drift plus, for the last tokens (the observation window), a pull
      // towards one cluster's direction, so the window really looks for those tokens.
      for (int g = 0; g < spec.group_size; ++g) {
        const int qh = h * spec.group_size + g;
        float* q = out.q.data() + static_cast<int64_t>(qh) * n * d;  // [n, d]
        const float* centre = centres.data() + static_cast<int64_t>(qh % kClusters) * d;
        for (auto& x : drift) x = normal(rng);
        for (int64_t t = 0; t < n; ++t) {
          const bool recent = t >= n - n_recent;
          for (int64_t c = 0; c < d; ++c) {
            drift[static_cast<size_t>(c)] =
                kDrift * drift[static_cast<size_t>(c)] + innovation * normal(rng);
            q[t * d + c] = 0.5f * mean[static_cast<size_t>(c)] + drift[static_cast<size_t>(c)] +
                           (recent ? 0.5f * centre[c] : 0.0f);
          }
        }
        for (int64_t t = 0; t < n; ++t) {
          kernels::rope(q + t * d, 1, static_cast<int>(d), static_cast<int32_t>(t), spec.rope_theta,
                        false);
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        kernels::rope(k + t * d, 1, static_cast<int>(d), static_cast<int32_t>(t), spec.rope_theta,
                      false);
      }
    });
  }
  errors.rethrow();
  return out;
}

}  // namespace protokv::eval
