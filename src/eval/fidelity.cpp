#include "eval/fidelity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "eval/progress.h"
#include "eval/report/table.h"
#include "eval/svg_plot.h"
#include "eval/synthetic.h"
#include "press/scoring_press.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
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

  void on_attention_output(int layer, const float* out, int n_heads, int head_dim) override {
    const int64_t width = int64_t{n_heads} * head_dim;
    std::copy(out, out + width, ref_.attn_out.begin() + (step * config_.n_layers + layer) * width);
  }
  bool wants_probabilities() const override { return true; }
  void on_attention_probs(int layer, int q_head, std::span<const float> probs,
                          std::span<const int32_t> positions) override {
    if (ref_.top_count == 0) return;
    const auto top =
        top_positions(probs, positions, static_cast<int32_t>(prompt_len_), ref_.top_count);
    const int64_t slot = ((step * config_.n_layers + layer) * config_.n_heads + q_head);
    auto dst = ref_.top.begin() + slot * ref_.top_count;
    std::fill(dst, dst + ref_.top_count, -1);
    std::copy(top.begin(), top.end(), dst);
  }

 private:
  Reference& ref_;
  const ModelConfig& config_;
  int64_t prompt_len_;
};

// Compares a press run's attention outputs with the reference, per head (ProtoKV Eq. 2).
// Asks for probabilities too, only so that both runs take the same engine code path.
class ComparingObserver final : public DecodeObserver {
 public:
  ComparingObserver(const Reference& ref, const ModelConfig& config, int64_t steps)
      : ref_(ref), config_(config), errors_(static_cast<size_t>(steps * config.n_layers), kNaN) {}
  int64_t step = 0;

  void on_attention_output(int layer, const float* out, int n_heads, int head_dim) override {
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
  std::vector<double> errors_;  // [steps, n_layers]
};

void check_tokens(const ModelConfig& config, const std::vector<int32_t>& tokens, const char* what) {
  for (int32_t t : tokens) {
    PROTOKV_CHECK(t >= 0 && t < config.vocab_size, "{} token {} outside the vocabulary [0, {})",
                  what, t, config.vocab_size);
  }
}

Reference run_reference(const ModelWeights& weights, const FidelitySample& sample,
                        const FidelityOptions& options, int64_t top_count) {
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
  auto logits = session.prefill(sample.prompt);
  ref.prefill_ms = session.prefill_stats().prefill_ms;
  ref.kv_bytes = session.prefill_stats().kv_bytes;
  const bool greedy = sample.continuation.empty();
  ref.continuation = sample.continuation;
  ref.continuation.resize(static_cast<size_t>(steps));
  double nll = 0.0;
  double decode_ms = 0.0;
  int64_t decodes = 0;
  for (int64_t t = 0; t < steps; ++t) {
    std::copy(logits.begin(), logits.end(), ref.logits.begin() + t * vocab);
    if (greedy) ref.continuation[static_cast<size_t>(t)] = argmax(logits);
    const int32_t token = ref.continuation[static_cast<size_t>(t)];
    nll -= log_softmax_at(logits, token);
    // The last token is decoded only for its attention (its logits predict nothing we score).
    if (t + 1 < steps || options.attention_metrics) {
      observer.step = t;
      Timer timer;
      logits = session.decode(token);
      decode_ms += timer.ms();
      ++decodes;
    }
  }
  ref.ppl = std::exp(nll / static_cast<double>(steps));
  ref.decode_ms_per_token = decodes > 0 ? decode_ms / static_cast<double>(decodes) : 0.0;
  return ref;
}

// One sample's metrics for one (press, budget).
struct RunMetrics {
  nlohmann::json diagnostics;  // the press's own, per layer (ProtoKV), or null
  double kl_mean = 0.0, kl_max = 0.0, top1 = 0.0, ppl = 0.0, recall = kNaN;
  std::vector<double> attn_err;  // [n_layers]
  size_t kv_bytes = 0;
  double compress_ms = 0.0, prefill_ms = 0.0, decode_ms_per_token = 0.0;
};

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
                     const Reference& ref, Press& press, int64_t budget,
                     const FidelityOptions& options) {
  const ModelConfig& config = weights.config;
  const int64_t steps = options.continuation;
  const int64_t vocab = config.vocab_size;
  const int64_t prompt_len = static_cast<int64_t>(sample.prompt.size());
  SessionOptions session_options;
  session_options.press = &press;
  session_options.budget.entries = budget;
  Session session(weights, session_options);
  ComparingObserver observer(ref, config, steps);
  if (options.attention_metrics) session.set_observer(&observer);

  RunMetrics m;
  auto logits = session.prefill(sample.prompt);
  const PrefillStats& stats = session.prefill_stats();
  m.kv_bytes = stats.kv_bytes;
  m.compress_ms = stats.compress_ms;
  m.prefill_ms = stats.prefill_ms;
  if (auto* scoring = dynamic_cast<press::ScoringPress*>(&press))
    m.diagnostics = scoring->scorer().diagnostics();

  if (options.attention_metrics) {
    if (budget >= prompt_len) {
      m.recall = 1.0;  // nothing was evicted
    } else {
      // Kept prompt positions per (layer, KV head), sorted for lookup.
      const KvCache& cache = session.cache();
      std::vector<std::vector<int32_t>> kept(
          static_cast<size_t>(config.n_layers * config.n_kv_heads));
      for (int l = 0; l < config.n_layers; ++l) {
        for (int h = 0; h < config.n_kv_heads; ++h) {
          const auto pos = cache.layer(l).heads[static_cast<size_t>(h)].positions();
          auto& dst = kept[static_cast<size_t>(l * config.n_kv_heads + h)];
          dst.assign(pos.begin(), pos.end());
          std::sort(dst.begin(), dst.end());
        }
      }
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

  double kl_sum = 0.0, nll = 0.0, decode_ms = 0.0;
  int64_t agree = 0, decodes = 0;
  for (int64_t t = 0; t < steps; ++t) {
    const std::span<const float> full_logits(ref.logits.data() + t * vocab,
                                             static_cast<size_t>(vocab));
    const double kl = kl_divergence(full_logits, logits);
    kl_sum += kl;
    m.kl_max = std::max(m.kl_max, kl);
    if (same_top1(full_logits, logits)) ++agree;
    const int32_t token = ref.continuation[static_cast<size_t>(t)];
    nll -= log_softmax_at(logits, token);
    if (t + 1 < steps || options.attention_metrics) {
      observer.step = t;
      Timer timer;
      logits = session.decode(token);
      decode_ms += timer.ms();
      ++decodes;
    }
  }
  m.kl_mean = kl_sum / static_cast<double>(steps);
  m.top1 = static_cast<double>(agree) / static_cast<double>(steps);
  m.ppl = std::exp(nll / static_cast<double>(steps));
  m.decode_ms_per_token = decodes > 0 ? decode_ms / static_cast<double>(decodes) : 0.0;
  if (options.attention_metrics) {
    for (int l = 0; l < config.n_layers; ++l) m.attn_err.push_back(observer.layer_error(l));
  }
  return m;
}

std::string format_metric(double v, int precision = 4) {
  if (std::isnan(v)) return "-";
  if (v == 0.0) return "0";
  if (std::abs(v) < std::pow(10.0, -precision + 1)) return fmt::format("{:.2e}", v);
  return fmt::format("{:.{}f}", v, precision);
}

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

FidelityReport run_fidelity(const ModelWeights& weights, const std::vector<FidelitySample>& samples,
                            const FidelityOptions& options) {
  const ModelConfig& config = weights.config;
  PROTOKV_CHECK(!samples.empty(), "no samples to evaluate");
  PROTOKV_CHECK(!options.presses.empty(), "give at least one press (--press)");
  PROTOKV_CHECK(!options.budgets.empty(), "give at least one budget (--budget)");
  PROTOKV_CHECK(options.continuation >= 1, "--continuation must be at least 1, got {}",
                options.continuation);
  for (int64_t b : options.budgets) {
    PROTOKV_CHECK(b >= 1, "budget must be a positive number of entries, got {}", b);
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

  std::vector<std::unique_ptr<Press>> presses;
  nlohmann::json press_configs = nlohmann::json::array();
  for (const auto& spec : options.presses) {
    // `full` takes no allocator; every other press gets the requested one.
    presses.push_back(make_press(spec, spec == "full" ? "" : options.alloc));
    press_configs.push_back({{"spec", spec}, {"config", presses.back()->config()}});
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
                "--reference {} is not one of the presses given with --press (or full)",
                report.paired_reference);
  for (size_t p = 0; p < presses.size(); ++p) {
    for (int64_t b : options.budgets) {
      FidelityRow row;
      row.press = options.presses[p];
      row.press_config = press_configs[p]["config"];
      row.budget = b;
      row.attn_err_layer.resize(static_cast<size_t>(config.n_layers));
      report.rows.push_back(std::move(row));
    }
  }

  Progress progress("eval fidelity",
                    static_cast<int64_t>(samples.size() * (1 + report.rows.size())),
                    options.progress);
  nlohmann::json origins = nlohmann::json::array();
  for (size_t s = 0; s < samples.size(); ++s) {
    const auto& sample = samples[s];
    origins.push_back(sample.origin);
    progress.set_detail(fmt::format("sample {}/{}: full", s + 1, samples.size()));
    const Reference ref = run_reference(weights, sample, options, top_count);
    report.continuations.push_back(ref.continuation);
    report.reference.ppl.add(ref.ppl);
    report.reference.kv_bytes.add(static_cast<double>(ref.kv_bytes));
    report.reference.prefill_ms.add(ref.prefill_ms);
    report.reference.decode_ms_per_token.add(ref.decode_ms_per_token);
    progress.advance(1);

    size_t r = 0;
    for (size_t p = 0; p < presses.size(); ++p) {
      for (int64_t b : options.budgets) {
        FidelityRow& row = report.rows[r++];
        progress.set_detail(
            fmt::format("sample {}/{}: {} @ {}", s + 1, samples.size(), row.press, b));
        if (row.error.empty()) {
          try {
            const RunMetrics m = run_press(weights, sample, ref, *presses[p], b, options);
            row.kl_mean.add(m.kl_mean);
            row.kl_samples.push_back(m.kl_mean);
            row.top1_samples.push_back(m.top1);
            add_diagnostics(m.diagnostics, row.diagnostics);
            row.kl_max = std::max(row.kl_max, m.kl_max);
            row.top1.add(m.top1);
            row.ppl.add(m.ppl);
            row.ppl_full.add(ref.ppl);
            if (!std::isnan(m.recall)) row.recall.add(m.recall);
            double err_sum = 0.0;
            for (size_t l = 0; l < m.attn_err.size(); ++l) {
              row.attn_err_layer[l].add(m.attn_err[l]);
              err_sum += m.attn_err[l];
            }
            if (!m.attn_err.empty()) row.attn_err_mean.add(err_sum / m.attn_err.size());
            row.kv_bytes.add(static_cast<double>(m.kv_bytes));
            row.compress_ms.add(m.compress_ms);
            row.prefill_ms.add(m.prefill_ms);
            row.decode_ms_per_token.add(m.decode_ms_per_token);
          } catch (const Error& e) {
            // The press refuses this budget (e.g. below its window): report, keep going.
            row.error = e.what();
          }
        }
        progress.advance(1);
      }
    }
  }
  progress.finish();

  report.config = {
      {"model_config",
       {{"dim", config.dim},
        {"n_layers", config.n_layers},
        {"n_heads", config.n_heads},
        {"n_kv_heads", config.n_kv_heads},
        {"vocab_size", config.vocab_size},
        {"context_length", config.context_length}}},
      {"prompt_len", prompt_len},
      {"continuation", options.continuation},
      {"continuation_source", samples.front().continuation.empty() ? "greedy" : "text"},
      {"samples", samples.size()},
      {"sample_origins", origins},
      {"budgets", options.budgets},
      {"presses", press_configs},
      {"alloc", options.alloc.empty() ? "default" : options.alloc},
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
         "share of full's top-B attended prompt positions (B = budget, per continuation query, "
         "layer and query head) kept in that head's KV head after prefill; mean over all"},
        {"kv_bytes", "keys + values held after prefill (exact)"},
        {"compress_ms", "time inside the press during prefill"},
        {"spread", "*_std: population std over samples; *_min/*_max over samples"}}},
      {"reference", report.paired_reference},
      {"threads", num_threads()},
      {"version", PROTOKV_VERSION}};
  report.config["metrics"]["paired"] =
      "per (press, budget): press minus reference on the same samples; mean, se = sample std / "
      "sqrt(n), ci95 = mean +- t(0.975, n-1) * se";
  return report;
}

std::vector<FidelitySample> samples_from_text(const Tokenizer& tokenizer, const std::string& text,
                                              int64_t prompt_len, int64_t continuation, int count) {
  PROTOKV_CHECK(prompt_len >= 2, "--prompt-len must be at least 2, got {}", prompt_len);
  PROTOKV_CHECK(count >= 1, "--samples must be at least 1, got {}", count);
  const std::vector<int32_t> tokens = tokenizer.encode(text, false);
  const int64_t need = prompt_len - 1 + continuation;  // BOS is added to every prompt
  const int64_t have = static_cast<int64_t>(tokens.size());
  PROTOKV_CHECK(have >= need,
                "the text has {} tokens; prompt-len {} (BOS included) + continuation {} need {}",
                have, prompt_len, continuation, need);
  std::vector<FidelitySample> samples;
  for (int s = 0; s < count; ++s) {
    const int64_t offset = count == 1 ? 0 : (have - need) * s / (count - 1);
    FidelitySample sample;
    sample.prompt.push_back(tokenizer.bos_id());
    sample.prompt.insert(sample.prompt.end(), tokens.begin() + offset,
                         tokens.begin() + offset + prompt_len - 1);
    sample.continuation.assign(tokens.begin() + offset + prompt_len - 1,
                               tokens.begin() + offset + need);
    sample.origin = {{"source", "text"}, {"token_offset", offset}, {"text_tokens", have}};
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::vector<FidelitySample> samples_from_model(const ModelWeights& weights, int32_t bos,
                                               int32_t eos, int64_t prompt_len,
                                               int64_t continuation, int count, uint64_t seed) {
  PROTOKV_CHECK(prompt_len >= 2, "--prompt-len must be at least 2, got {}", prompt_len);
  PROTOKV_CHECK(count >= 1, "--samples must be at least 1, got {}", count);
  const int64_t need = prompt_len + continuation;
  const int64_t context = weights.config.context_length;
  std::vector<FidelitySample> samples;
  for (int s = 0; s < count; ++s) {
    SamplerOptions sampler_options;
    sampler_options.temperature = 1.0f;
    sampler_options.top_k = 0;
    sampler_options.top_p = 1.0f;
    sampler_options.seed = seed + static_cast<uint64_t>(s);
    Sampler sampler(sampler_options);
    std::vector<int32_t> stream;
    int stories = 0;
    while (static_cast<int64_t>(stream.size()) < need) {
      // A new story from BOS; every restart adds at least the BOS, so this terminates.
      ++stories;
      stream.push_back(bos);
      Session session(weights);
      const int32_t start[] = {bos};
      auto logits = session.prefill(start);
      while (static_cast<int64_t>(stream.size()) < need) {
        const int32_t token = sampler.sample(logits);
        if (token == eos || token == bos) break;
        stream.push_back(token);
        if (session.n_past() >= context) break;
        logits = session.decode(token);
      }
    }
    FidelitySample sample;
    sample.prompt.assign(stream.begin(), stream.begin() + prompt_len);
    sample.continuation.assign(stream.begin() + prompt_len, stream.begin() + need);
    sample.origin = {{"source", "model-sampled"},
                     {"seed", sampler_options.seed},
                     {"temperature", 1.0},
                     {"stories", stories}};
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::vector<FidelitySample> samples_synthetic(int vocab_size, int64_t prompt_len, int count,
                                              uint64_t seed) {
  PROTOKV_CHECK(count >= 1, "--samples must be at least 1, got {}", count);
  std::vector<FidelitySample> samples;
  for (int s = 0; s < count; ++s) {
    FidelitySample sample;
    sample.prompt = make_synthetic_prompt(prompt_len, vocab_size, seed + static_cast<uint64_t>(s));
    sample.origin = {{"source", "SYNTHETIC workload"}, {"seed", seed + static_cast<uint64_t>(s)}};
    samples.push_back(std::move(sample));
  }
  return samples;
}

namespace {

// The reference's per-sample KL and top-1 at `budget` ("full": KL 0, top-1 1 on every sample).
bool reference_samples(const FidelityReport& report, int64_t budget, size_t count,
                       std::vector<double>& kl, std::vector<double>& top1) {
  if (report.paired_reference == "full") {
    kl.assign(count, 0.0);
    top1.assign(count, 1.0);
    return true;
  }
  for (const auto& row : report.rows) {
    if (row.press == report.paired_reference && row.budget == budget && row.error.empty()) {
      kl = row.kl_samples;
      top1 = row.top1_samples;
      return true;
    }
  }
  return false;
}

struct RowPairs {
  bool valid = false;
  PairedDifference kl, top1;
};

RowPairs row_pairs(const FidelityReport& report, const FidelityRow& row) {
  RowPairs out;
  std::vector<double> kl, top1;
  if (!row.error.empty() || !reference_samples(report, row.budget, row.kl_samples.size(), kl, top1))
    return out;
  out.valid = true;
  out.kl = paired_difference(row.kl_samples, kl);
  out.top1 = paired_difference(row.top1_samples, top1);
  return out;
}

nlohmann::json paired_json(const PairedDifference& d) {
  return {{"mean", number_or_null(d.mean)},
          {"se", number_or_null(d.se)},
          {"ci95", {number_or_null(d.lo), number_or_null(d.hi)}},
          {"samples", d.samples}};
}

// "+0.0050 ± 0.0036" (half-width of the 95% interval), "*" when the interval excludes 0.
std::string format_paired(const PairedDifference& d, int precision) {
  if (d.samples == 0) return "-";
  if (std::isnan(d.se)) return fmt::format("{:+.{}f}", d.mean, precision);
  const bool significant = d.lo > 0.0 || d.hi < 0.0;
  return fmt::format("{:+.{}f}±{:.{}f}{}", d.mean, precision, (d.hi - d.lo) / 2.0, precision,
                     significant ? "*" : "");
}

}  // namespace

nlohmann::json to_json(const FidelityReport& report) {
  nlohmann::json results = nlohmann::json::array();
  for (const auto& row : report.rows) {
    nlohmann::json r = {{"press", row.press},
                        {"press_config", row.press_config},
                        {"budget", row.budget},
                        {"samples", row.kl_mean.count()}};
    if (!row.error.empty()) {
      r["error"] = row.error;
      results.push_back(std::move(r));
      continue;
    }
    nlohmann::json attn = nlohmann::json::array();
    for (const auto& layer : row.attn_err_layer) {
      attn.push_back(layer.count() > 0 ? number_or_null(layer.mean()) : nlohmann::json(nullptr));
    }
    const auto stat = [](const RunningStats& s) {
      return s.count() > 0 ? number_or_null(s.mean()) : nlohmann::json(nullptr);
    };
    const auto spread = [](const RunningStats& s) {
      return s.count() > 0 ? number_or_null(s.stddev()) : nlohmann::json(nullptr);
    };
    r["kl_mean"] = stat(row.kl_mean);
    r["kl_mean_std"] = spread(row.kl_mean);
    r["kl_mean_min"] = number_or_null(row.kl_mean.min());
    r["kl_mean_max"] = number_or_null(row.kl_mean.max());
    r["kl_max"] = row.kl_max;
    r["top1"] = stat(row.top1);
    r["top1_std"] = spread(row.top1);
    r["ppl"] = stat(row.ppl);
    r["ppl_std"] = spread(row.ppl);
    r["ppl_full"] = stat(row.ppl_full);
    r["attn_err"] = attn;
    r["attn_err_mean"] = stat(row.attn_err_mean);
    r["recall"] = stat(row.recall);
    r["recall_std"] = spread(row.recall);
    r["kv_bytes"] = stat(row.kv_bytes);
    r["compress_ms"] = stat(row.compress_ms);
    r["prefill_ms"] = stat(row.prefill_ms);
    r["decode_ms_per_token"] = stat(row.decode_ms_per_token);
    r["per_sample"] = {{"kl_mean", row.kl_samples}, {"top1", row.top1_samples}};
    if (const RowPairs pairs = row_pairs(report, row); pairs.valid) {
      r["paired"] = {{"reference", report.paired_reference},
                     {"kl_mean_diff", paired_json(pairs.kl)},
                     {"top1_diff", paired_json(pairs.top1)}};
    }
    if (!row.diagnostics.empty()) {
      // Per layer, each value the mean over samples of the mean over KV heads.
      nlohmann::json layers = nlohmann::json::array();
      size_t n_layers = 0;
      for (const auto& [key, stats] : row.diagnostics) n_layers = std::max(n_layers, stats.size());
      for (size_t l = 0; l < n_layers; ++l) {
        nlohmann::json layer = {{"layer", l}};
        for (const auto& [key, stats] : row.diagnostics)
          layer[key] = l < stats.size() && stats[l].count() > 0 ? number_or_null(stats[l].mean())
                                                                : nlohmann::json(nullptr);
        layers.push_back(std::move(layer));
      }
      r["protokv_diagnostics"] = std::move(layers);
    }
    results.push_back(std::move(r));
  }
  nlohmann::json reference = {{"ppl", report.reference.ppl.mean()},
                              {"kv_bytes", report.reference.kv_bytes.mean()},
                              {"prefill_ms", report.reference.prefill_ms.mean()},
                              {"decode_ms_per_token", report.reference.decode_ms_per_token.mean()}};
  return {{"config", report.config}, {"full", reference}, {"results", results}};
}

std::string render_table(const FidelityReport& report) {
  const bool spread = report.reference.ppl.count() > 1;
  Table table;
  table.add_column("press", Table::Align::kLeft);
  table.add_column("budget");
  table.add_column("KL mean");
  if (spread) table.add_column("±std");
  table.add_column("KL max");
  table.add_column("dKL vs " + report.paired_reference);
  table.add_column("top-1");
  table.add_column("d top-1");
  table.add_column("ppl");
  table.add_column("recall");
  table.add_column("attn err");
  table.add_column("KV KiB");
  table.add_column("compress ms");
  for (const auto& row : report.rows) {
    std::vector<std::string> cells = {row.press, fmt::format("{}", row.budget)};
    if (!row.error.empty()) {
      cells.push_back("n/a: " + row.error);
      while (cells.size() < 13u + (spread ? 1u : 0u)) cells.push_back("");
      table.add_row(std::move(cells));
      continue;
    }
    const auto mean_or_nan = [](const RunningStats& s) { return s.count() > 0 ? s.mean() : kNaN; };
    cells.push_back(format_metric(row.kl_mean.mean()));
    if (spread) cells.push_back(format_metric(row.kl_mean.stddev()));
    cells.push_back(format_metric(row.kl_max));
    const RowPairs pairs = row_pairs(report, row);
    cells.push_back(pairs.valid ? format_paired(pairs.kl, 4) : "-");
    cells.push_back(fmt::format("{:.3f}", row.top1.mean()));
    cells.push_back(pairs.valid ? format_paired(pairs.top1, 3) : "-");
    cells.push_back(fmt::format("{:.3f}", row.ppl.mean()));
    cells.push_back(format_metric(mean_or_nan(row.recall), 3));
    cells.push_back(format_metric(mean_or_nan(row.attn_err_mean), 3));
    cells.push_back(fmt::format("{:.1f}", row.kv_bytes.mean() / 1024.0));
    cells.push_back(fmt::format("{:.2f}", row.compress_ms.mean()));
    table.add_row(std::move(cells));
  }
  std::string out = fmt::format(
      "full cache: ppl {:.3f}, KV {:.1f} KiB, prefill {:.1f} ms, decode {:.2f} ms/token "
      "({} sample{})\n",
      report.reference.ppl.mean(), report.reference.kv_bytes.mean() / 1024.0,
      report.reference.prefill_ms.mean(), report.reference.decode_ms_per_token.mean(),
      report.reference.ppl.count(), report.reference.ppl.count() == 1 ? "" : "s");
  out += table.render();
  out += fmt::format(
      "dKL, d top-1: paired difference against {} on the same samples, ± half-width of the 95% "
      "t interval; * = the interval excludes 0\n",
      report.paired_reference);
  return out;
}

std::vector<std::string> write_report_dir(const FidelityReport& report, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  PROTOKV_CHECK(!ec, "cannot create output directory {}: {}", dir, ec.message());
  std::vector<std::string> written;
  const auto write = [&](const std::string& name, const std::string& content) {
    const fs::path path = fs::path(dir) / name;
    std::ofstream out(path, std::ios::binary);
    out << content;
    out.close();
    PROTOKV_CHECK(out.good(), "cannot write {}", path.string());
    written.push_back(path.string());
  };
  write("results.json", to_json(report).dump(2) + "\n");
  write("config.json", report.config.dump(2) + "\n");

  struct Metric {
    const char* file;
    const char* title;
    const char* y_label;
    double (*get)(const FidelityRow&);
  };
  static const Metric kMetrics[] = {
      {"kl_mean.svg", "Mean next-token KL(full || press)", "KL (nats)",
       [](const FidelityRow& r) { return r.kl_mean.count() ? r.kl_mean.mean() : kNaN; }},
      {"top1.svg", "Top-1 agreement with full", "share of steps",
       [](const FidelityRow& r) { return r.top1.count() ? r.top1.mean() : kNaN; }},
      {"ppl.svg", "Perplexity of the continuation", "perplexity",
       [](const FidelityRow& r) { return r.ppl.count() ? r.ppl.mean() : kNaN; }},
      {"recall.svg", "Top-B attention recall", "share of full's top-B kept",
       [](const FidelityRow& r) { return r.recall.count() ? r.recall.mean() : kNaN; }},
      {"attn_err.svg", "Attention-output relative error (mean over layers)", "||o - o~|| / ||o||",
       [](const FidelityRow& r) {
         return r.attn_err_mean.count() ? r.attn_err_mean.mean() : kNaN;
       }},
  };
  const std::string subtitle =
      fmt::format(" (prompt {}, continuation {})", report.config.value("prompt_len", int64_t{0}),
                  report.config.value("continuation", int64_t{0}));
  for (const auto& metric : kMetrics) {
    LinePlot plot;
    plot.title = std::string(metric.title) + subtitle;
    plot.x_label = "budget (entries per KV head)";
    plot.y_label = metric.y_label;
    plot.log2_x = true;
    for (const auto& row : report.rows) {
      auto it = std::find_if(plot.series.begin(), plot.series.end(),
                             [&](const PlotSeries& s) { return s.name == row.press; });
      if (it == plot.series.end()) {
        plot.series.push_back({row.press, {}});
        it = plot.series.end() - 1;
      }
      it->points.emplace_back(static_cast<double>(row.budget), metric.get(row));
    }
    if (std::string(metric.file) == "ppl.svg" && report.reference.ppl.count() > 0) {
      PlotSeries full{"full (reference)", {}};
      for (int64_t b : report.config.value("budgets", std::vector<int64_t>{})) {
        full.points.emplace_back(static_cast<double>(b), report.reference.ppl.mean());
      }
      plot.series.push_back(std::move(full));
    }
    write(metric.file, render_svg(plot));
  }
  return written;
}

}  // namespace protokv::eval
