// SPDX-License-Identifier: Apache-2.0
#include "press/expected_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "kernels/kernels.h"
#include "kernels/serial_blas.h"
#include "protokv/error.h"

namespace protokv::press {

namespace {

// The coordinates RoPE turns together as pair i.
struct RopePair {
  int a;
  int b;
};

RopePair rope_pair(const RopeView& rope, int i) {
  return rope.neox ? RopePair{i, i + rope.rot_dims / 2} : RopePair{2 * i, 2 * i + 1};
}

// RoPE's rotation averaged over positions [first, first + count): pair i's 2x2 block is
// [[c, -s], [s, c]] with c, s the mean cosine and sine of position * inv_freq[i]
// (Expected Attention's average rotation, kvpress apply_avg_rope).
struct AverageRotation {
  std::vector<double> cos, sin;  // [rot_dims / 2]

  AverageRotation(const RopeView& rope, double first, int64_t count) {
    const size_t half = rope.inv_freq.size();
    cos.assign(half, 0.0);
    sin.assign(half, 0.0);
    for (size_t i = 0; i < half; ++i) {
      for (int64_t f = 0; f < count; ++f) {
        const double angle = (first + static_cast<double>(f)) * rope.inv_freq[i];
        cos[i] += std::cos(angle);
        sin[i] += std::sin(angle);
      }
      cos[i] /= static_cast<double>(count);
      sin[i] /= static_cast<double>(count);
    }
  }

  // x <- R x for one vector whose coordinates are `stride` apart.
  void apply(const RopeView& rope, double* x, int stride) const {
    for (size_t i = 0; i < cos.size(); ++i) {
      const RopePair p = rope_pair(rope, static_cast<int>(i));
      const double xa = x[p.a * stride], xb = x[p.b * stride];
      x[p.a * stride] = cos[i] * xa - sin[i] * xb;
      x[p.b * stride] = sin[i] * xa + cos[i] * xb;
    }
  }
};

// q <- R(position)^T q: a post-RoPE query back to its pre-RoPE coordinates (every rotation is
// orthogonal, so this is exact up to rounding).
void unrotate(const RopeView& rope, int32_t position, float* q) {
  for (size_t i = 0; i < rope.inv_freq.size(); ++i) {
    const RopePair p = rope_pair(rope, static_cast<int>(i));
    const double angle = static_cast<double>(position) * rope.inv_freq[i];
    const double c = std::cos(angle), s = std::sin(angle);
    const double qa = q[p.a], qb = q[p.b];
    q[p.a] = static_cast<float>(c * qa + s * qb);
    q[p.b] = static_cast<float>(-s * qa + c * qb);
  }
}

}  // namespace

void ExpectedAttentionScorer::add_config(nlohmann::json& out) const {
  out["sinks"] = options_.sinks;
  out["future"] = options_.future;
  out["covariance"] = options_.covariance;
  out["vnorm"] = options_.vnorm;
  out["epsilon"] = options_.epsilon;
  out["gqa"] = to_string(options_.gqa);
}

void ExpectedAttentionScorer::score(const LayerView& layer, int64_t window, LayerScores& out) {
  const RopeView& rope = layer.rope;
  if (rope.inv_freq.empty() || rope.rot_dims > layer.head_dim ||
      static_cast<int>(rope.inv_freq.size()) != rope.rot_dims / 2)
    fail("press 'expected_attention' needs the layer's RoPE (LayerView::rope), got {} pairs",
         rope.inv_freq.size());
  const int64_t n = layer.n_tokens;
  const int d = layer.head_dim;
  const int group = layer.group_size();
  const int64_t n_prefix = n - window;
  out.reset(layer.n_kv_heads, n_prefix, false, false);
  const int64_t sinks = std::min(options_.sinks, n);
  const int64_t m = n - sinks;  // keys scored = queries in the statistics
  if (m == 0) {                 // every entry is a sink
    std::fill(out.score.begin(), out.score.end(), 1.0f);
    return;
  }
  // The next `future` positions after the prompt's last one (kvpress: q_len .. q_len + n - 1).
  const AverageRotation rotation(rope, static_cast<double>(layer.positions[n - 1]) + 1.0,
                                 options_.future);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));

  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    errors.run([&] {
      const kernels::SerialBlasScope serial_blas;
      // Reused per thread; every entry is written before it is read.
      thread_local std::vector<float> centred, covariance, mapped, mu, probs, reduced;
      thread_local std::vector<double> mean, sigma;
      centred.resize(static_cast<size_t>(m * d));
      probs.resize(static_cast<size_t>(group * m));
      reduced.resize(static_cast<size_t>(m));
      const float* keys = layer.k_head(h) + sinks * d;  // [m, d]
      for (int g = 0; g < group; ++g) {
        const float* q = layer.q_head(h * group + g);
        // Pre-RoPE queries of tokens [sinks, n) and their mean (kvpress drops the sinks' hidden
        // states: outliers).
        mean.assign(static_cast<size_t>(d), 0.0);
        for (int64_t t = 0; t < m; ++t) {
          float* row = centred.data() + t * d;
          std::copy(q + (sinks + t) * d, q + (sinks + t + 1) * d, row);
          unrotate(rope, layer.positions[sinks + t], row);
          for (int c = 0; c < d; ++c) mean[static_cast<size_t>(c)] += row[c];
        }
        for (double& x : mean) x /= static_cast<double>(m);
        float* logits = probs.data() + static_cast<int64_t>(g) * m;
        if (options_.covariance) {
          // Sigma = (1/m) sum (q - mean)(q - mean)^T over the pre-RoPE queries (kvpress divides by
          // the count, not count - 1), then Sigma' = R Sigma R^T.
          for (int64_t t = 0; t < m; ++t)
            for (int c = 0; c < d; ++c)
              centred[static_cast<size_t>(t * d + c)] -=
                  static_cast<float>(mean[static_cast<size_t>(c)]);
          covariance.resize(static_cast<size_t>(d * d));
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, static_cast<int>(m),
                      1.0f / static_cast<float>(m), centred.data(), d, centred.data(), d, 0.0f,
                      covariance.data(), d);
          sigma.assign(covariance.begin(), covariance.end());
          for (int c = 0; c < d; ++c) rotation.apply(rope, sigma.data() + c, d);  // columns: R S
          for (int r = 0; r < d; ++r) rotation.apply(rope, sigma.data() + r * d, 1);  // rows: S R^T
          std::copy(sigma.begin(), sigma.end(), covariance.begin());
        }
        // mu' = R mean; logits = K mu' / sqrt(d), one mat-vec over the keys.
        rotation.apply(rope, mean.data(), 1);
        mu.assign(mean.begin(), mean.end());
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(m), d, inv_sqrt_d, keys, d,
                    mu.data(), 1, 0.0f, logits, 1);
        if (options_.covariance) {
          // + k^T Sigma' k / (2d): mapped = K Sigma' ([m, d]), then one dot per key.
          mapped.resize(static_cast<size_t>(m * d));
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), d, d, 1.0f,
                      keys, d, covariance.data(), d, 0.0f, mapped.data(), d);
          const float inv_2d = 0.5f / static_cast<float>(d);
          for (int64_t j = 0; j < m; ++j)
            logits[j] += inv_2d * kernels::dot(mapped.data() + j * d, keys + j * d, d);
        }
        kernels::softmax(logits, m);
      }
      reduce_group(probs.data(), group, m, options_.gqa, reduced.data());
      if (options_.vnorm) {
        const float* values = layer.v_head(h) + sinks * d;
        const auto epsilon = static_cast<float>(options_.epsilon);
        for (int64_t j = 0; j < m; ++j) {
          const float* v = values + j * d;
          reduced[static_cast<size_t>(j)] =
              (reduced[static_cast<size_t>(j)] + epsilon) * std::sqrt(kernels::dot(v, v, d));
        }
      }
      float* score = out.head_score(h);
      for (int64_t j = sinks; j < n_prefix; ++j) score[j] = reduced[static_cast<size_t>(j - sinks)];
    });
  }
  errors.rethrow();
  // The sinks outrank every scored entry of the layer (kvpress pads them with the layer's maximum
  // score + 1), so that a global allocator (adakv) also keeps them in every head.
  float top = -std::numeric_limits<float>::infinity();
  for (int h = 0; h < layer.n_kv_heads; ++h)
    for (int64_t j = sinks; j < n_prefix; ++j) top = std::max(top, out.head_score(h)[j]);
  if (!std::isfinite(top)) top = 0.0f;
  for (int h = 0; h < layer.n_kv_heads; ++h)
    std::fill(out.head_score(h), out.head_score(h) + std::min(sinks, n_prefix), top + 1.0f);
}

const PressEntry kExpectedAttentionEntry{
    .name = "expected_attention",
    .allocator_role = AllocatorRole::Composes,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "score = E[attention of a future query] * ||v|| (Expected Attention, as kvpress's\n"
              "ExpectedAttentionPress): the prompt's pre-RoPE queries (after the sinks) give a\n"
              "mean and covariance, rotated by RoPE averaged over the next `future` positions;\n"
              "softmax over the keys of mu.k/sqrt(d) + k^T Sigma k/(2d), mean over the query\n"
              "heads of the KV head, times (p + epsilon) ||v||. Query-agnostic: the same cache\n"
              "whatever question follows.\n");
        },
    .options =
        [] {
          constexpr int64_t kLarge = int64_t{1} << 30;
          const ExpectedAttentionOptions o;
          return std::vector<OptionSpec>{
              int_option("sinks", o.sinks, 0, kLarge,
                         "the first tokens: always kept and left out of the query statistics "
                         "(kvpress n_sink)"),
              int_option("future", o.future, 1, int64_t{1} << 20,
                         "the positions after the prompt RoPE's rotation is averaged over "
                         "(kvpress n_future_positions)"),
              bool_option("covariance", o.covariance,
                          "add the k^T Sigma k / (2d) term (kvpress use_covariance)"),
              bool_option("vnorm", o.vnorm, "score = (p + epsilon) ||v|| (kvpress use_vnorm)"),
              double_option("epsilon", o.epsilon, 0.0, 1e6, "added to p before the value norm"),
              gqa_option_spec(),
              int_option("window", 0, 0, kLarge,
                         "the last w tokens, always kept (kvpress keeps no window)"),
          };
        },
    .make = [](const PressEntry& entry, OptionReader& options,
               const AllocatorConfig& allocator) -> std::unique_ptr<Press> {
      ExpectedAttentionOptions o;
      o.sinks = options.get_int("sinks");
      o.future = options.get_int("future");
      o.covariance = options.get_bool("covariance");
      o.vnorm = options.get_bool("vnorm");
      o.epsilon = options.get_double("epsilon");
      o.gqa = read_gqa_option(options);
      const int64_t window = options.get_int("window");
      return std::make_unique<ScoringPress>(
          std::string(entry.name), std::make_unique<ExpectedAttentionScorer>(o), window, allocator);
    },
};

}  // namespace protokv::press
