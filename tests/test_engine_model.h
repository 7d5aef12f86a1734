// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test helpers for the engine: random-weight models from the library's builder, held in memory in
// any dtype, a llama2.c checkpoint writer, and a naive reference forward pass written with plain
// loops (full recompute, double accumulation) that shares no code with the engine's kernels.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/random_model.h"
#include "model/tensor_table.h"
#include "protokv/dtype.h"
#include "protokv/model.h"

namespace protokv::testing {

// The small GQA shape most model tests use (2 layers, 4 query / 2 KV heads of 16, vocabulary 300),
// with `architecture`'s RoPE order; tests override what they need.
inline ModelConfig tiny_config(std::string_view architecture = "llama") {
  ModelConfig c;
  c.architecture = std::string(architecture);
  c.rope_neox = architecture_rope_neox(architecture);
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 300;
  c.context_length = 128;
  c.rope_theta = 500000.0f;
  c.norm_eps = 1e-6f;
  return c;
}

struct RandomModelSpec {
  int dim = 64;
  int hidden_dim = 96;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;
  int vocab_size = 300;
  int context_length = 256;
  bool shared_classifier = false;
  bool rope_neox = false;
  bool biases = false;
  DType type = DType::F32;  // matrices; norms and biases stay F32
  uint64_t seed = 1234;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  // Token embeddings have the standard deviation of Uniform(-scale, scale), scale/sqrt(3). A small
  // scale puts the first RMSNorm's mean square near norm_eps, so that a wrong epsilon shows.
  float embedding_scale = 1.0f;
};

// Owns the F32 master values of every tensor so tests can write the same model in other forms.
struct RandomModel {
  ModelWeights weights;
  // F32 values before conversion to `type`, in llama2.c order (for the checkpoint writer).
  std::vector<float> token_embd, output, output_norm;
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down, bq, bk, bv;
  };
  std::vector<Layer> layers;
};

// Converts `values` [rows, cols] to `type` in an owned buffer kept alive by `storage`.
inline WeightMatrix make_matrix(const std::vector<float>& values, int64_t rows, int64_t cols,
                                DType type, std::vector<std::shared_ptr<const void>>& storage) {
  const size_t row_bytes = dtype_row_bytes(type, cols);
  auto buffer = std::make_shared<std::vector<unsigned char>>(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, values.data() + r * cols,
                 buffer->data() + static_cast<size_t>(r) * row_bytes, cols);
  WeightMatrix w;
  w.type = type;
  w.data = buffer->data();
  w.rows = rows;
  w.cols = cols;
  storage.push_back(std::shared_ptr<const void>(buffer, buffer->data()));
  return w;
}

// The weights come from the library's one random-model builder (random_model_weights, which
// walks the tensor table); this keeps their F32 values and converts the matrices to `spec.type`.
inline RandomModel make_random_model(const RandomModelSpec& spec) {
  RandomModel m;
  ModelConfig& c = m.weights.config;
  c.dim = spec.dim;
  c.hidden_dim = spec.hidden_dim;
  c.n_layers = spec.n_layers;
  c.n_heads = spec.n_heads;
  c.n_kv_heads = spec.n_kv_heads;
  c.vocab_size = spec.vocab_size;
  c.context_length = spec.context_length;
  c.rope_neox = spec.rope_neox;
  c.shared_classifier = spec.shared_classifier;
  c.rope_theta = spec.rope_theta;
  c.norm_eps = spec.norm_eps;
  RandomWeightsOptions options;
  options.with_optional = spec.biases;
  options.norm_jitter = 0.2f / std::sqrt(3.0f);  // the spread of Uniform(0.8, 1.2)
  const ModelWeights f32 = random_model_weights(c, spec.seed, options);

  auto values_of = [](const WeightMatrix& w) {
    const auto* data = static_cast<const float*>(w.data);
    return std::vector<float>(data, data + w.rows * w.cols);
  };
  auto vector_of = [](const float* data, int64_t n) {
    return data == nullptr ? std::vector<float>{} : std::vector<float>(data, data + n);
  };
  const int64_t dim = c.dim, hidden = c.hidden_dim, q_dim = dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim();
  auto& storage = m.weights.storage;

  m.token_embd = values_of(f32.token_embd);
  // Standard deviation embedding_scale / sqrt(3), that of Uniform(-scale, scale).
  for (float& x : m.token_embd) x *= spec.embedding_scale / std::sqrt(3.0f);
  m.weights.token_embd = make_matrix(m.token_embd, c.vocab_size, dim, spec.type, storage);
  for (const LayerWeights& f : f32.layers) {
    RandomModel::Layer L;
    L.attn_norm = vector_of(f.attn_norm, dim);
    L.wq = values_of(f.wq);
    L.wk = values_of(f.wk);
    L.wv = values_of(f.wv);
    L.wo = values_of(f.wo);
    L.ffn_norm = vector_of(f.ffn_norm, dim);
    L.w_gate = values_of(f.w_gate);
    L.w_up = values_of(f.w_up);
    L.w_down = values_of(f.w_down);
    L.bq = vector_of(f.bq, q_dim);
    L.bk = vector_of(f.bk, kv_dim);
    L.bv = vector_of(f.bv, kv_dim);
    m.layers.push_back(std::move(L));
  }
  m.output_norm = vector_of(f32.output_norm, dim);
  if (!spec.shared_classifier) m.output = values_of(f32.output);

  // Pointers into the vectors of `m.layers` stay valid: the vector is not resized after this.
  for (auto& L : m.layers) {
    LayerWeights lw;
    lw.attn_norm = L.attn_norm.data();
    lw.wq = make_matrix(L.wq, q_dim, dim, spec.type, storage);
    lw.wk = make_matrix(L.wk, kv_dim, dim, spec.type, storage);
    lw.wv = make_matrix(L.wv, kv_dim, dim, spec.type, storage);
    lw.wo = make_matrix(L.wo, dim, q_dim, spec.type, storage);
    lw.ffn_norm = L.ffn_norm.data();
    lw.w_gate = make_matrix(L.w_gate, hidden, dim, spec.type, storage);
    lw.w_up = make_matrix(L.w_up, hidden, dim, spec.type, storage);
    lw.w_down = make_matrix(L.w_down, dim, hidden, spec.type, storage);
    if (spec.biases) {
      lw.bq = L.bq.data();
      lw.bk = L.bk.data();
      lw.bv = L.bv.data();
    }
    m.weights.layers.push_back(lw);
  }
  m.weights.output_norm = m.output_norm.data();
  m.weights.output = spec.shared_classifier
                         ? m.weights.token_embd
                         : make_matrix(m.output, c.vocab_size, dim, spec.type, storage);
  return m;
}

// Writes `m` (F32 values) as a llama2.c legacy checkpoint, in run.c's memory_map_weights order.
// `rope_table_floats` per table: seq_len * head_dim / 2 (the loader skips them).
inline void write_llama2c(const RandomModel& m, const std::filesystem::path& path) {
  const ModelConfig& c = m.weights.config;
  std::ofstream out(path, std::ios::binary);
  const int32_t vocab = c.shared_classifier ? c.vocab_size : -c.vocab_size;
  const int32_t header[7] = {c.dim,        c.hidden_dim, c.n_layers,      c.n_heads,
                             c.n_kv_heads, vocab,        c.context_length};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  auto put = [&](const std::vector<float>& v) {
    out.write(reinterpret_cast<const char*>(v.data()),
              static_cast<std::streamsize>(v.size() * sizeof(float)));
  };
  auto put_stacked = [&](std::vector<float> RandomModel::Layer::*field) {
    for (const auto& L : m.layers) put(L.*field);
  };
  put(m.token_embd);
  put_stacked(&RandomModel::Layer::attn_norm);
  put_stacked(&RandomModel::Layer::wq);
  put_stacked(&RandomModel::Layer::wk);
  put_stacked(&RandomModel::Layer::wv);
  put_stacked(&RandomModel::Layer::wo);
  put_stacked(&RandomModel::Layer::ffn_norm);
  put_stacked(&RandomModel::Layer::w_gate);  // w1
  put_stacked(&RandomModel::Layer::w_down);  // w2
  put_stacked(&RandomModel::Layer::w_up);    // w3
  put(m.output_norm);
  // freq_cis_real and freq_cis_imag: content irrelevant to the loader, filled with a marker.
  put(std::vector<float>(static_cast<size_t>(c.context_length) * c.head_dim(), 7.0f));
  if (!c.shared_classifier) put(m.output);
}

// Which cached prompt entries a decode query may see: (layer, kv_head, position) -> kept?, and
// the log-weight of a kept entry.
struct CacheVisibility {
  std::function<bool(int, int, int)> kept = [](int, int, int) { return true; };
  std::function<double(int, int, int)> log_weight = [](int, int, int) { return 0.0; };
  // When set, replaces `kept` for every earlier entry, decoded ones included, as seen by the
  // decode query at `query` (layer, kv_head, position): a press that also evicts during decode
  // changes what each later step sees.
  std::function<bool(int query, int layer, int kv_head, int position)> kept_by_query;
};

// Post-RoPE queries and keys, and values, of every layer as the reference computes them (double):
// q[layer][token] is [n_heads * head_dim], k and v [n_kv_heads * head_dim], token-major.
struct ReferenceTensors {
  std::vector<std::vector<std::vector<double>>> q, k, v;
};

// Naive forward pass over `tokens` (positions 0..n-1), returning the logits of the last token.
// Tokens [0, n_prompt) form the prompt: they attend causally over each other in full; later
// tokens see only the prompt entries `visibility` keeps (plus every later token), as a decode
// step over a compressed cache does. With `tensors`, also returns every layer's Q/K/V.
inline std::vector<float> reference_logits(const ModelWeights& w,
                                           const std::vector<int32_t>& tokens,
                                           int64_t n_prompt = -1,
                                           const CacheVisibility& visibility = {},
                                           ReferenceTensors* tensors = nullptr) {
  const ModelConfig& c = w.config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n_prompt < 0) n_prompt = n;
  const int dim = c.dim, hd = c.head_dim(), group = c.n_heads / c.n_kv_heads;
  auto row_f32 = [](const WeightMatrix& m, int64_t r) {
    std::vector<float> row(static_cast<size_t>(m.cols));
    dequantize_row(m.type, m.row(r), row.data(), m.cols);
    return row;
  };
  auto matvec = [&](const WeightMatrix& m, const std::vector<double>& x, const float* bias) {
    std::vector<double> y(static_cast<size_t>(m.rows));
    for (int64_t r = 0; r < m.rows; ++r) {
      const auto row = row_f32(m, r);
      double sum = bias ? bias[r] : 0.0;
      for (int64_t i = 0; i < m.cols; ++i) sum += static_cast<double>(row[i]) * x[i];
      y[static_cast<size_t>(r)] = sum;
    }
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const float* weight) {
    double ss = 0.0;
    for (double v : x) ss += v * v;
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.norm_eps);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * weight[i];
    return out;
  };
  auto rope = [&](std::vector<double>& v, int heads, int64_t pos) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const double freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / hd);
        const double angle = static_cast<double>(pos) * freq;
        const int a = h * hd + (c.rope_neox ? i : 2 * i);
        const int b = h * hd + (c.rope_neox ? i + hd / 2 : 2 * i + 1);
        const double x0 = v[static_cast<size_t>(a)], x1 = v[static_cast<size_t>(b)];
        v[static_cast<size_t>(a)] = x0 * std::cos(angle) - x1 * std::sin(angle);
        v[static_cast<size_t>(b)] = x0 * std::sin(angle) + x1 * std::cos(angle);
      }
  };

  std::vector<std::vector<double>> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto row = row_f32(w.token_embd, tokens[static_cast<size_t>(i)]);
    x[static_cast<size_t>(i)].assign(row.begin(), row.end());
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    std::vector<std::vector<double>> q(static_cast<size_t>(n)), k(q), v(q);
    for (int64_t i = 0; i < n; ++i) {
      const auto xb = rmsnorm(x[static_cast<size_t>(i)], lw.attn_norm);
      q[static_cast<size_t>(i)] = matvec(lw.wq, xb, lw.bq);
      k[static_cast<size_t>(i)] = matvec(lw.wk, xb, lw.bk);
      v[static_cast<size_t>(i)] = matvec(lw.wv, xb, lw.bv);
      rope(q[static_cast<size_t>(i)], c.n_heads, i);
      rope(k[static_cast<size_t>(i)], c.n_kv_heads, i);
    }
    if (tensors != nullptr) {
      tensors->q.push_back(q);
      tensors->k.push_back(k);
      tensors->v.push_back(v);
    }
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> att(static_cast<size_t>(dim), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> logits;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= i; ++j) {
          double extra = 0.0;
          if (visibility.kept_by_query && i >= n_prompt && j < i &&
              !visibility.kept_by_query(static_cast<int>(i), l, kvh, static_cast<int>(j)))
            continue;
          if (i >= n_prompt && j < n_prompt) {
            if (!visibility.kept_by_query && !visibility.kept(l, kvh, static_cast<int>(j)))
              continue;
            extra = visibility.log_weight(l, kvh, static_cast<int>(j));
          }
          double dot = 0.0;
          for (int d = 0; d < hd; ++d)
            dot += q[static_cast<size_t>(i)][static_cast<size_t>(h * hd + d)] *
                   k[static_cast<size_t>(j)][static_cast<size_t>(kvh * hd + d)];
          logits.push_back(dot / std::sqrt(static_cast<double>(hd)) + extra);
          keys.push_back(j);
        }
        double max_logit = -1e300, total = 0.0;
        for (double z : logits) max_logit = std::max(max_logit, z);
        for (double& z : logits) total += (z = std::exp(z - max_logit));
        for (size_t t = 0; t < keys.size(); ++t)
          for (int d = 0; d < hd; ++d)
            att[static_cast<size_t>(h * hd + d)] +=
                logits[t] / total *
                v[static_cast<size_t>(keys[t])][static_cast<size_t>(kvh * hd + d)];
      }
      const auto proj = matvec(lw.wo, att, nullptr);
      for (int d = 0; d < dim; ++d)
        x[static_cast<size_t>(i)][static_cast<size_t>(d)] += proj[static_cast<size_t>(d)];
      const auto xb = rmsnorm(x[static_cast<size_t>(i)], lw.ffn_norm);
      auto gate = matvec(lw.w_gate, xb, nullptr);
      const auto up = matvec(lw.w_up, xb, nullptr);
      for (size_t t = 0; t < gate.size(); ++t)
        gate[t] = gate[t] / (1.0 + std::exp(-gate[t])) * up[t];
      const auto down = matvec(lw.w_down, gate, nullptr);
      for (int d = 0; d < dim; ++d)
        x[static_cast<size_t>(i)][static_cast<size_t>(d)] += down[static_cast<size_t>(d)];
    }
  }
  const auto last = rmsnorm(x[static_cast<size_t>(n - 1)], w.output_norm);
  const auto logits = matvec(w.output, last, nullptr);
  return std::vector<float>(logits.begin(), logits.end());
}

}  // namespace protokv::testing
