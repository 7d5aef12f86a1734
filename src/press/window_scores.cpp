// SPDX-License-Identifier: Apache-2.0
#include "protokv/press/window_scores.h"
#include "core/parallel.h"

#include <nlohmann/json.hpp>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/serial_blas.h"
#include "protokv/error.h"
#include "protokv/press/options.h"
#include "protokv/press/scores.h"

namespace protokv::press {

OptionSpec window_option_spec() {
  return int_option("window", WindowScoreConfig::kDefaultWindow, 1, 4096,
                    "observation window w: the last w prompt queries score the prefix, and the "
                    "last w tokens are always kept (inside the budget)",
                    "SnapKV Eq. 4");
}

OptionSpec gqa_option_spec() {
  return choice_option("gqa", "mean", {"mean", "max", "sum"},
                       "how the query heads of a KV head reduce their scores (selection is per KV "
                       "head, so memory really shrinks)");
}

std::vector<OptionSpec> window_score_option_specs(int default_pool) {
  return {
      window_option_spec(),
      int_option("pool", default_pool, 1, 1023,
                 "odd pooling kernel along the sequence (stride 1, padding pool/2); 1 = none",
                 "SnapKV Eq. 5"),
      choice_option("pool_type", "max", {"max", "avg"},
                    "max pads with -inf; avg zero-pads and divides by pool"),
      gqa_option_spec(),
      choice_option("gqa_order", "pool_first", {"pool_first", "reduce_first"},
                    "pool each query head, then reduce (as kvpress does), or reduce the group, "
                    "then pool (FFY0/AdaKV, KVCache-Factory's kv_head mode)"),
  };
}

WindowScoreConfig read_window_score_options(OptionReader& options) {
  WindowScoreConfig config;
  config.window = read_window_option(options);
  config.pool = static_cast<int>(options.get_int("pool"));
  if (config.pool % 2 == 0)
    fail(
        "press '{}': option pool={} must be odd (stride-1 pooling with padding pool/2 keeps the "
        "length)",
        options.press(), config.pool);
  config.pool_type = options.get_choice("pool_type") == "max" ? PoolType::Max : PoolType::Avg;
  config.gqa = read_gqa_option(options);
  config.gqa_order =
      options.get_choice("gqa_order") == "pool_first" ? GqaOrder::PoolFirst : GqaOrder::ReduceFirst;
  return config;
}

int64_t read_window_option(OptionReader& options) {
  return options.get_int("window");
}

GqaReduce read_gqa_option(OptionReader& options) {
  const std::string gqa = options.get_choice("gqa");
  if (gqa == "max") return GqaReduce::Max;
  if (gqa == "sum") return GqaReduce::Sum;
  return GqaReduce::Mean;
}

std::string to_string(PoolType type) {
  return type == PoolType::Max ? "max" : "avg";
}

std::string to_string(GqaReduce reduce) {
  switch (reduce) {
    case GqaReduce::Max:
      return "max";
    case GqaReduce::Sum:
      return "sum";
    case GqaReduce::Mean:
      break;
  }
  return "mean";
}

std::string to_string(GqaOrder order) {
  return order == GqaOrder::PoolFirst ? "pool_first" : "reduce_first";
}

void add_window_score_config(const WindowScoreConfig& config, nlohmann::json& out) {
  out["window"] = config.window;
  out["pool"] = config.pool;
  out["pool_type"] = to_string(config.pool_type);
  out["gqa"] = to_string(config.gqa);
  out["gqa_order"] = to_string(config.gqa_order);
}

void pool1d(const float* in, float* out, int64_t n, int kernel, PoolType type) {
  const int64_t half = kernel / 2;
  if (kernel <= 1) {
    std::copy(in, in + n, out);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t lo = std::max<int64_t>(0, j - half);
    const int64_t hi = std::min<int64_t>(n - 1, j + half);
    if (type == PoolType::Max) {
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t t = lo; t <= hi; ++t) best = std::max(best, in[t]);
      out[j] = best;
    } else {
      float sum = 0.0f;
      for (int64_t t = lo; t <= hi; ++t) sum += in[t];
      out[j] = sum / static_cast<float>(kernel);  // zero padding counts in the mean
    }
  }
}

void reduce_group(const float* rows, int group, int64_t n, GqaReduce reduce, float* out) {
  std::copy(rows, rows + n, out);
  for (int g = 1; g < group; ++g) {
    const float* row = rows + static_cast<int64_t>(g) * n;
    if (reduce == GqaReduce::Max) {
      for (int64_t j = 0; j < n; ++j) out[j] = std::max(out[j], row[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) out[j] += row[j];
    }
  }
  if (reduce == GqaReduce::Mean && group > 1) {
    const float inv = 1.0f / static_cast<float>(group);
    for (int64_t j = 0; j < n; ++j) out[j] *= inv;
  }
}

void window_attention_sums(const LayerView& layer, int kv_head, int64_t window, float* out,
                           const KeyBlockVisitor& visit_keys) {
  const int64_t n = layer.n_tokens;
  const int64_t n_prefix = n - window;
  const int d = layer.head_dim;
  const int group = layer.group_size();
  const int64_t rows = static_cast<int64_t>(group) * window;

  // Workspaces reused across calls (one set per thread): every entry is written before it is
  // read, so no call pays for fresh zeroed pages.
  thread_local std::vector<float> queries, logits;
  // The group's window queries stacked: [group * window, d].
  queries.resize(static_cast<size_t>(rows * d));
  for (int g = 0; g < group; ++g) {
    const float* q = layer.q_head(kv_head * group + g) + n_prefix * d;
    std::copy(q, q + window * d, queries.data() + static_cast<int64_t>(g) * window * d);
  }
  // Logits of every window query against every key: [group * window, n], one block of keys at a
  // time (each logit is the same dot as in one GEMM over all keys: the blocks split the key
  // dimension only, never the head dimension). One BLAS thread per call: the heads run in
  // parallel above worth_parallel's size, and OpenBLAS's threads would split each block between
  // them, which changes the rounding of some logits with the thread count.
  const kernels::SerialBlasScope serial_blas;
  logits.resize(static_cast<size_t>(rows * n));
  const float* keys = layer.k_head(kv_head);
  for (int64_t begin = 0; begin < n; begin += kWindowKeyBlock) {
    const int64_t count = std::min(kWindowKeyBlock, n - begin);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(count), d, 1.0f / std::sqrt(static_cast<float>(d)), queries.data(),
                d, keys + begin * d, d, 0.0f, logits.data() + begin, static_cast<int>(n));
    if (visit_keys) visit_keys(begin, begin + count);
  }

  std::fill(out, out + static_cast<int64_t>(group) * n_prefix, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t g = r / window;
    const int64_t i = r % window;
    float* row = logits.data() + r * n;
    // Causal only inside the window block: query n_prefix + i sees keys 0 .. n_prefix + i.
    kernels::softmax(row, n_prefix + i + 1);
    float* sums = out + g * n_prefix;  // SnapKV Eq. 4: sum over the window rows
    for (int64_t j = 0; j < n_prefix; ++j) sums[j] += row[j];
  }
}

void window_scores_kv_head(const LayerView& layer, int kv_head, const WindowScoreConfig& config,
                           float* out, const KeyBlockVisitor& visit_keys) {
  const int64_t n_prefix = layer.n_tokens - config.window;
  const int group = layer.group_size();
  thread_local std::vector<float> sums;  // [group, n_prefix], reused: fully written below
  sums.resize(static_cast<size_t>(group * n_prefix));
  window_attention_sums(layer, kv_head, config.window, sums.data(), visit_keys);
  pool_and_reduce(sums.data(), group, n_prefix, config, out);
}

void pool_and_reduce(const float* sums, int group, int64_t n, const WindowScoreConfig& config,
                     float* out) {
  if (config.pool <= 1) {  // pooling is the identity: no copy of the rows
    reduce_group(sums, group, n, config.gqa, out);
    return;
  }
  if (config.gqa_order == GqaOrder::ReduceFirst) {
    // Reduce the group's rows (e.g. average), then pool the one row, SnapKV Eq. 5.
    std::vector<float> reduced(static_cast<size_t>(n));
    reduce_group(sums, group, n, config.gqa, reduced.data());
    pool1d(reduced.data(), out, n, config.pool, config.pool_type);
    return;
  }
  // Pool each query head's row first (as the reference does before any GQA handling), SnapKV Eq. 5.
  std::vector<float> pooled(static_cast<size_t>(group * n));
  for (int g = 0; g < group; ++g)
    pool1d(sums + g * n, pooled.data() + g * n, n, config.pool, config.pool_type);
  reduce_group(pooled.data(), group, n, config.gqa, out);
}

void window_scores(const LayerView& layer, const WindowScoreConfig& config, float* out) {
  const int64_t n_prefix = layer.n_tokens - config.window;
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int h = 0; h < layer.n_kv_heads; ++h)
    errors.run(
        [&] { window_scores_kv_head(layer, h, config, out + static_cast<int64_t>(h) * n_prefix); });
  errors.rethrow();
}

}  // namespace protokv::press
