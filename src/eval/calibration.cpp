// SPDX-License-Identifier: Apache-2.0
#include "eval/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "protokv/engine.h"
#include "protokv/error.h"

namespace protokv::eval {
namespace {

// Copies every query head's attention weights of the decoded rows into the capture.
class AttentionRecorder final : public DecodeObserver {
 public:
  AttentionRecorder(CalibrationCapture& capture, int n_heads)
      : capture_(capture), n_heads_(n_heads) {}
  bool wants_probabilities() const override { return true; }
  void on_decode(const DecodeStep& step) override {
    const int64_t row = step.position - (capture_.tokens - capture_.rows);
    PROTOKV_CHECK(row >= 0 && row < capture_.rows, "calibrate: unexpected decode position {}",
                  step.position);
    auto& layer = capture_.attention[static_cast<size_t>(step.layer)];
    for (int h = 0; h < n_heads_; ++h) {
      const std::span<const float> probs = step.probs(h);
      PROTOKV_CHECK(static_cast<int64_t>(probs.size()) == step.position + 1,
                    "calibrate: layer {} head {} attended {} entries at position {} (full cache "
                    "expected)",
                    step.layer, h, probs.size(), step.position);
      std::copy(probs.begin(), probs.end(),
                layer[static_cast<size_t>(h)].begin() + row * capture_.tokens);
    }
  }

 private:
  CalibrationCapture& capture_;
  int n_heads_;
};

}  // namespace

CalibrationCapture capture_calibration_sequence(const ModelWeights& weights,
                                                std::span<const int32_t> tokens, int64_t rows) {
  const ModelConfig& c = weights.config;
  const auto n = static_cast<int64_t>(tokens.size());
  PROTOKV_CHECK(rows >= 1 && rows < n,
                "calibrate: a sequence of {} tokens cannot give the attention rows of its last {} "
                "queries (need more tokens than rows)",
                n, rows);
  CalibrationCapture capture;
  capture.tokens = n;
  capture.rows = rows;
  capture.attention.assign(
      static_cast<size_t>(c.n_layers),
      std::vector<std::vector<float>>(static_cast<size_t>(c.n_heads),
                                      std::vector<float>(static_cast<size_t>(rows * n), 0.0f)));
  Session session(weights);  // no press: the full cache
  AttentionRecorder recorder(capture, c.n_heads);
  session.prefill(tokens.first(static_cast<size_t>(n - rows)));
  session.set_observer(&recorder);
  for (int64_t i = n - rows; i < n; ++i) session.decode(tokens[static_cast<size_t>(i)]);

  const int hd = c.head_dim();
  capture.keys.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    for (const HeadCache& head : session.cache().layer(l).heads) {
      PROTOKV_CHECK(head.size() == n, "calibrate: the full cache holds {} of {} entries",
                    head.size(), n);
      std::vector<float> keys(static_cast<size_t>(n * hd));
      head.read_keys(0, n, keys.data());
      capture.keys[static_cast<size_t>(l)].push_back(std::move(keys));
    }
  }
  return capture;
}

void validate_calibration_options(const CalibrationOptions& o) {
  PROTOKV_CHECK(o.chelsea_threshold >= -1.0 && o.chelsea_threshold <= 1.0,
                "--chelsea-threshold must be a cosine similarity in [-1, 1], got {}",
                o.chelsea_threshold);
  PROTOKV_CHECK(o.outlier_fraction >= 0.0 && o.outlier_fraction <= 1.0,
                "--outlier-fraction must be in [0, 1], got {}", o.outlier_fraction);
  PROTOKV_CHECK(o.pod_delta >= 0.0 && o.pod_delta <= 1.0,
                "--pod-delta must be a similarity in [0, 1], got {}", o.pod_delta);
  PROTOKV_CHECK(o.pod_rows >= 1, "--pod-rows must be at least 1, got {}", o.pod_rows);
}

std::vector<std::vector<float>> unlinked_shares(const CalibrationCapture& capture, int head_dim,
                                                const CalibrationOptions& options) {
  std::vector<std::vector<float>> shares;
  for (const auto& layer : capture.keys) {
    shares.emplace_back();
    for (const auto& keys : layer)
      shares.back().push_back(static_cast<float>(
          press::chelsea_unlinked_share(keys.data(), capture.tokens, head_dim,
                                        options.chelsea_layout, options.chelsea_threshold)));
  }
  return shares;
}

std::vector<std::vector<double>> pod_similarities(const CalibrationCapture& capture,
                                                  int n_kv_heads) {
  const auto n_layers = static_cast<int>(capture.attention.size());
  const auto n_heads = n_layers == 0 ? 0 : static_cast<int>(capture.attention[0].size());
  const int group = n_heads / n_kv_heads;
  std::vector<std::vector<double>> similarity(
      static_cast<size_t>(n_kv_heads), std::vector<double>(static_cast<size_t>(n_layers) * n_layers,
                                                           1.0));  // 1 on the diagonal
  for (int kv = 0; kv < n_kv_heads; ++kv)
    for (int i = 0; i < n_layers; ++i)
      for (int j = 0; j < i; ++j) {
        // PoD compares one head's attention across layers; a KV head stands for its group of
        // query heads, so its similarity is their mean.
        double sum = 0.0;
        for (int q = kv * group; q < (kv + 1) * group; ++q)
          sum += press::attention_similarity(
              capture.attention[static_cast<size_t>(i)][static_cast<size_t>(q)],
              capture.attention[static_cast<size_t>(j)][static_cast<size_t>(q)], capture.rows,
              capture.tokens);
        const double mean = sum / group;
        auto& m = similarity[static_cast<size_t>(kv)];
        m[static_cast<size_t>(i * n_layers + j)] = mean;
        m[static_cast<size_t>(j * n_layers + i)] = mean;
      }
  return similarity;
}

press::CalibrationProfile calibrate(const ModelWeights& weights,
                                    const std::vector<std::vector<int32_t>>& sequences,
                                    const CalibrationOptions& options,
                                    const std::function<void(size_t, size_t)>& progress) {
  validate_calibration_options(options);
  PROTOKV_CHECK(!sequences.empty(), "calibrate: no calibration sequence");
  const ModelConfig& c = weights.config;
  const size_t layers = static_cast<size_t>(c.n_layers);
  const size_t kv_heads = static_cast<size_t>(c.n_kv_heads);
  press::CalibrationProfile p;
  p.n_layers = c.n_layers;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim();
  p.samples = static_cast<int64_t>(sequences.size());
  p.tokens = static_cast<int64_t>(sequences[0].size());
  p.chelsea_threshold = options.chelsea_threshold;
  p.chelsea_fraction = options.outlier_fraction;
  p.chelsea_layout = options.chelsea_layout;
  p.pod_delta = options.pod_delta;
  p.pod_rows = options.pod_rows;

  std::vector<std::vector<double>> share_sum(layers, std::vector<double>(kv_heads, 0.0));
  std::vector<std::vector<double>> similarity_sum(kv_heads,
                                                  std::vector<double>(layers * layers, 0.0));
  for (size_t s = 0; s < sequences.size(); ++s) {
    PROTOKV_CHECK(static_cast<int64_t>(sequences[s].size()) == p.tokens,
                  "calibrate: sequences must share one length ({} and {} tokens)", p.tokens,
                  sequences[s].size());
    const CalibrationCapture capture =
        capture_calibration_sequence(weights, sequences[s], options.pod_rows);
    const auto shares = unlinked_shares(capture, p.head_dim, options);
    const auto similarity = pod_similarities(capture, c.n_kv_heads);
    for (size_t l = 0; l < layers; ++l)
      for (size_t h = 0; h < kv_heads; ++h) share_sum[l][h] += shares[l][h];
    for (size_t h = 0; h < kv_heads; ++h)
      for (size_t e = 0; e < layers * layers; ++e) similarity_sum[h][e] += similarity[h][e];
    if (progress) progress(s + 1, sequences.size());
  }

  const auto count = static_cast<double>(sequences.size());
  p.chelsea_unlinked_share.assign(layers, std::vector<float>(kv_heads, 0.0f));
  for (size_t l = 0; l < layers; ++l)
    for (size_t h = 0; h < kv_heads; ++h)
      p.chelsea_unlinked_share[l][h] = static_cast<float>(share_sum[l][h] / count);
  p.chelsea_outlier =
      press::chelsea_outlier_heads(p.chelsea_unlinked_share, options.outlier_fraction);

  p.pod_similarity.assign(kv_heads, std::vector<double>(layers * layers, 1.0));
  for (size_t h = 0; h < kv_heads; ++h) {
    for (size_t i = 0; i < layers; ++i)
      for (size_t j = 0; j < layers; ++j)
        if (i != j)  // the same sum in both orders: the mean stays symmetric
          p.pod_similarity[h][i * layers + j] =
              std::clamp(similarity_sum[h][i * layers + j] / count, 0.0, 1.0);
    const auto& m = p.pod_similarity[h];
    p.pod_block_start.push_back(press::pod_block_starts(
        c.n_layers,
        [&](int a, int b) { return m[static_cast<size_t>(a) * layers + static_cast<size_t>(b)]; },
        options.pod_delta));
  }
  return p;
}

int64_t pod_shared_key_bytes_per_token(const press::CalibrationProfile& profile) {
  int64_t shared = 0;
  for (const auto& starts : profile.pod_block_start)
    for (size_t l = 0; l < starts.size(); ++l)
      if (starts[l] != static_cast<int>(l)) ++shared;
  return shared * profile.head_dim * static_cast<int64_t>(sizeof(float));
}

std::string calibration_summary(const press::CalibrationProfile& p) {
  std::string out;
  const int64_t heads = static_cast<int64_t>(p.n_layers) * p.n_kv_heads;
  std::vector<std::string> outliers;
  float lo = 1.0f, hi = 0.0f;
  double sum = 0.0;
  for (int l = 0; l < p.n_layers; ++l)
    for (int h = 0; h < p.n_kv_heads; ++h) {
      const float share = p.chelsea_unlinked_share[static_cast<size_t>(l)][static_cast<size_t>(h)];
      lo = std::min(lo, share);
      hi = std::max(hi, share);
      sum += share;
      if (p.chelsea_outlier[static_cast<size_t>(l)][static_cast<size_t>(h)] != 0)
        outliers.push_back(fmt::format("L{}H{} ({:.3f})", l, h, share));
    }
  out += fmt::format(
      "chelsea: unlinked share (links with cosine < {:g}) mean {:.3f}, min {:.3f}, max {:.3f} over "
      "{} (layer, KV head)\n",
      p.chelsea_threshold, sum / static_cast<double>(heads), lo, hi, heads);
  out += fmt::format(
      "chelsea: {} outlier head(s) (top {:g}%) keep the full cache: {}\n", outliers.size(),
      p.chelsea_fraction * 100.0,
      outliers.empty() ? std::string("none") : fmt::format("{}", fmt::join(outliers, ", ")));
  int64_t blocks_total = 0;
  for (int h = 0; h < p.n_kv_heads; ++h) {
    const auto& starts = p.pod_block_start[static_cast<size_t>(h)];
    std::vector<std::string> blocks;
    for (int l = 0; l < p.n_layers; ++l) {
      if (starts[static_cast<size_t>(l)] != l) continue;
      int end = l;
      while (end + 1 < p.n_layers && starts[static_cast<size_t>(end + 1)] == l) ++end;
      blocks.push_back(end == l ? fmt::format("{}", l) : fmt::format("{}-{}", l, end));
    }
    blocks_total += static_cast<int64_t>(blocks.size());
    out += fmt::format("pod: KV head {}: {} block(s) of layers [{}]\n", h, blocks.size(),
                       fmt::join(blocks, "] ["));
  }
  const int64_t saved = pod_shared_key_bytes_per_token(p);
  const int64_t kv_per_token = heads * p.head_dim * 2 * static_cast<int64_t>(sizeof(float));
  out += fmt::format(
      "pod: at delta {:g}, {} blocks for {} (layer, KV head): {} key bytes of {} K+V bytes per "
      "distant token not stored ({:.1f}%, F32 cache)\n",
      p.pod_delta, blocks_total, heads, saved, kv_per_token,
      100.0 * static_cast<double>(saved) / static_cast<double>(kv_per_token));
  return out;
}

}  // namespace protokv::eval
