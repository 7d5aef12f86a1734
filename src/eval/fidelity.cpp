// SPDX-License-Identifier: Apache-2.0
#include "eval/fidelity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "eval/memory_share.h"
#include "eval/progress.h"
#include "eval/report/table.h"
#include "eval/results_file.h"
#include "eval/svg_plot.h"
#include "eval/synthetic.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/json_keys.h"
#include "protokv/limits.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press_spec.h"
#include "protokv/sampler.h"
#include "protokv/threads.h"
#include "protokv/timer.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// What the full-cache run of one sample leaves for the presses to be compared against.
struct Reference {
  std::vector<int32_t> continuation;  // [M]
  std::vector<float> logits;          // [M, vocab]: step t predicts continuation[t]
  std::vector<float> attn_out;        // [M, n_layers, n_heads * head_dim]
  std::vector<int32_t> top;           // [M, n_layers, n_heads, top_count] prompt positions
  int64_t top_count = 0;              // largest budget below the prompt length
  double ppl = 0.0;
  size_t kv_bytes = 0;
  double prefill_ms = 0.0;
  double decode_ms_per_token = 0.0;
};

// Records the full run's attention outputs and each query head's most-attended prompt positions.
// The engine may call it from several threads at once: every call writes its own slot.
class RecordingObserver final : public DecodeObserver {
 public:
  RecordingObserver(Reference& ref, const ModelConfig& config, int64_t prompt_len)
      : ref_(ref), config_(config), prompt_len_(prompt_len) {}
  int64_t step = 0;

  bool wants_probabilities() const override { return true; }
  void on_decode(const DecodeStep& decode) override {
    const int layer = decode.layer;
    const int64_t width = int64_t{decode.n_heads} * decode.head_dim;
    std::copy(decode.attention_output, decode.attention_output + width,
              ref_.attn_out.begin() + (step * config_.n_layers + layer) * width);
    if (ref_.top_count == 0) return;
    for (int q_head = 0; q_head < decode.n_heads; ++q_head) {
      const auto top =
          top_positions(decode.probs(q_head), decode.attended_positions(q_head, positions_scratch_),
                        static_cast<int32_t>(prompt_len_), ref_.top_count);
      const int64_t slot = ((step * config_.n_layers + layer) * config_.n_heads + q_head);
      auto dst = ref_.top.begin() + slot * ref_.top_count;
      std::fill(dst, dst + ref_.top_count, -1);
      std::copy(top.begin(), top.end(), dst);
    }
  }

 private:
  Reference& ref_;
  const ModelConfig& config_;
  int64_t prompt_len_;
  std::vector<int32_t> positions_scratch_;
};

// Compares a press run's attention outputs with the reference, per head (ProtoKV Eq. 2).
// Asks for probabilities too, only so that both runs take the same engine code path.
class ComparingObserver final : public DecodeObserver {
 public:
  ComparingObserver(const Reference& ref, const ModelConfig& config, int64_t steps, int64_t budget)
      : ref_(ref),
        config_(config),
        budget_(budget),
        errors_(static_cast<size_t>(steps * config.n_layers), kNaN) {}
  int64_t step = 0;

  // A recall press (clusterkv) keeps every entry, so the recall of the most-attended positions
  // is measured against what each step attended, layer by layer (selected_steps() > 0).
  double attended_recall() const { return recall_sum_ / static_cast<double>(recall_count_); }
  int64_t selected_steps() const { return selected_steps_; }

  void on_decode(const DecodeStep& decode) override {
    const int layer = decode.layer, n_heads = decode.n_heads, head_dim = decode.head_dim;
    if (decode.selections != nullptr) ++selected_steps_;
    if (ref_.top_count > 0 && decode.probs_data != nullptr) {
      const int64_t b = std::min(budget_, ref_.top_count);
      for (int qh = 0; qh < n_heads; ++qh) {
        const auto positions = decode.attended_positions(qh, positions_scratch_);
        attended_sorted_.assign(positions.begin(), positions.end());
        std::sort(attended_sorted_.begin(), attended_sorted_.end());
        const int64_t slot = (step * config_.n_layers + layer) * config_.n_heads + qh;
        const int32_t* top = ref_.top.data() + slot * ref_.top_count;
        const int64_t valid = std::find(top, top + b, -1) - top;
        recall_sum_ += recall({top, static_cast<size_t>(valid)}, attended_sorted_);
        ++recall_count_;
      }
    }
    const float* out = decode.attention_output;
    const int64_t width = int64_t{n_heads} * head_dim;
    const float* ref = ref_.attn_out.data() + (step * config_.n_layers + layer) * width;
    double sum = 0.0;
    for (int h = 0; h < n_heads; ++h) {
      sum += relative_error(ref + int64_t{h} * head_dim, out + int64_t{h} * head_dim, head_dim);
    }
    errors_[static_cast<size_t>(step * config_.n_layers + layer)] = sum / n_heads;
  }
  bool wants_probabilities() const override { return true; }

  // Mean over steps of one layer's error.
  double layer_error(int layer) const {
    double sum = 0.0;
    const int64_t steps = static_cast<int64_t>(errors_.size()) / config_.n_layers;
    for (int64_t s = 0; s < steps; ++s)
      sum += errors_[static_cast<size_t>(s * config_.n_layers + layer)];
    return sum / static_cast<double>(steps);
  }

 private:
  const Reference& ref_;
  const ModelConfig& config_;
  int64_t budget_;
  std::vector<double> errors_;  // [steps, n_layers]
  double recall_sum_ = 0.0;
  int64_t recall_count_ = 0, selected_steps_ = 0;
  std::vector<int32_t> positions_scratch_, attended_sorted_;
};

void check_tokens(const ModelConfig& config, const std::vector<int32_t>& tokens, const char* what) {
  for (int32_t t : tokens) {
    PROTOKV_CHECK(t >= 0 && t < config.vocab_size, "{} token {} outside the vocabulary [0, {})",
                  what, t, config.vocab_size);
  }
}

// Decodes the continuation's tokens one at a time for both runs (full and pressed): the last token
// is decoded only when attention is observed (its logits predict nothing scored); times each step.
struct ContinuationDecoder {
  Session& session;
  int64_t& observer_step;  // the observer's "current continuation step"
  bool observe_last;
  double total_ms = 0.0;
  int64_t steps = 0;

  // Feeds `token`, the continuation's token `t` of `n`; returns false when it is not decoded.
  template <class Logits>
  bool step(int64_t t, int64_t n, int32_t token, Logits& logits) {
    if (t + 1 >= n && !observe_last) return false;
    observer_step = t;
    Timer timer;
    logits = session.decode(token);
    total_ms += timer.ms();
    ++steps;
    return true;
  }
  double ms_per_token() const { return steps > 0 ? total_ms / static_cast<double>(steps) : 0.0; }
};

// Prefills `session` with the sample's prompt: its own forward pass, or the one shared by every
// run of the sample (FidelityOptions::share_prefill; bit-identical, see PrefilledPrompt).
std::span<const float> prefill_sample(Session& session, const FidelitySample& sample,
                                      const PrefilledPrompt* shared) {
  return shared != nullptr ? session.prefill(*shared) : session.prefill(sample.prompt);
}

Reference run_reference(const ModelWeights& weights, const FidelitySample& sample,
                        const FidelityOptions& options, int64_t top_count,
                        const PrefilledPrompt* shared) {
  const ModelConfig& config = weights.config;
  const int64_t steps = options.continuation;
  const int64_t vocab = config.vocab_size;
  Reference ref;
  ref.top_count = options.attention_metrics ? top_count : 0;
  ref.logits.resize(static_cast<size_t>(steps * vocab));
  if (options.attention_metrics) {
    ref.attn_out.resize(static_cast<size_t>(steps * config.n_layers * config.dim));
    ref.top.assign(static_cast<size_t>(steps * config.n_layers * config.n_heads * ref.top_count),
                   -1);
  }
  RecordingObserver observer(ref, config, static_cast<int64_t>(sample.prompt.size()));

  Session session(weights);
  if (options.attention_metrics) session.set_observer(&observer);
  auto logits = prefill_sample(session, sample, shared);
  ref.prefill_ms = shared != nullptr ? shared->prefill_ms() : session.prefill_stats().prefill_ms;
  ref.kv_bytes = session.prefill_stats().kv_bytes;
  const bool greedy = sample.continuation.empty();
  ref.continuation = sample.continuation;
  ref.continuation.resize(static_cast<size_t>(steps));
  double nll = 0.0;
  ContinuationDecoder decoder{session, observer.step, options.attention_metrics};
  for (int64_t t = 0; t < steps; ++t) {
    std::copy(logits.begin(), logits.end(), ref.logits.begin() + t * vocab);
    if (greedy) ref.continuation[static_cast<size_t>(t)] = argmax(logits);
    const int32_t token = ref.continuation[static_cast<size_t>(t)];
    nll -= log_softmax_at(logits, token);
    decoder.step(t, steps, token, logits);
  }
  ref.ppl = std::exp(nll / static_cast<double>(steps));
  ref.decode_ms_per_token = decoder.ms_per_token();
  return ref;
}

// One sample's metrics for one (press, budget).
struct RunMetrics {
  nlohmann::json diagnostics;  // the press's own, per layer (ProtoKV), or null
  double kl_mean = 0.0, kl_max = 0.0, top1 = 0.0, ppl = 0.0, recall = kNaN;
  std::vector<double> attn_err;  // [n_layers]
  size_t kv_bytes = 0;
  // After prefill, over every layer and KV head: entries stored, and the prompt tokens they stand
  // for (more than the entries when a press merges: chelsea).
  int64_t entries = 0, tokens_represented = 0;
  double kv_bytes_attended = 0.0;  // mean over decode steps (less than stored when recalling)
  double compress_ms = 0.0, prefill_ms = 0.0, decode_ms_per_token = 0.0;
};

// Doubles as JSON numbers, exactly (nlohmann writes the shortest text that reads back to the same
// double); JSON has no NaN or infinity, so those become strings.
nlohmann::json exact(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}
double exact_double(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  const std::string s = j.get<std::string>();
  if (s == "nan") return kNaN;
  PROTOKV_CHECK(s == "inf" || s == "-inf", "not a number: {}", s);
  return s == "inf" ? std::numeric_limits<double>::infinity()
                    : -std::numeric_limits<double>::infinity();
}

nlohmann::json to_json(const RunMetrics& m) {
  nlohmann::json attn = nlohmann::json::array();
  for (double e : m.attn_err) attn.push_back(exact(e));
  return {{"kl_mean", exact(m.kl_mean)},
          {"kl_max", exact(m.kl_max)},
          {"top1", exact(m.top1)},
          {"ppl", exact(m.ppl)},
          {"recall", exact(m.recall)},
          {"attn_err", attn},
          {json_keys::kKvBytes, m.kv_bytes},
          {"entries", m.entries},
          {"tokens_represented", m.tokens_represented},
          {json_keys::kKvBytesAttended, exact(m.kv_bytes_attended)},
          {"compress_ms", exact(m.compress_ms)},
          {"prefill_ms", exact(m.prefill_ms)},
          {"decode_ms_per_token", exact(m.decode_ms_per_token)},
          {"diagnostics", m.diagnostics}};
}

RunMetrics run_metrics_from_json(const nlohmann::json& j) {
  RunMetrics m;
  m.kl_mean = exact_double(j.at("kl_mean"));
  m.kl_max = exact_double(j.at("kl_max"));
  m.top1 = exact_double(j.at("top1"));
  m.ppl = exact_double(j.at("ppl"));
  m.recall = exact_double(j.at("recall"));
  for (const auto& e : j.at("attn_err")) m.attn_err.push_back(exact_double(e));
  m.kv_bytes = j.at(json_keys::kKvBytes).get<size_t>();
  m.entries = j.at("entries").get<int64_t>();
  m.tokens_represented = j.at("tokens_represented").get<int64_t>();
  m.kv_bytes_attended = exact_double(j.at(json_keys::kKvBytesAttended));
  m.compress_ms = exact_double(j.at("compress_ms"));
  m.prefill_ms = exact_double(j.at("prefill_ms"));
  m.decode_ms_per_token = exact_double(j.at("decode_ms_per_token"));
  m.diagnostics = j.at("diagnostics");
  return m;
}

// Accumulates one sample's per-layer diagnostics (array of objects or nulls) into `out`.
void add_diagnostics(const nlohmann::json& layers,
                     std::map<std::string, std::vector<RunningStats>>& out) {
  if (!layers.is_array()) return;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].is_object()) continue;
    for (const auto& [key, value] : layers[l].items()) {
      if (!value.is_number()) continue;
      auto& stats = out[key];
      if (stats.size() < layers.size()) stats.resize(layers.size());
      stats[l].add(value.get<double>());
    }
  }
}

RunMetrics run_press(const ModelWeights& weights, const FidelitySample& sample,
                     const Reference& ref, const std::shared_ptr<const PressSpec>& press,
                     int64_t budget, const FidelityOptions& options,
                     const PrefilledPrompt* shared) {
  const ModelConfig& config = weights.config;
  const int64_t steps = options.continuation;
  const int64_t vocab = config.vocab_size;
  const int64_t prompt_len = static_cast<int64_t>(sample.prompt.size());
  SessionOptions session_options;
  session_options.press = press;
  session_options.budget.entries = budget;
  session_options.cache_type = options.cache_type;
  Session session(weights, session_options);
  ComparingObserver observer(ref, config, steps, budget);
  if (options.attention_metrics) session.set_observer(&observer);

  RunMetrics m;
  auto logits = prefill_sample(session, sample, shared);
  const PrefillStats& stats = session.prefill_stats();
  m.kv_bytes = stats.kv_bytes;
  m.compress_ms = stats.compress_ms;
  m.prefill_ms = stats.prefill_ms;
  if (const auto* scoring = dynamic_cast<const press::ScoringPress*>(session.press()))
    m.diagnostics = scoring->scorer().diagnostics();

  // Kept prompt positions per (layer, KV head), sorted for lookup: an entry's own position, or
  // every token a merged entry stands for (Press::merged_positions), so a true top-B token that
  // was merged into an entry counts as kept.
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(config.n_layers * config.n_kv_heads));
  {
    const KvCache& cache = session.cache();
    const Press* state = session.press();  // null when the budget left nothing to compress
    for (int l = 0; l < config.n_layers; ++l) {
      for (int h = 0; h < config.n_kv_heads; ++h) {
        const auto pos = cache.layer(l).heads[static_cast<size_t>(h)].positions();
        auto& dst = kept[static_cast<size_t>(l * config.n_kv_heads + h)];
        for (size_t e = 0; e < pos.size(); ++e) {
          const auto members = state == nullptr
                                   ? std::span<const int32_t>()
                                   : state->merged_positions(l, h, static_cast<int64_t>(e));
          if (members.empty())
            dst.push_back(pos[e]);
          else
            dst.insert(dst.end(), members.begin(), members.end());
        }
        std::sort(dst.begin(), dst.end());
        m.entries += static_cast<int64_t>(pos.size());
        m.tokens_represented += static_cast<int64_t>(dst.size());
      }
    }
  }
  if (options.attention_metrics) {
    if (budget >= prompt_len) {
      m.recall = 1.0;  // nothing was evicted
    } else {
      const int64_t b = std::min(budget, ref.top_count);
      double sum = 0.0;
      int64_t count = 0;
      for (int64_t t = 0; t < steps; ++t) {
        for (int l = 0; l < config.n_layers; ++l) {
          for (int qh = 0; qh < config.n_heads; ++qh) {
            const int64_t slot = (t * config.n_layers + l) * config.n_heads + qh;
            const int32_t* top = ref.top.data() + slot * ref.top_count;
            const int64_t valid = std::find(top, top + b, -1) - top;
            sum +=
                recall({top, static_cast<size_t>(valid)},
                       kept[static_cast<size_t>(l * config.n_kv_heads + qh / config.group_size())]);
            ++count;
          }
        }
      }
      m.recall = sum / static_cast<double>(count);
    }
  }

  double kl_sum = 0.0, nll = 0.0, attended_sum = 0.0;
  int64_t agree = 0;
  ContinuationDecoder decoder{session, observer.step, options.attention_metrics};
  for (int64_t t = 0; t < steps; ++t) {
    const std::span<const float> full_logits(ref.logits.data() + t * vocab,
                                             static_cast<size_t>(vocab));
    const double kl = kl_divergence(full_logits, logits);
    kl_sum += kl;
    m.kl_max = std::max(m.kl_max, kl);
    if (same_top1(full_logits, logits)) ++agree;
    const int32_t token = ref.continuation[static_cast<size_t>(t)];
    nll -= log_softmax_at(logits, token);
    if (decoder.step(t, steps, token, logits)) {
      attended_sum += static_cast<double>(session.prefill_stats().decode_attended_kv_bytes);
    }
  }
  m.kl_mean = kl_sum / static_cast<double>(steps);
  m.top1 = static_cast<double>(agree) / static_cast<double>(steps);
  m.ppl = std::exp(nll / static_cast<double>(steps));
  m.decode_ms_per_token = decoder.ms_per_token();
  m.kv_bytes_attended = decoder.steps > 0 ? attended_sum / static_cast<double>(decoder.steps) : 0.0;
  if (options.attention_metrics) {
    for (int l = 0; l < config.n_layers; ++l) m.attn_err.push_back(observer.layer_error(l));
    if (observer.selected_steps() > 0) m.recall = observer.attended_recall();
  }
  return m;
}

// Adds one sample's metrics of a (press, budget) to its row.
void add_run(FidelityRow& row, const RunMetrics& m, double ppl_full, int64_t budget) {
  if (row.memory_share > 0.0) row.solved_budget.add(static_cast<double>(budget));
  row.kl_mean.add(m.kl_mean);
  row.kl_samples.push_back(m.kl_mean);
  row.top1_samples.push_back(m.top1);
  add_diagnostics(m.diagnostics, row.diagnostics);
  row.kl_max = std::max(row.kl_max, m.kl_max);
  row.top1.add(m.top1);
  row.ppl.add(m.ppl);
  row.ppl_full.add(ppl_full);
  if (!std::isnan(m.recall)) row.recall.add(m.recall);
  double err_sum = 0.0;
  for (size_t l = 0; l < m.attn_err.size(); ++l) {
    row.attn_err_layer[l].add(m.attn_err[l]);
    err_sum += m.attn_err[l];
  }
  if (!m.attn_err.empty()) row.attn_err_mean.add(err_sum / m.attn_err.size());
  row.kv_bytes.add(static_cast<double>(m.kv_bytes));
  row.kv_bytes_attended.add(m.kv_bytes_attended);
  row.entries_stored.add(static_cast<double>(m.entries));
  row.tokens_represented.add(static_cast<double>(m.tokens_represented));
  row.compress_ms.add(m.compress_ms);
  row.prefill_ms.add(m.prefill_ms);
  row.decode_ms_per_token.add(m.decode_ms_per_token);
}

bool row_press_is_full(const nlohmann::json& press) {
  return press.at("spec").get<std::string>() == "full";
}

// The report's rows: press-major; per press the budgets, then the memory shares, in the given
// order. `press_configs`: [{spec, config}].
std::vector<FidelityRow> make_rows(const nlohmann::json& press_configs,
                                   const std::vector<int64_t>& budgets,
                                   const std::vector<double>& memory_shares, int64_t n_layers) {
  std::vector<FidelityRow> rows;
  for (const auto& press : press_configs) {
    const auto add_row = [&](int64_t budget, double share) {
      FidelityRow row;
      row.press = press.at("spec").get<std::string>();
      row.press_config = press.at("config");
      row.budget = budget;
      row.memory_share = share;
      row.attn_err_layer.resize(static_cast<size_t>(n_layers));
      rows.push_back(std::move(row));
    };
    for (int64_t b : budgets) add_row(b, 0.0);
    // The full cache is the 100% every share is measured against: no share rows of its own.
    if (row_press_is_full(press)) continue;
    for (double share : memory_shares) add_row(0, share);
  }
  return rows;
}

// "snapkv @ 128" or "snapkv @ m0.25": a row as the records and errors name it.
std::string row_label(const std::string& press, int64_t budget, double memory_share) {
  return memory_share > 0.0 ? fmt::format("{} @ m{:g}", press, memory_share)
                            : fmt::format("{} @ {}", press, budget);
}

// Adds one sample's record (one line of the results file, computed now or read back when
// resuming) to the report: the same numbers either way, since doubles round-trip exactly.
void add_sample(FidelityReport& report, const nlohmann::json& record) {
  const auto& full = record.at("full");
  const double ppl_full = exact_double(full.at("ppl"));
  report.continuations.push_back(full.at("continuation").get<std::vector<int32_t>>());
  report.reference.ppl.add(ppl_full);
  report.reference.kv_bytes.add(exact_double(full.at(json_keys::kKvBytes)));
  report.reference.prefill_ms.add(exact_double(full.at("prefill_ms")));
  report.reference.decode_ms_per_token.add(exact_double(full.at("decode_ms_per_token")));
  const auto& runs = record.at("runs");
  PROTOKV_CHECK(runs.size() == report.rows.size(), "a sample record has {} runs, {} expected",
                runs.size(), report.rows.size());
  for (size_t r = 0; r < runs.size(); ++r) {
    FidelityRow& row = report.rows[r];
    const auto& run = runs[r];
    const auto press = run.at("press").get<std::string>();
    const auto budget = run.at("budget").get<int64_t>();
    const double share = run.value("memory_share", 0.0);
    PROTOKV_CHECK(
        press == row.press && share == row.memory_share && (share > 0.0 || budget == row.budget),
        "a sample record's run {} is {}, expected {}", r, row_label(press, budget, share),
        row_label(row.press, row.budget, row.memory_share));
    if (run.contains("error")) {
      row.error = run["error"].get<std::string>();
    } else if (run.contains("metrics")) {
      const RunMetrics m = run_metrics_from_json(run["metrics"]);
      PROTOKV_CHECK(m.attn_err.empty() || m.attn_err.size() == row.attn_err_layer.size(),
                    "a sample record has attention errors for {} layers, the model has {}",
                    m.attn_err.size(), row.attn_err_layer.size());
      add_run(row, m, ppl_full, budget);
    }
  }
}

}  // namespace

FidelityReport run_fidelity(const ModelWeights& weights, const std::vector<FidelitySample>& samples,
                            const FidelityOptions& options) {
  const ModelConfig& config = weights.config;
  PROTOKV_CHECK(!samples.empty(), "no samples to evaluate");
  PROTOKV_CHECK(!options.presses.empty(), "give at least one press");
  const size_t points = options.budgets.size() + options.memory_shares.size();
  PROTOKV_CHECK(points > 0, "give at least one budget or memory share");
  PROTOKV_CHECK(options.presses.size() * points <= limits::kMaxEvalRuns,
                "{} presses x {} budgets and memory shares is more than {} runs",
                options.presses.size(), points, limits::kMaxEvalRuns);
  PROTOKV_CHECK(options.continuation >= 1, "continuation must be at least 1 token, got {}",
                options.continuation);
  for (int64_t b : options.budgets) {
    PROTOKV_CHECK(b >= 1, "budget must be a positive number of entries, got {}", b);
  }
  for (double share : options.memory_shares) {
    PROTOKV_CHECK(share > 0.0 && share <= 1.0, "memory share {} outside (0, 1]", share);
  }
  int64_t prompt_len = 0;
  for (const auto& s : samples) {
    PROTOKV_CHECK(!s.prompt.empty(), "empty prompt");
    PROTOKV_CHECK(prompt_len == 0 || static_cast<int64_t>(s.prompt.size()) == prompt_len,
                  "samples must share one prompt length");
    prompt_len = static_cast<int64_t>(s.prompt.size());
    PROTOKV_CHECK(s.continuation.empty() ||
                      static_cast<int64_t>(s.continuation.size()) >= options.continuation,
                  "sample continuation has {} tokens, {} needed", s.continuation.size(),
                  options.continuation);
    check_tokens(config, s.prompt, "prompt");
    check_tokens(config, s.continuation, "continuation");
  }
  PROTOKV_CHECK(prompt_len + options.continuation <= config.context_length,
                "prompt-len {} + continuation {} exceeds the model's context of {} tokens",
                prompt_len, options.continuation, config.context_length);

  std::map<std::string, std::shared_ptr<const PressSpec>> press_of;  // spec -> press
  nlohmann::json press_configs = nlohmann::json::array();
  for (const auto& spec : options.presses) {
    // `full` takes no allocator; every other press gets the requested one.
    const auto press = PressSpec::parse(spec, spec == "full" ? "" : options.alloc);
    press_of[spec] = press;
    press_configs.push_back({{"spec", spec}, {"config", press->config()}});
  }
  // Recall needs the reference's top-B for the largest budget that really compresses.
  int64_t top_count = 0;
  for (int64_t b : options.budgets) {
    if (b < prompt_len) top_count = std::max(top_count, b);
  }

  FidelityReport report;
  report.paired_reference = options.reference;
  if (report.paired_reference.empty()) {
    const bool has_snapkv = std::find(options.presses.begin(), options.presses.end(), "snapkv") !=
                            options.presses.end();
    report.paired_reference = has_snapkv ? "snapkv" : "full";
  }
  PROTOKV_CHECK(report.paired_reference == "full" ||
                    std::find(options.presses.begin(), options.presses.end(),
                              report.paired_reference) != options.presses.end(),
                "reference press {} is not one of the presses compared (or full)",
                report.paired_reference);
  report.rows = make_rows(press_configs, options.budgets, options.memory_shares, config.n_layers);

  // The results file (FidelityOptions::jsonl_path): one line per sample, checked against this
  // header when resuming.
  nlohmann::json model_config = {{"dim", config.dim},
                                 {"n_layers", config.n_layers},
                                 {"n_heads", config.n_heads},
                                 {"n_kv_heads", config.n_kv_heads},
                                 {"vocab_size", config.vocab_size},
                                 {"context_length", config.context_length}};
  nlohmann::json header = {{"eval", "fidelity"},
                           {"model_config", model_config},
                           {"presses", options.presses},
                           {"budgets", options.budgets},
                           {"alloc", options.alloc},
                           {"continuation", options.continuation},
                           {"prompt_len", prompt_len},
                           {"samples", samples.size()},
                           {"greedy", samples.front().continuation.empty()},
                           {"attention_metrics", options.attention_metrics}};
  // Only when given, so that results files written before memory shares existed still resume.
  if (!options.memory_shares.empty()) header["memory_shares"] = options.memory_shares;
  if (options.cache_type != KvCacheType{}) {  // likewise
    header["cache_type_k"] = dtype_name(options.cache_type.key);
    header["cache_type_v"] = dtype_name(options.cache_type.value);
  }
  const EvalShard& shard = options.shard;
  PROTOKV_CHECK(shard_sample_count(shard, static_cast<int64_t>(samples.size())) > 0,
                "--shard {}: no sample falls to this shard ({} samples): use at most {} shards",
                shard.to_string(), samples.size(), samples.size());
  if (shard.active()) header["shard"] = shard.to_string();
  std::map<int64_t, nlohmann::json> previous;  // sample index -> its record
  if (options.resume) {
    PROTOKV_CHECK(!options.jsonl_path.empty(), "resuming needs a results file");
    for (auto& record : read_results_file(options.jsonl_path, header)) {
      const int64_t s = record.value("sample", int64_t{-1});
      PROTOKV_CHECK(
          s >= 0 && s < static_cast<int64_t>(samples.size()) && shard.holds(s) &&
              record.value("origin", nlohmann::json()) == samples[static_cast<size_t>(s)].origin,
          "{}: a record of sample {} that is not among these samples; start afresh",
          options.jsonl_path, s);
      previous[s] = std::move(record);
    }
  }
  std::unique_ptr<ResultsFileWriter> jsonl;
  if (!options.jsonl_path.empty())
    jsonl = std::make_unique<ResultsFileWriter>(options.jsonl_path, header, options.resume);

  Progress progress("eval fidelity",
                    shard_sample_count(shard, static_cast<int64_t>(samples.size())) *
                        static_cast<int64_t>(1 + report.rows.size()),
                    options.progress, options.progress_sink);
  nlohmann::json origins = nlohmann::json::array();
  for (size_t s = 0; s < samples.size(); ++s) {
    const auto& sample = samples[s];
    origins.push_back(sample.origin);
    if (!shard.holds(static_cast<int64_t>(s))) continue;
    if (auto it = previous.find(static_cast<int64_t>(s)); it != previous.end()) {
      try {
        add_sample(report, it->second);
      } catch (const std::exception& e) {  // a JSON type error or a check of add_sample
        fail("{}: the record of sample {}: {}", options.jsonl_path, s, e.what());
      }
      progress.advance(static_cast<int64_t>(1 + report.rows.size()),
                       fmt::format("sample {}/{} (resumed)", s + 1, samples.size()));
      continue;
    }
    progress.set_detail(fmt::format("sample {}/{}: full", s + 1, samples.size()));
    const std::shared_ptr<const PrefilledPrompt> shared =
        options.share_prefill ? PrefilledPrompt::make(weights, sample.prompt) : nullptr;
    // The press runs' own when their cache type is not the reference's F32.
    const bool typed = options.cache_type != KvCacheType{};
    const std::shared_ptr<const PrefilledPrompt> shared_typed =
        options.share_prefill && typed
            ? PrefilledPrompt::make(weights, sample.prompt, 0, options.cache_type)
            : shared;
    std::shared_ptr<const PrefilledPrompt> trial;  // without share_prefill: the solver's own
    // Each memory-share row's budget for this sample (or why the share is out of reach), solved
    // before the reference run, which must record full's top-B for the largest of them too.
    std::vector<int64_t> budgets(report.rows.size(), 0);
    std::vector<std::string> unreachable(report.rows.size());
    int64_t sample_top_count = top_count;
    for (size_t r = 0; r < report.rows.size(); ++r) {
      const FidelityRow& row = report.rows[r];
      budgets[r] = row.budget;
      if (row.memory_share <= 0.0) continue;
      const auto prompt = [&]() -> const PrefilledPrompt& {
        if (shared_typed != nullptr) return *shared_typed;
        if (trial == nullptr)
          trial = PrefilledPrompt::make(weights, sample.prompt, 0, options.cache_type);
        return *trial;
      };
      try {
        budgets[r] = solve_memory_share(weights, press_of.at(row.press), prompt_len, prompt,
                                        row.memory_share, options.cache_type)
                         .entries;
        if (budgets[r] < prompt_len) sample_top_count = std::max(sample_top_count, budgets[r]);
      } catch (const Error& e) {
        unreachable[r] = e.what();
      }
    }
    const Reference ref = run_reference(weights, sample, options, sample_top_count, shared.get());
    nlohmann::json record = {{"sample", s},
                             {"origin", sample.origin},
                             {"full",
                              {{"continuation", ref.continuation},
                               {"ppl", exact(ref.ppl)},
                               {json_keys::kKvBytes, ref.kv_bytes},
                               {"prefill_ms", exact(ref.prefill_ms)},
                               {"decode_ms_per_token", exact(ref.decode_ms_per_token)}}},
                             {"runs", nlohmann::json::array()}};
    progress.advance(1);

    for (size_t r = 0; r < report.rows.size(); ++r) {
      const FidelityRow& row = report.rows[r];
      const int64_t b = budgets[r];
      progress.set_detail(fmt::format("sample {}/{}: {}", s + 1, samples.size(),
                                      row_label(row.press, b, row.memory_share)));
      nlohmann::json run = {{"press", row.press}, {"budget", b}};
      if (row.memory_share > 0.0) run["memory_share"] = row.memory_share;
      if (!unreachable[r].empty()) {
        run["error"] = unreachable[r];
      } else {
        // Every sample tries every row, even after a refusal: a shard's records must be those
        // of the one run they are merged into.
        try {
          run["metrics"] = to_json(run_press(weights, sample, ref, press_of.at(row.press), b,
                                             options, shared_typed.get()));
        } catch (const Error& e) {
          // The press refuses this budget (e.g. below its window): report, keep going.
          run["error"] = e.what();
        }
      }
      record["runs"].push_back(std::move(run));
      progress.advance(1);
    }
    add_sample(report, record);
    if (jsonl) jsonl->append(record);
  }
  progress.finish();

  report.config = {
      {"model_config", model_config},
      {"prompt_len", prompt_len},
      {"continuation", options.continuation},
      {"continuation_source", samples.front().continuation.empty() ? "greedy" : "text"},
      {"samples", samples.size()},
      {"sample_origins", origins},
      {"budgets", options.budgets},
      {"presses", press_configs},
      {"alloc", options.alloc.empty() ? "default" : options.alloc},
      {"cache_type_k", dtype_name(options.cache_type.key)},
      {"cache_type_v", dtype_name(options.cache_type.value)},
      {"mode", "query-aware"},
      {"teacher_forcing", true},
      {"attention_metrics", options.attention_metrics},
      {"metrics",
       {{"kl",
         "KL(full || press) of next-token softmax (double), nats; mean and max over the "
         "continuation steps"},
        {"top1", "share of steps whose argmax equals full's"},
        {"ppl", "exp(mean NLL) of the forced continuation under the press; ppl_full under full"},
        {"attn_err",
         "per layer: ||o - o~|| / ||o|| per query head (ProtoKV Eq. 2), mean over heads and over "
         "the continuation queries"},
        {"recall",
         "share of full's top-B attended prompt positions (B = budget, the solved one on a "
         "memory-share row; per continuation query, layer and query head) kept in that head's KV "
         "head after prefill; mean over all"},
        {"memory_share",
         "a memory-share row (--kv-memory-share S): per sample, the budget at which the press "
         "stores S of the full cache's KV bytes (solved_budget: its mean, min, max)"},
        {json_keys::kStoredShare, "kv_bytes / the full cache's kv_bytes"},
        {json_keys::kAttendedShare, "kv_bytes_attended / the full cache's kv_bytes"},
        {json_keys::kKvBytes, "keys + values held after prefill (exact)"},
        {"entries_stored",
         "cache entries after prefill, all layers and KV heads (mean over samples)"},
        {"tokens_represented",
         "prompt tokens those entries stand for: equal to entries_stored unless the press merges "
         "(chelsea: a merged entry stands for its members; recall counts a member as kept)"},
        {"compress_ms", "time inside the press during prefill"},
        {"spread", "*_std: population std over samples; *_min/*_max over samples"}}},
      {"reference", report.paired_reference},
      {"threads", num_threads()},
      {"version", PROTOKV_VERSION}};
  report.config["metrics"]["paired"] =
      "per (press, budget): press minus reference on the same samples; mean, se = sample std / "
      "sqrt(n), ci95 = mean +- t(0.975, n-1) * se";
  if (options.share_prefill) report.config["share_prefill"] = true;
  if (!options.memory_shares.empty()) report.config["memory_shares"] = options.memory_shares;
  if (shard.active()) report.config["shard"] = {{"index", shard.index}, {"count", shard.count}};
  return report;
}

FidelityReport merge_fidelity_runs(const std::vector<std::string>& dirs,
                                   const std::string& out_dir) {
  namespace fs = std::filesystem;
  PROTOKV_CHECK(!dirs.empty(), "eval merge: no folder given");
  std::vector<ShardFolder> folders;
  for (const auto& dir : dirs) {
    folders.push_back(read_shard_folder(dir));
    PROTOKV_CHECK(folders.back().config.contains("teacher_forcing"),
                  "{}/config.json: not the configuration of an eval fidelity run", dir);
  }
  const ShardFolder& first = folders.front();
  FidelityReport report;
  report.config = check_shard_set(folders);
  int64_t samples = 0;
  try {
    const nlohmann::json& c = report.config;
    samples = c.at("samples").get<int64_t>();
    report.paired_reference = c.at("reference").get<std::string>();
    report.rows = make_rows(c.at("presses"), c.at("budgets").get<std::vector<int64_t>>(),
                            c.value("memory_shares", std::vector<double>{}),
                            c.at("model_config").at("n_layers").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    fail("{}/config.json: {}", first.dir, e.what());
  }
  nlohmann::json header;                      // the results files' header, the shard aside
  std::map<int64_t, nlohmann::json> records;  // by sample index
  for (const auto& f : folders) {
    const std::string path = (fs::path(f.dir) / "samples.jsonl").string();
    nlohmann::json shard_header = read_results_header(path);
    nlohmann::json common = shard_header;
    common.erase("shard");
    PROTOKV_CHECK(shard_header.value("shard", std::string()) ==
                      (f.shard.active() ? f.shard.to_string() : std::string()),
                  "{}: its header's shard is not its config.json's {}", path, f.shard.to_string());
    if (header.is_null()) header = common;
    PROTOKV_CHECK(common == header, "{}: written with another configuration than {}", path,
                  first.dir);
    int64_t found = 0;
    for (auto& record : read_results_file(path, shard_header)) {
      const int64_t s = record.value("sample", int64_t{-1});
      PROTOKV_CHECK(s >= 0 && s < samples && f.shard.holds(s),
                    "{}: a record of sample {}, not one of shard {}", path, s, f.shard.to_string());
      PROTOKV_CHECK(records.emplace(s, std::move(record)).second, "{}: sample {} twice", path, s);
      ++found;
    }
    const int64_t expected = shard_sample_count(f.shard, samples);
    PROTOKV_CHECK(found == expected,
                  "{}: {} of {} samples: the shard did not finish (resume it with --resume)", path,
                  found, expected);
  }
  // One run's order: every sample's record added in sample order.
  for (auto& [s, record] : records) {
    try {
      add_sample(report, record);
    } catch (const std::exception& e) {
      fail("the record of sample {}: {}", s, e.what());
    }
  }
  if (!out_dir.empty()) {
    write_report_dir(report, out_dir);
    ResultsFileWriter jsonl((fs::path(out_dir) / "samples.jsonl").string(), header,
                            /*resume=*/false);
    for (const auto& [s, record] : records) jsonl.append(record);
  }
  return report;
}

}  // namespace protokv::eval
