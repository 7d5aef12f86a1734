// SPDX-License-Identifier: Apache-2.0
#include "press/pod.h"
#include "core/parallel.h"

#include <fmt/format.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "kernels/kernels.h"
#include "press/calibration_measures.h"
#include "protokv/error.h"
#include "protokv/press/options.h"
#include "protokv/press/scores.h"
#include "protokv/press/scoring_press.h"

namespace protokv::press {

void validate_block_table(const std::vector<std::vector<int>>& table, int n_kv_heads,
                          int n_layers) {
  if (static_cast<int>(table.size()) != n_kv_heads)
    fail("press 'pod': the block table has {} KV heads, the model {}", table.size(), n_kv_heads);
  for (int h = 0; h < n_kv_heads; ++h) {
    const std::vector<int>& starts = table[static_cast<size_t>(h)];
    if (static_cast<int>(starts.size()) != n_layers)
      fail("press 'pod': the block table has {} layers for KV head {}, the model {}", starts.size(),
           h, n_layers);
    for (int l = 0; l < n_layers; ++l) {
      const int start = starts[static_cast<size_t>(l)];
      // Blocks are runs of consecutive layers: a layer opens one or continues its predecessor's.
      if (start != l && (l == 0 || start != starts[static_cast<size_t>(l - 1)]))
        fail(
            "press 'pod': block table KV head {} layer {}: block start {} is neither the layer "
            "nor its predecessor's block start",
            h, l, start);
    }
  }
}

std::vector<float> last_query_attention_rows(const LayerView& layer, int kv_head, int64_t queries) {
  const int64_t n = layer.n_tokens;
  const int64_t q_rows = std::min(queries, n);
  const int64_t first = n - q_rows;  // position of the first row's query
  const int d = layer.head_dim;
  const int group = layer.group_size();
  std::vector<float> rows(static_cast<size_t>(group * q_rows * n));
  for (int g = 0; g < group; ++g) {
    float* out = rows.data() + static_cast<int64_t>(g) * q_rows * n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(q_rows),
                static_cast<int>(n), d, 1.0f / std::sqrt(static_cast<float>(d)),
                layer.q_head(kv_head * group + g) + first * d, d, layer.k_head(kv_head), d, 0.0f,
                out, static_cast<int>(n));
    for (int64_t i = 0; i < q_rows; ++i) {
      float* row = out + i * n;
      kernels::softmax(row, first + i + 1);  // causal: keys 0 .. first + i
      std::fill(row + first + i + 1, row + n, 0.0f);
    }
  }
  return rows;
}

nlohmann::json PodPress::config() const {
  nlohmann::json out;
  out["name"] = "pod";
  out["sinks"] = options_.sinks;
  out["recent"] = "B - sinks";
  out["queries"] = options_.queries;
  out["delta"] = options_.delta;
  out["blocks"] = options_.profile != nullptr ? "profile"
                  : options_.block_start      ? "table"
                                              : "prompt";
  if (options_.profile != nullptr) out["profile"] = options_.profile_path;
  out["scores"] = options_.lower_query ? "lower" : "own";
  out["tau"] = options_.tau ? nlohmann::json(*options_.tau) : nlohmann::json("off");
  out["tau_gate"] = options_.gate_at_lowest ? "lowest" : "layer";
  out["prefill_attention"] = "exact";
  out["training_free"] = true;
  // After a compressed prefill: the blocks used ([kv_head][layer] -> lowest layer of the block).
  if (compressing_ && next_layer_ == info_.n_layers) out["block_starts"] = block_start_;
  return out;
}

void PodPress::begin(const SequenceInfo& info, const Budget& budget) {
  info_ = info;
  budget_ = budget.resolve(info.n_tokens);
  compressing_ = budget_ < info.n_tokens;
  if (compressing_ && budget_ <= options_.sinks)
    fail("press 'pod': budget {} leaves no recent token beside its {} sinks (needs B > sinks)",
         budget_, options_.sinks);
  recent_ = budget_ - options_.sinks;
  next_layer_ = 0;
  const auto n_kv = static_cast<size_t>(std::max(0, info.n_kv_heads));
  if (options_.profile != nullptr) check_profile_matches(*options_.profile, info, "pod");
  if (options_.block_start) {
    validate_block_table(*options_.block_start, info.n_kv_heads, info.n_layers);
    block_start_ = *options_.block_start;
  } else {
    // Until calibrated, every layer is its own block.
    std::vector<int> own(static_cast<size_t>(std::max(0, info.n_layers)));
    for (size_t l = 0; l < own.size(); ++l) own[l] = static_cast<int>(l);
    block_start_.assign(n_kv, own);
  }
  calibration_.assign(n_kv, Calibration{});
  gate_.assign(static_cast<size_t>(std::max(0, info.n_layers)),
               std::vector<float>(static_cast<size_t>(std::max(0, info.n_heads)), 0.0f));
  distant_lse_.assign(static_cast<size_t>(std::max(0, info.n_layers)),
                      std::vector<double>(static_cast<size_t>(std::max(0, info.n_heads)),
                                          std::numeric_limits<double>::quiet_NaN()));
  layer_shares_.assign(static_cast<size_t>(std::max(0, info.n_layers)), 0);
}

PodPress::Calibration& PodPress::calibration(int layer, int kv_head) {
  if (layer < 0 || layer >= info_.n_layers || kv_head < 0 ||
      static_cast<size_t>(kv_head) >= calibration_.size())
    fail("press 'pod': layer {} KV head {} is outside the {} layers x {} KV heads it began with",
         layer, kv_head, info_.n_layers, calibration_.size());
  return calibration_[static_cast<size_t>(kv_head)];
}

void PodPress::calibrate(const LayerView& layer) {
  const int l = layer.layer;
  // Algorithm 1 is bottom-up over the layers in order. A layer fed without its predecessor (a
  // caller compressing one layer alone) cannot be compared with it and opens a block.
  const bool continues = l > 0 && l == next_layer_;
  next_layer_ = l + 1;
  const int64_t q_rows = std::min(options_.queries, layer.n_tokens);
  const int group = layer.group_size();
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    errors.run([&] {
      Calibration& c = calibration(l, h);
      std::vector<float> rows = last_query_attention_rows(layer, h, options_.queries);
      int start = l;
      if (continues && !c.block_layers.empty()) {
        // GQA: the similarity of two layers for a KV head is the mean over its query heads.
        const auto similarity = [&](int a, int b) {
          const auto key = std::make_pair(a, b);
          if (const auto it = c.similarity.find(key); it != c.similarity.end()) return it->second;
          const auto index = [&](int layer_index) -> const std::vector<float>& {
            if (layer_index == l) return rows;
            const auto at = std::find(c.block_layers.begin(), c.block_layers.end(), layer_index);
            if (at == c.block_layers.end())
              fail("press 'pod': no attention rows of layer {} to compare", layer_index);
            return c.block_rows[static_cast<size_t>(at - c.block_layers.begin())];
          };
          const std::vector<float>& ra = index(a);
          const std::vector<float>& rb = index(b);
          const int64_t per_head = q_rows * layer.n_tokens;
          double total = 0.0;
          for (int g = 0; g < group; ++g)
            total += attention_similarity(
                std::span<const float>(ra).subspan(static_cast<size_t>(g * per_head),
                                                   static_cast<size_t>(per_head)),
                std::span<const float>(rb).subspan(static_cast<size_t>(g * per_head),
                                                   static_cast<size_t>(per_head)),
                q_rows, layer.n_tokens);
          const double mean = total / group;
          c.similarity.emplace(key, mean);
          return mean;
        };
        // The grouping of layers 0..l is that of 0..l-1 plus layer l (greedy, bottom-up); the
        // earlier comparisons are remembered, the new ones use the current block's stored rows.
        // Layers before the current block take their known starts.
        const int block = c.block_layers.front();
        const std::vector<int> starts = pod_block_starts(
            l - block + 1, [&](int a, int b) { return similarity(a + block, b + block); },
            options_.delta);
        start = starts.back() + block;
      }
      block_start_[static_cast<size_t>(h)][static_cast<size_t>(l)] = start;
      if (start == l) {
        c.block_rows.clear();
        c.block_layers.clear();
        c.similarity.clear();
      }
      c.block_rows.push_back(std::move(rows));
      c.block_layers.push_back(l);
    });
  }
  errors.rethrow();
}

void PodPress::compress_prefill(const LayerView& layer, LayerCache& out) {
  keep_all(layer, out);  // nothing is evicted: every entry keeps its value
  const int64_t n = layer.n_tokens;
  if (budget_ >= n) return;
  if (options_.block_start)
    next_layer_ = layer.layer + 1;
  else
    calibrate(layer);
  const int l = layer.layer;
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    const int start = block_start_[static_cast<size_t>(h)][static_cast<size_t>(l)];
    // Distant entries [n_s, n - n_r): their keys stay at the block's lowest layer only.
    if (start != l) {
      out.heads[static_cast<size_t>(h)].share_keys(start, options_.sinks, n - recent_,
                                                   options_.lower_query);
      layer_shares_[static_cast<size_t>(l)] = 1;
    }
  }
}

bool PodPress::selects(int layer) const {
  return options_.tau && compressing_ && layer >= 0 &&
         static_cast<size_t>(layer) < layer_shares_.size() &&
         layer_shares_[static_cast<size_t>(layer)] != 0;
}

double PodPress::layer_gate(int q_head, const float* q, const HeadCache& head) const {
  // PoD Eq. 4 at this layer: g = Σexp a^P / (Σexp a^P + Σexp a^D) = 1 / (1 + exp(lse_D - lse_P)),
  // a^P from this layer's query and its own (held) keys, lse_D the block's lowest layer's.
  const double lse_distant =
      distant_lse_[static_cast<size_t>(head.key_lender())][static_cast<size_t>(q_head)];
  if (std::isnan(lse_distant)) return 0.0;  // unknown (no probabilities at that layer): keep all
  if (lse_distant == -std::numeric_limits<double>::infinity()) return 1.0;
  const int d = head.head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::span<const float> log_weights = head.log_weights();
  // Online log-sum-exp over the held keys, those before and after the shared range (read in
  // place from an F32 cache; select() runs on several KV heads at once: a scratch per thread).
  thread_local std::vector<float> scratch;
  double max_logit = -std::numeric_limits<double>::infinity(), sum = 0.0;
  const auto add_held = [&](int64_t begin, int64_t end) {
    const float* keys = head.keys_as_f32(begin, end - begin, scratch);
    for (int64_t e = begin; e < end; ++e) {
      double logit = scale * kernels::dot(q, keys + (e - begin) * d, d);
      if (head.has_log_weights()) logit += log_weights[static_cast<size_t>(e)];
      if (logit > max_logit) {
        sum = sum * std::exp(max_logit - logit) + 1.0;
        max_logit = logit;
      } else {
        sum += std::exp(logit - max_logit);
      }
    }
  };
  add_held(0, head.shared_begin());
  add_held(head.shared_end(), head.size());
  if (sum == 0.0) return 0.0;  // no proximal entry
  const double lse_proximal = max_logit + std::log(sum);
  return 1.0 / (1.0 + std::exp(lse_distant - lse_proximal));
}

void PodPress::select(int /*layer*/, int q_head, const float* q, const HeadCache& head,
                      std::vector<int32_t>& out) {
  out.clear();
  const int64_t n = head.size();
  // Paper 004 §2.3: at a layer that is not its block's lowest, skip the distant entries when the
  // gate g_{ℓ,i} >= tau (tau_gate=layer: this layer's; lowest: the lowest layer's, which ran
  // before this one at this step).
  bool skip = false;
  if (head.shares_keys()) {
    const double gate =
        options_.gate_at_lowest
            ? gate_[static_cast<size_t>(head.key_lender())][static_cast<size_t>(q_head)]
            : layer_gate(q_head, q, head);
    skip = gate >= *options_.tau;
  }
  for (int64_t e = 0; e < n; ++e)
    if (!skip || !head.key_is_shared(e)) out.push_back(static_cast<int32_t>(e));
}

void PodPress::on_decode(const DecodeStep& step) {
  if (!compressing_) return;
  if (options_.tau) {
    // The gate of Eq. 4 at this layer for each query head: its attention on the entries that are
    // proximal at this step at the sharing layers (the sinks and the last n_r + 1, the newest
    // token included), read by select() at the layers above. Without probabilities (rows fed by
    // append()) the gate is unknown: 0, nothing is skipped.
    // At a layer that holds every key (a block's lowest), also log Σexp of its distant logits,
    // read by the layers above for their own gate (tau_gate=layer): from the softmax,
    // lse_all = logit_e - log p_e for any attended entry e (the most probable: the most
    // accurate), and lse_D = lse_all + log Σ_{e distant} p_e.
    std::vector<float>& gates = gate_[static_cast<size_t>(step.layer)];
    std::vector<double>& lse = distant_lse_[static_cast<size_t>(step.layer)];
    const int group = step.n_heads / static_cast<int>(step.cache->heads.size());
    const double scale = 1.0 / std::sqrt(static_cast<double>(step.head_dim));
    for (int h = 0; h < step.n_heads; ++h) {
      const std::span<const float> probs = step.probs(h);
      const std::span<const int32_t> attended = step.attended(h);
      const HeadCache& head = step.cache->heads[static_cast<size_t>(h / group)];
      const int64_t n = head.size();
      double proximal = 0.0, distant = 0.0;
      size_t top = 0;
      for (size_t i = 0; i < probs.size(); ++i) {
        const int64_t e = attended.empty() ? static_cast<int64_t>(i) : attended[i];
        if (e < options_.sinks || e >= n - 1 - recent_)
          proximal += probs[i];
        else
          distant += probs[i];
        if (probs[i] > probs[top]) top = i;
      }
      gates[static_cast<size_t>(h)] = probs.empty() ? 0.0f : static_cast<float>(proximal);
      lse[static_cast<size_t>(h)] = std::numeric_limits<double>::quiet_NaN();
      if (probs.empty() || head.shares_keys() || probs[top] <= 0.0f) continue;
      const int64_t e = attended.empty() ? static_cast<int64_t>(top) : attended[top];
      double logit = scale * kernels::dot(step.q + static_cast<int64_t>(h) * step.head_dim,
                                          head.key_floats(e).data(), step.head_dim);
      if (head.has_log_weights()) logit += head.log_weights()[static_cast<size_t>(e)];
      const double lse_all = logit - std::log(static_cast<double>(probs[top]));
      lse[static_cast<size_t>(h)] =
          distant > 0.0 ? lse_all + std::log(distant) : -std::numeric_limits<double>::infinity();
    }
  }
  // The token that leaves the recent window becomes distant: its key goes at the sharing layers.
  for (HeadCache& head : step.cache->heads)
    if (head.shares_keys() && head.size() - recent_ > head.shared_end())
      head.extend_shared_keys(head.size() - recent_);
}

const PressEntry kPodEntry{
    .name = "pod",
    .allocator_role = AllocatorRole::None,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return fmt::format(
              "training-free PoD (the paper post-trains; we do not): every entry keeps its value;\n"
              "per KV head the first `sinks` and the last B - sinks tokens keep their keys at\n"
              "every layer, the distant ones in between only at the lowest layer of the head's\n"
              "block of layers, whose keys the block's other layers use (with their own query\n"
              "and, by default, its query too: see scores=); one softmax over proximal +\n"
              "distant logits = paper Eq. 4's gate. Keys leaving the recent window during\n"
              "decode are dropped at those layers. Blocks: `profile=FILE` (protokv calibrate),\n"
              "else calibrated on the prompt itself: attention rows of the last `queries`\n"
              "queries, similarity 1 - JS divergence (mean over a KV head's query heads),\n"
              "greedy grouping with threshold `delta` (Algorithm 1). B = keys held per head at\n"
              "the sharing layers; values stay for all tokens. Prefill attention stays exact.\n"
              "tau=T: at a sharing layer a query head skips the distant entries when its gate\n"
              "of Eq. 4 is >= T.\n");
        },
    .options =
        [] {
          return std::vector<OptionSpec>{
              int_option("sinks", PodOptions::kDefaultSinks, 0, int64_t{1} << 30,
                         "the first tokens: keys kept at every layer", "PoD §3 (n_s)"),
              int_option("queries", PodOptions::kDefaultQueries, 1, int64_t{1} << 20,
                         "the last prompt queries whose attention rows group the layers"),
              text_option("profile",
                          "a calibration profile (protokv calibrate) whose layer blocks are used "
                          "instead of grouping on the prompt"),
              double_option("delta", PodOptions::kDefaultDelta, 0.0, 1.0,
                            "grouping threshold on the 1 - JS divergence similarity",
                            "PoD Algorithm 1"),
              derived(double_option("tau", 1.0, 0.0, 1.0,
                                    "gate threshold: skip the distant entries when the gate "
                                    "is >= tau",
                                    "PoD §2.3, Eq. 4"),
                      "off"),
              choice_option("tau_gate", "layer", {"layer", "lowest"},
                            "layer (the paper's): this layer's own gate, from its proximal "
                            "logits and the distant exp-sum of the block's lowest layer (exact "
                            "with scores=lower); lowest: the lowest layer's own proximal share"),
              choice_option("scores", "lower", {"lower", "own"},
                            "distant logits with the lowest layer's query, i.e. its attention "
                            "scores (the paper's), or with this layer's own query (DESIGN's "
                            "reading)",
                            "PoD Eq. 3"),
          };
        },
    .make = [](const PressEntry&, OptionReader& options,
               const AllocatorConfig&) -> std::unique_ptr<Press> {
      PodOptions o;
      o.sinks = options.get_int("sinks");
      o.queries = options.get_int("queries");
      o.profile_path = options.get_text("profile");
      // The profile's blocks were grouped offline at its own delta and query rows.
      o.profile = profile_option(options, {"delta", "queries"});
      if (o.profile != nullptr) o.block_start = o.profile->pod_block_start;
      o.delta = options.get_double("delta");
      if (options.given("tau")) o.tau = options.get_double("tau", 1.0);  // given: no fallback
      o.gate_at_lowest = options.get_choice("tau_gate") == "lowest";
      // Paper 004 Eq. 3 (a^D = Q_la K_la^T) by default: DESIGN's own-query reading degrades a
      // model that was not post-trained far more (docs/methods.md, PoD).
      o.lower_query = options.get_choice("scores") == "lower";
      return std::make_unique<PodPress>(o);
    },
    .shares_keys = true,
};

}  // namespace protokv::press
