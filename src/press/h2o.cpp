// SPDX-License-Identifier: Apache-2.0
#include "press/h2o.h"
#include "core/parallel.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "protokv/error.h"

namespace protokv::press {

void h2o_column_sums(const float* q, const float* k, int64_t n, int d, int64_t limit, int64_t tile,
                     float* out) {
  std::fill(out, out + limit, 0.0f);
  tile = std::max<int64_t>(1, tile);
  std::vector<float> logits(static_cast<size_t>(std::min(tile, n) * n));  // [tile, n] at most
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t t0 = 0; t0 < n; t0 += tile) {
    const int64_t t1 = std::min(n, t0 + tile);
    const int64_t rows = t1 - t0;
    // The tile's queries see keys [0, t1) at most: logits [rows, t1].
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(t1), d, scale, q + t0 * d, d, k, d, 0.0f, logits.data(),
                static_cast<int>(t1));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = t0 + r;
      float* row = logits.data() + r * t1;
      kernels::softmax(row, i + 1);
      const int64_t end = std::min(i + 1, limit);
      for (int64_t j = 0; j < end; ++j) out[j] += row[j];
    }
  }
}

void H2oScorer::add_config(nlohmann::json& out) const {
  out["gqa"] = to_string(gqa_);
}

void H2oScorer::score(const LayerView& layer, int64_t window, LayerScores& out) {
  const int64_t n = layer.n_tokens;
  const int64_t n_prefix = n - window;
  const int64_t limit = keep_all_key_scores_ ? n : n_prefix;
  const int group = layer.group_size();
  std::vector<float> per_query_head(
      static_cast<size_t>(layer.n_heads * limit));  // [n_heads, limit]
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int qh = 0; qh < layer.n_heads; ++qh)
    errors.run([&] {
      h2o_column_sums(layer.q_head(qh), layer.k_head(qh / group), n, layer.head_dim, limit, tile_,
                      per_query_head.data() + qh * limit);
    });
  errors.rethrow();

  out.reset(layer.n_kv_heads, n_prefix, false, false);
  std::vector<float> reduced(static_cast<size_t>(limit));
  if (keep_all_key_scores_) all_key_scores_.assign(static_cast<size_t>(layer.n_kv_heads * n), 0.0f);
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    reduce_group(per_query_head.data() + static_cast<int64_t>(h) * group * limit, group, limit,
                 gqa_, reduced.data());
    std::copy(reduced.begin(), reduced.begin() + n_prefix, out.head_score(h));
    if (keep_all_key_scores_)
      std::copy(reduced.begin(), reduced.end(), all_key_scores_.begin() + h * n);
  }
}

H2oPress::H2oPress(std::unique_ptr<H2oScorer> scorer, int64_t window, AllocatorConfig allocator,
                   bool decode_eviction, GqaReduce gqa, int64_t recent)
    : ScoringPress("h2o", std::move(scorer),
                   decode_eviction ? std::max<int64_t>(1, recent) : window, allocator),
      h2o_(static_cast<H2oScorer*>(&ScoringPress::scorer())),
      decode_eviction_(decode_eviction),
      gqa_(gqa),
      recent_(recent) {}

nlohmann::json H2oPress::config() const {
  nlohmann::json out = ScoringPress::config();
  out["decode"] = decode_eviction_;
  if (decode_eviction_) {
    // The recent window is the kept window; "B/2" until a budget is known.
    out.erase("window");
    out["recent"] = recent_ == kRecentHalfBudget ? nlohmann::json("B/2") : nlohmann::json(recent_);
  }
  return out;
}

void H2oPress::begin(const SequenceInfo& info, const Budget& budget) {
  // H2O splits the budget into heavy hitters and recent tokens (heavy_ratio / recent_ratio in its
  // code, equal in its scripts): by default the last B/2 tokens are kept, at least one.
  if (decode_eviction_)
    set_window(recent_ == kRecentHalfBudget
                   ? std::max<int64_t>(1, budget.resolve(info.n_tokens) / 2)
                   : recent_);
  ScoringPress::begin(info, budget);
  n_kv_heads_ = info.n_kv_heads;
  states_.assign(static_cast<size_t>(std::max(0, info.n_layers) * std::max(0, info.n_kv_heads)),
                 HeadState{});
}

H2oPress::HeadState& H2oPress::state(int layer, int h) {
  return states_[static_cast<size_t>(layer * n_kv_heads_ + h)];
}

const std::vector<float>& H2oPress::decode_scores(int layer, int h) const {
  return states_.at(static_cast<size_t>(layer * n_kv_heads_ + h)).scores;
}

void H2oPress::on_kept(int layer, int h, const std::vector<int32_t>& kept) {
  if (!decode_eviction_ || layer < 0 || h >= n_kv_heads_ ||
      static_cast<size_t>((layer + 1) * n_kv_heads_) > states_.size())
    return;
  HeadState& s = state(layer, h);
  const int64_t n = static_cast<int64_t>(h2o_->all_key_scores().size()) / n_kv_heads_;
  s.scores.resize(kept.size());
  for (size_t i = 0; i < kept.size(); ++i)
    s.scores[i] = h2o_->all_key_scores()[static_cast<size_t>(h * n + kept[i])];
  s.capacity = static_cast<int64_t>(kept.size());
  s.active = true;
}

void H2oPress::on_decode(const DecodeStep& step) {
  const int layer = step.layer;
  if (!decode_eviction_ || layer < 0 ||
      static_cast<size_t>((layer + 1) * n_kv_heads_) > states_.size())
    return;
  LayerCache& cache = *step.cache;
  const int n_heads = info().n_heads;
  const int group = n_heads / std::max(1, n_kv_heads_);
  const int d = info().head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int h = 0; h < n_kv_heads_ && h < static_cast<int>(cache.heads.size()); ++h) {
    HeadState& s = state(layer, h);
    if (!s.active) continue;  // prefill not compressed: H2O never evicts below the prompt
    HeadCache& head = cache.heads[static_cast<size_t>(h)];
    const int64_t size = head.size();
    s.scores.resize(static_cast<size_t>(size), 0.0f);  // new entries start at zero
    // Attention of the new token's group queries over this head's entries: [group, size], as the
    // decode kernel computed it.
    const float* probs = step.group_probs(h, group);
    if (probs == nullptr) {  // a row of append(): no attention weights come with it
      probs_scratch_.resize(static_cast<size_t>(group * size));
      keys_scratch_.resize(static_cast<size_t>(size * d));
      head.read_keys(0, size, keys_scratch_.data());
      for (int g = 0; g < group; ++g) {
        const float* qg = step.q + static_cast<int64_t>(h * group + g) * d;
        float* row = probs_scratch_.data() + static_cast<int64_t>(g) * size;
        for (int64_t e = 0; e < size; ++e)
          row[e] = kernels::dot(qg, keys_scratch_.data() + e * d, d) * scale +
                   head.log_weights()[static_cast<size_t>(e)];
        kernels::softmax(row, size);
      }
      probs = probs_scratch_.data();
    }
    reduced_scratch_.resize(static_cast<size_t>(size));
    reduce_group(probs, group, size, gqa_, reduced_scratch_.data());
    for (int64_t e = 0; e < size; ++e)
      s.scores[static_cast<size_t>(e)] += reduced_scratch_[static_cast<size_t>(e)];

    // Evict the lowest-scored entries outside the recent window until the head fits its budget.
    int64_t current = size;
    evicted_scratch_.assign(static_cast<size_t>(size), 0);
    while (current > s.capacity) {
      const int64_t candidates = size - window();
      int64_t victim = -1;
      for (int64_t e = 0; e < candidates; ++e) {
        if (evicted_scratch_[static_cast<size_t>(e)] != 0) continue;
        if (victim < 0 || s.scores[static_cast<size_t>(e)] < s.scores[static_cast<size_t>(victim)])
          victim = e;
      }
      if (victim < 0) break;
      evicted_scratch_[static_cast<size_t>(victim)] = 1;
      --current;
    }
    if (current == size) continue;
    keep_scratch_.clear();
    kept_scores_scratch_.clear();
    for (int64_t e = 0; e < size; ++e) {
      if (evicted_scratch_[static_cast<size_t>(e)] != 0) continue;
      keep_scratch_.push_back(static_cast<int32_t>(e));
      kept_scores_scratch_.push_back(s.scores[static_cast<size_t>(e)]);
    }
    head.keep(keep_scratch_);
    s.scores.assign(kept_scores_scratch_.begin(), kept_scores_scratch_.end());
  }
}

const PressEntry kH2oEntry{
    .name = "h2o",
    .allocator_role = AllocatorRole::Composes,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "score = column sums of the full causal attention of ALL prompt queries over\n"
              "keys [0, n-w) (tiled, never n x n), reduced over the GQA group; keep the top\n"
              "B-w plus the last w.\n"
              "decode=1: each decode step adds the new query's attention to the kept\n"
              "entries' scores and evicts the lowest-scored entry outside the last\n"
              "`recent` when a head exceeds its prefill budget (only for sequences whose\n"
              "prefill was compressed). As in H2O's code the budget is split into heavy\n"
              "hitters and recent tokens (recent= replaces window=); the top B-recent by\n"
              "score are the heavy hitters.\n"
              "Cost O(n^2 d) per head: slow on long prompts by nature.\n");
        },
    .options =
        [] {
          return std::vector<OptionSpec>{
              window_option_spec(),
              gqa_option_spec(),
              bool_option("decode", false,
                          "1: evict during decode too, by accumulated attention (H2O's "
                          "heavy-hitter oracle at every step)"),
              derived(int_option("recent", 0, 1, int64_t{1} << 30,
                                 "decode=1 only: recent tokens always kept, in prefill and "
                                 "decode (replaces window=)"),
                      "B/2"),
          };
        },
    .make = [](const PressEntry&, OptionReader& options,
               const AllocatorConfig& allocator) -> std::unique_ptr<Press> {
      const GqaReduce gqa = read_gqa_option(options);
      const bool decode = options.get_bool("decode");
      // decode=1 splits the budget between heavy hitters and `recent` tokens as H2O's code does
      // (its scripts use half and half); window= belongs to prefill-only h2o.
      int64_t window = 0, recent = 0;
      if (decode) {
        options.reject_if_given("window", "decode=1 (its recent window is recent=, default B/2)");
        recent = options.get_int("recent", H2oPress::kRecentHalfBudget);
      } else {
        options.reject_if_given("recent", "decode=0 (recent= is decode=1's window; use window=)");
        window = read_window_option(options);
      }
      return std::make_unique<H2oPress>(std::make_unique<H2oScorer>(gqa, decode), window, allocator,
                                        decode, gqa, recent);
    },
};

}  // namespace protokv::press
