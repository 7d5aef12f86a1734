// SPDX-License-Identifier: Apache-2.0
#include "eval/longctx_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/units.h"
#include "eval/fidelity.h"
#include "eval/longbench.h"
#include "eval/report/table.h"
#include "eval/results_file.h"
#include "eval/svg_plot.h"
#include "protokv/error.h"
#include "protokv/limits.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {
namespace {

namespace fs = std::filesystem;

// Checks the run, opens the output folder (samples.jsonl there is the resume file) and states
// the configuration every benchmark shares.
void prepare(const LoadedModel& model, const std::string& benchmark, LongctxBenchmarkRun& run) {
  PROTOKV_CHECK(model.tokenizer != nullptr, "{}: the model file carries no tokenizer", model.path);
  PROTOKV_CHECK(run.limit >= 0, "limit must be >= 0, got {}", run.limit);
  PROTOKV_CHECK(!run.options.resume || !run.out_dir.empty(),
                "resuming needs an output folder (--out DIR)");
  if (!run.out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(run.out_dir, ec);
    PROTOKV_CHECK(!ec, "cannot create {}: {}", run.out_dir, ec.message());
    run.options.jsonl_path = (fs::path(run.out_dir) / "samples.jsonl").string();
  }
  run.options.progress_label = benchmark;
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : run.options.runs) {
    nlohmann::json entry = {{"label", r.label()},
                            {"press", r.press},
                            {"budget", r.budget.is_set() ? nlohmann::json(r.budget.to_string())
                                                         : nlohmann::json(nullptr)}};
    // A ratio budget: the kept share of the compressed prompt (kvpress's compression ratio is
    // 1 minus it), for the score-by-ratio table.
    if (r.budget.is_set() && r.budget.entries <= 0) entry["kept_share"] = r.budget.ratio;
    runs.push_back(std::move(entry));
  }
  nlohmann::json& c = run.config;
  c["benchmark"] = benchmark;
  c["model"] = model_json(model);
  c["runs"] = runs;
  c["alloc"] = run.options.alloc.empty() ? "default" : run.options.alloc;
  c["mode"] = run.options.query_agnostic ? "query-agnostic" : "query-aware";
  c["reference"] = run.options.reference;
  c["cache_type_k"] = dtype_name(run.options.cache_type.key);
  c["cache_type_v"] = dtype_name(run.options.cache_type.value);
  c["limit"] = run.limit;
  c["threads"] = num_threads();
  c["decoding"] = "greedy (argmax), stop at EOS";
  c["chat_template"] = "none (plain prompt)";
  // How the records were made (the same records either way; timings differ).
  if (run.options.share_prefill) c["share_prefill"] = true;
  if (run.options.batch_decode) c["batch_decode"] = true;
}

void apply_limit(std::vector<LongctxSample>& samples, int64_t limit) {
  if (limit > 0 && static_cast<int64_t>(samples.size()) > limit)
    samples.resize(static_cast<size_t>(limit));
}

std::string format_diff(const LongctxSummary& s) {
  if (s.paired == 0) return "-";
  return fmt::format("{:+.1f} ± {:.1f}", 100.0 * s.diff_mean, 100.0 * s.diff_ci95);
}

// The main table: one row per run.
std::string summary_table(const std::vector<LongctxSummary>& summaries,
                          const std::string& score_name) {
  Table table;
  table.add_column("run", Table::Align::kLeft);
  table.add_column(score_name);
  table.add_column("Δ vs ref (95%)");
  table.add_column("scored");
  table.add_column("skipped");
  table.add_column("compress ms");
  table.add_column("KV at answer");
  table.add_column("stored share");
  table.add_column("attended share");
  table.add_column("prefill peak KV");
  auto share = [](double x) {
    return std::isnan(x) ? std::string("-") : fmt::format("{:.1f}%", 100.0 * x);
  };
  for (const auto& s : summaries)
    table.add_row({s.run, s.scored > 0 ? fmt::format("{:.1f}", 100.0 * s.mean_score) : "-",
                   format_diff(s), std::to_string(s.scored), std::to_string(s.skipped),
                   fmt::format("{:.2f}", s.compress_ms), format_bytes(s.kv_bytes, 2),
                   share(s.stored_share), share(s.attended_share),
                   format_bytes(s.peak_kv_bytes, 2)});
  return table.render();
}

nlohmann::json summaries_json(const std::vector<LongctxSummary>& summaries) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : summaries) j.push_back(s.to_json());
  return j;
}

// Rows: runs other than the reference; columns: per group (task, length, dataset...), the paired
// difference against the reference on the samples both scored, in points, with its 95% Student-t
// interval ("+x.x ± y.y"; no interval with one pair, "-" with none). `out[run][group]` gets
// {"diff", "ci95", "paired"} in points (ci95: the half-width; null without an interval).
std::string paired_group_table(const std::vector<LongctxRecord>& records,
                               const std::vector<std::string>& runs,
                               const std::vector<std::string>& groups, const std::string& group_key,
                               const std::string& reference, nlohmann::json& out) {
  out = nlohmann::json::object();
  if (std::find(runs.begin(), runs.end(), reference) == runs.end()) return "";
  Table table;
  table.add_column("Δ vs " + reference + " (95%)", Table::Align::kLeft);
  for (const auto& g : groups) table.add_column(g);
  std::vector<std::vector<LongctxSummary>> per_group;  // [group][run]
  per_group.reserve(groups.size());
  for (const auto& g : groups)
    per_group.push_back(summarize(records, runs, reference, [&](const LongctxRecord& r) {
      return r.meta.value(group_key, std::string()) == g;
    }));
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string& label = runs[i];
    if (label == reference) continue;
    std::vector<std::string> row = {label};
    for (size_t k = 0; k < groups.size(); ++k) {
      const auto& s = per_group[k][i];
      if (s.paired == 0) {
        row.push_back("-");
        out[label][groups[k]] = nullptr;
        continue;
      }
      const bool interval = std::isfinite(s.diff_ci95);
      row.push_back(interval ? format_diff(s) : fmt::format("{:+.1f}", 100.0 * s.diff_mean));
      out[label][groups[k]] = {
          {"diff", 100.0 * s.diff_mean},
          {"ci95", interval ? nlohmann::json(100.0 * s.diff_ci95) : nlohmann::json()},
          {"paired", s.paired}};
    }
    table.add_row(row);
  }
  return table.render();
}

// Rows: runs; columns: one score per group (task, dataset...) and their average.
std::string group_table(const std::vector<LongctxRecord>& records,
                        const std::vector<std::string>& runs,
                        const std::vector<std::string>& groups, const std::string& group_key,
                        nlohmann::json& out) {
  Table table;
  table.add_column("run", Table::Align::kLeft);
  for (const auto& g : groups) table.add_column(g);
  table.add_column("average");
  out = nlohmann::json::object();
  for (const auto& run : runs) {
    std::vector<std::string> row = {run};
    double sum = 0.0;
    int n = 0;
    for (const auto& g : groups) {
      const auto s = summarize(
          records, std::vector<std::string>{run}, "",
          [&](const LongctxRecord& r) { return r.meta.value(group_key, std::string()) == g; });
      if (s[0].scored > 0) {
        row.push_back(fmt::format("{:.2f}", 100.0 * s[0].mean_score));
        out[run][g] = 100.0 * s[0].mean_score;
        sum += 100.0 * s[0].mean_score;
        ++n;
      } else {
        row.push_back("-");
        out[run][g] = nullptr;
      }
    }
    row.push_back(n > 0 ? fmt::format("{:.2f}", sum / n) : "-");
    out[run]["average"] = n > 0 ? nlohmann::json(sum / n) : nlohmann::json();
    table.add_row(row);
  }
  return table.render();
}

// Groups the records by length (NIAH, RULER): each gets a "length_name"; returns the group names.
std::vector<std::string> name_lengths(const std::vector<int64_t>& lengths,
                                      std::vector<LongctxRecord>& records) {
  for (auto& r : records)
    r.meta["length_name"] = std::to_string(r.meta.value("length", int64_t{0}));
  std::vector<std::string> names;
  names.reserve(lengths.size());
  for (int64_t L : lengths) names.push_back(std::to_string(L));
  return names;
}

// Per-length paired differences, on records grouped by name_lengths().
void add_per_length_paired(const std::vector<std::string>& length_names,
                           const std::vector<std::string>& runs, const std::string& reference,
                           LongctxReport& report) {
  nlohmann::json per_length_paired;
  report.text += paired_group_table(report.records, runs, length_names, "length_name", reference,
                                    per_length_paired);
  report.results["per_length_paired"] = per_length_paired;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  PROTOKV_CHECK(out.good(), "cannot write {}", path.string());
  out << text;
  PROTOKV_CHECK(out.good(), "cannot write {}", path.string());
}

// Writes results.json, config.json and the figures into `out_dir` (none when empty).
void write_report(const std::string& out_dir, const nlohmann::json& config,
                  const LongctxReport& report) {
  if (out_dir.empty()) return;
  const fs::path dir(out_dir);
  write_file(dir / "results.json", report.results.dump(2) + "\n");
  write_file(dir / "config.json", config.dump(2) + "\n");
  for (const auto& [name, svg] : report.figures) write_file(dir / name, svg);
}

// The runs' labels, in the configuration's order: the tables' rows.
std::vector<std::string> run_labels(const nlohmann::json& config) {
  std::vector<std::string> labels;
  for (const auto& r : config.at("runs")) labels.push_back(r.at("label").get<std::string>());
  return labels;
}

// The results file header of a run with this configuration (runs of builds before the cache
// types recorded none: F32).
nlohmann::json results_header_of(const nlohmann::json& config, const std::string& shard) {
  return longctx_results_header(
      config.at("mode").get<std::string>(), config.at("alloc").get<std::string>(), shard,
      config.value("cache_type_k", "f32"), config.value("cache_type_v", "f32"));
}

// ", shard 2/8" in a shard's title line; nothing for a whole (or merged) run.
std::string shard_note(const nlohmann::json& config) {
  if (!config.contains("shard")) return "";
  const auto& s = config["shard"];
  return fmt::format(", shard {}/{} of {} samples", s.at("index").get<int64_t>(),
                     s.at("count").get<int64_t>(), s.at("samples").get<int64_t>());
}

// Numbers the samples in benchmark order and keeps the shard's (eval/shard.h); a sharded run
// states its shard in the configuration and in the results file's header.
void take_shard(std::vector<LongctxSample>& samples, LongctxBenchmarkRun& run) {
  for (size_t k = 0; k < samples.size(); ++k) samples[k].index = static_cast<int64_t>(k);
  if (!run.shard.active()) return;
  const auto total = static_cast<int64_t>(samples.size());
  std::vector<LongctxSample> kept;
  for (auto& sample : samples)
    if (run.shard.holds(sample.index)) kept.push_back(std::move(sample));
  samples = std::move(kept);
  run.config["shard"] = {
      {"index", run.shard.index}, {"count", run.shard.count}, {"samples", total}};
  run.options.shard = run.shard.to_string();
}

}  // namespace

namespace {

void assemble_niah(const nlohmann::json& config, LongctxReport& report) {
  const nlohmann::json& c = config.at("niah");
  NiahOptions o;
  o.lengths = c.at("lengths").get<std::vector<int64_t>>();
  o.depths = c.at("depths").get<std::vector<double>>();
  o.samples_per_cell = c.at("samples_per_cell").get<int>();
  const std::vector<std::string> runs = run_labels(config);
  const std::string reference = config.at("reference").get<std::string>();
  const std::string mode = config.at("mode").get<std::string>();
  const std::string model_path = config.at("model").at("path").get<std::string>();
  const auto summaries = summarize(report.records, runs, reference);
  report.results["summary"] = summaries_json(summaries);
  report.text =
      fmt::format("eval niah: {}, {} lengths x {} depths x {} sample(s), mode {}, haystack {}{}\n",
                  model_path, o.lengths.size(), o.depths.size(), o.samples_per_cell, mode,
                  c.at("haystack").get<std::string>(), shard_note(config));
  report.text += summary_table(summaries, "accuracy %");
  nlohmann::json grids = nlohmann::json::object();
  for (const auto& label : runs) {
    const auto grid = niah_grid(report.records, label, o);
    nlohmann::json cells = nlohmann::json::array();
    std::string by_length;
    for (size_t l = 0; l < o.lengths.size(); ++l) {
      double sum = 0.0;
      int n = 0;
      for (size_t d = 0; d < o.depths.size(); ++d) {
        const double a = grid[l][d];
        cells.push_back({{"length", o.lengths[l]},
                         {"depth", o.depths[d]},
                         {"accuracy", std::isfinite(a) ? nlohmann::json(a) : nlohmann::json()}});
        if (std::isfinite(a)) {
          sum += a;
          ++n;
        }
      }
      by_length += n > 0 ? fmt::format(" {}:{:.0f}", o.lengths[l], 100.0 * sum / n)
                         : fmt::format(" {}:-", o.lengths[l]);
    }
    grids[label] = cells;
    report.text += fmt::format("  {} accuracy by length:{}\n", label, by_length);
    const std::string title =
        fmt::format("NIAH {} — {} ({})", label, fs::path(model_path).filename().string(), mode);
    std::string file = "heatmap_" + label + ".svg";
    for (char& ch : file)
      if (ch == '/' || ch == ':' || ch == ',' || ch == '=') ch = '_';
    report.figures.emplace_back(file, render_niah_heatmap(grid, o, title));
  }
  report.results["cells"] = grids;
  add_per_length_paired(name_lengths(o.lengths, report.records), runs, reference, report);
}

void assemble_ruler(const nlohmann::json& config, LongctxReport& report) {
  const nlohmann::json& c = config.at("ruler");
  const auto tasks = c.at("tasks").get<std::vector<std::string>>();
  const auto lengths = c.at("lengths").get<std::vector<int64_t>>();
  const std::vector<std::string> runs = run_labels(config);
  const std::string reference = config.at("reference").get<std::string>();
  const auto summaries = summarize(report.records, runs, reference);
  report.results["summary"] = summaries_json(summaries);
  report.text =
      fmt::format("eval ruler: {}, lengths {}, {} sample(s) per task, mode {}{}\n",
                  config.at("model").at("path").get<std::string>(), fmt::join(lengths, ","),
                  c.at("samples_per_task_and_length").get<int64_t>(),
                  config.at("mode").get<std::string>(), shard_note(config));
  nlohmann::json per_task;
  report.text += group_table(report.records, runs, tasks, "task", per_task);
  nlohmann::json per_task_paired;
  const std::string task_diffs =
      paired_group_table(report.records, runs, tasks, "task", reference, per_task_paired);
  if (!task_diffs.empty()) report.text += fmt::format("\n{}", task_diffs);
  report.text += '\n';
  report.text += summary_table(summaries, "score (all)");
  report.results["per_task"] = per_task;
  report.results["per_task_paired"] = per_task_paired;
  if (lengths.size() > 1) {
    const std::vector<std::string> names = name_lengths(lengths, report.records);
    nlohmann::json per_length;
    report.text +=
        "\nby length:\n" + group_table(report.records, runs, names, "length_name", per_length);
    report.results["per_length"] = per_length;
    add_per_length_paired(names, runs, reference, report);
  }
}

void assemble_longbench(const nlohmann::json& config, LongctxReport& report) {
  const nlohmann::json& c = config.at("longbench");
  std::vector<std::string> names;
  for (const auto& d : c.at("datasets")) names.push_back(d.at("name").get<std::string>());
  const bool longbench_e = c.at("e").get<bool>();
  const auto max_length = c.at("max_length").get<int64_t>();
  const std::vector<std::string> runs = run_labels(config);
  const std::string reference = config.at("reference").get<std::string>();
  const auto summaries = summarize(report.records, runs, reference);
  report.results["summary"] = summaries_json(summaries);
  nlohmann::json per_dataset;
  report.text =
      fmt::format("eval longbench{}: {}, {} dataset(s), max length {}, mode {}{}\n",
                  longbench_e ? " -E" : "", config.at("model").at("path").get<std::string>(),
                  names.size(), max_length > 0 ? std::to_string(max_length) : "none",
                  config.at("mode").get<std::string>(), shard_note(config));
  report.text += group_table(report.records, runs, names, "dataset", per_dataset);
  report.results["per_dataset"] = per_dataset;
  if (longbench_e) {
    std::vector<std::string> groups;
    for (const auto& n : names)
      for (const char* bucket : {"0-4k", "4-8k", "8k+"}) groups.push_back(n + ":" + bucket);
    nlohmann::json per_bucket;
    report.text += "\nby length (LongBench-E):\n" +
                   group_table(report.records, runs, groups, "dataset_bucket", per_bucket);
    report.results["per_dataset_length"] = per_bucket;
  }
  report.text += '\n';
  report.text += summary_table(summaries, "score (all)");
}

}  // namespace

nlohmann::json model_json(const LoadedModel& model) {
  const ModelConfig& c = model.weights.config;
  nlohmann::json j;
  j["path"] = model.path;
  j["format"] = model.format;
  j["architecture"] = c.architecture;
  j["dim"] = c.dim;
  j["hidden_dim"] = c.hidden_dim;
  j["n_layers"] = c.n_layers;
  j["n_heads"] = c.n_heads;
  j["n_kv_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim();
  j["vocab_size"] = c.vocab_size;
  j["context_length"] = c.context_length;
  j["rope_theta"] = c.rope_theta;
  j["weight_type"] = model.weights.layers.empty()
                         ? std::string("f32")
                         : std::string(dtype_name(model.weights.layers[0].wq.type));
  j["parameters"] = model.weights.parameter_count();
  j["weight_bytes"] = model.weights.weight_bytes();
  return j;
}

// ---- niah ---------------------------------------------------------------------------------

LongctxReport run_niah_benchmark(const LoadedModel& model, NiahBenchmark benchmark,
                                 LongctxBenchmarkRun run) {
  prepare(model, "niah", run);
  const Tokenizer& tok = *model.tokenizer;
  NiahOptions& o = benchmark.niah;
  PROTOKV_CHECK(o.max_new_tokens >= 1, "max_new_tokens must be at least 1, got {}",
                o.max_new_tokens);
  PROTOKV_CHECK(o.samples_per_cell >= 1, "samples must be at least 1, got {}", o.samples_per_cell);
  PROTOKV_CHECK(o.needle.find("{value}") != std::string::npos,
                "the needle must contain {{value}} (the answer), got '{}'", o.needle);
  const int64_t ctx = model.weights.config.context_length;
  if (o.lengths.empty()) o.lengths = default_niah_lengths(ctx, o.max_new_tokens);
  if (o.depths.empty()) o.depths = default_niah_depths();
  for (int64_t L : o.lengths)
    PROTOKV_CHECK(L >= 1 && L + o.max_new_tokens <= ctx,
                  "lengths: {} + {} new tokens exceeds the model's context of {} tokens", L,
                  o.max_new_tokens, ctx);
  for (double d : o.depths)
    PROTOKV_CHECK(d >= 0.0 && d <= 100.0, "depths: {} is not a percentage in [0, 100]", d);
  const int64_t longest = *std::max_element(o.lengths.begin(), o.lengths.end());
  std::vector<int32_t> haystack;
  std::string haystack_desc;
  if (!benchmark.haystack_text.empty()) {
    haystack = haystack_from_text(tok, benchmark.haystack_text, longest, benchmark.haystack_name);
    haystack_desc = "file " + benchmark.haystack_name + " (repeated/cut to length)";
  } else if (benchmark.haystack_kind == "noise") {
    haystack = haystack_noise(tok, longest);
    haystack_desc = "RULER repeated noise (\"" + std::string(kRulerNoise) + "\")";
  } else if (benchmark.haystack_kind == "model") {
    auto sampled = samples_from_model(model.weights, tok.bos_id(), tok.eos_id(),
                                      std::max<int64_t>(longest, 2), 0, 1, o.seed);
    for (int32_t t : sampled[0].prompt)
      if (t != tok.bos_id() && t != tok.eos_id()) haystack.push_back(t);
    PROTOKV_CHECK(!haystack.empty(), "the model sampled no haystack text");
    while (static_cast<int64_t>(haystack.size()) < longest) {
      const auto copy = haystack;
      haystack.insert(haystack.end(), copy.begin(), copy.end());
    }
    haystack_desc = fmt::format("model-sampled (temperature 1, seed {})", o.seed);
  } else {
    fail("the haystack kind must be noise or model, got '{}'", benchmark.haystack_kind);
  }
  std::vector<LongctxSample> samples = make_niah_samples(tok, haystack, o);
  apply_limit(samples, run.limit);
  take_shard(samples, run);
  run.config["seed"] = o.seed;
  run.config["niah"] = {{"lengths", o.lengths},
                        {"depths", o.depths},
                        {"needle", o.needle},
                        {"question", o.question},
                        {"max_new_tokens", o.max_new_tokens},
                        {"samples_per_cell", o.samples_per_cell},
                        {"haystack", haystack_desc},
                        {"scoring", "exact containment of the needle's value"}};

  LongctxResult result = run_longctx(model.weights, tok, samples, niah_score, run.options);
  LongctxReport report =
      assemble_longctx_report(run.config, std::move(result.records), result.wall_ms);
  write_report(run.out_dir, run.config, report);
  return report;
}

// ---- ruler --------------------------------------------------------------------------------

std::vector<std::string> KvpressRulerProtocol::presses(std::vector<std::string> given) {
  if (std::find(given.begin(), given.end(), kReference) == given.end())
    given.insert(given.begin(), kReference);
  return given;
}

void KvpressRulerProtocol::refuse_given(const std::vector<std::string>& given) {
  PROTOKV_CHECK(given.empty(), "the kvpress protocol fixes {} ({}): drop it", given.front(),
                kFixes);
}

namespace {

// RulerBenchmark::kvpress_protocol: checks that `run` was made as the protocol says (every
// compressing run at one of its kept shares, each share for each press, full present, mode and
// reference), resolves its length, and records it in the run's config.
void apply_kvpress_protocol(const LoadedModel& model, RulerBenchmark& benchmark,
                            LongctxBenchmarkRun& run) {
  using P = KvpressRulerProtocol;
  PROTOKV_CHECK(benchmark.ruler.lengths.empty(),
                "the kvpress protocol fixes the length ({}): drop the lengths", P::kFixes);
  benchmark.ruler.lengths = {std::min<int64_t>(P::kLength, model.weights.config.context_length)};
  const LongctxOptions& o = run.options;
  bool has_full = false;
  std::map<std::string, std::vector<double>> shares;  // press -> kept shares, in order
  for (const auto& spec : o.runs) {
    if (!spec.compresses()) {
      has_full = true;
      continue;
    }
    PROTOKV_CHECK(spec.budget.is_set() && spec.budget.entries <= 0 && spec.memory_share <= 0.0,
                  "the kvpress protocol runs compression ratios only, not {}", spec.label());
    shares[spec.press].push_back(spec.budget.ratio);
  }
  const std::vector<double> expected(std::begin(P::kKeptShares), std::end(P::kKeptShares));
  for (const auto& [press, kept] : shares)
    PROTOKV_CHECK(kept == expected,
                  "the kvpress protocol runs {} at kept shares 0.75, 0.5, 0.25, "
                  "0.125 (compression ratios 0.25 .. 0.875)",
                  press);
  PROTOKV_CHECK(has_full && o.query_agnostic && o.reference == P::kReference,
                "the kvpress protocol needs the full cache as the reference and query-agnostic "
                "mode");
  run.config["protocol"] = {
      {"name", "kvpress"},
      {"what",
       "kvpress's RULER leaderboard protocol: query-agnostic, 4096 tokens (or the model's "
       "context when smaller), compression ratios 0.25/0.5/0.75/0.875 (share of the "
       "context's KV pairs removed), RULER scoring, paired against full; the 11 synthetic "
       "tasks (kvpress's set adds qa_1/qa_2: give --squad/--hotpotqa)"}};
}

}  // namespace

LongctxReport run_ruler_benchmark(const LoadedModel& model, RulerBenchmark benchmark,
                                  LongctxBenchmarkRun run) {
  if (benchmark.kvpress_protocol) apply_kvpress_protocol(model, benchmark, run);
  prepare(model, "ruler", run);
  const Tokenizer& tok = *model.tokenizer;
  RulerOptions& o = benchmark.ruler;
  if (o.tasks.empty()) {
    o.tasks = ruler_task_names();
    // qa_1 / qa_2 join the default task list when their data is given.
    if (!o.squad_path.empty()) o.tasks.push_back("qa_1");
    if (!o.hotpotqa_path.empty()) o.tasks.push_back("qa_2");
  }
  const int64_t ctx = model.weights.config.context_length;
  if (o.lengths.empty()) o.lengths = default_ruler_lengths(ctx);
  for (int64_t L : o.lengths)
    PROTOKV_CHECK(L >= 1 && L <= ctx, "lengths: {} exceeds the model's context of {} tokens", L,
                  ctx);
  PROTOKV_CHECK(o.samples >= 1, "samples must be at least 1, got {}", o.samples);
  for (const auto& task : o.tasks) {
    PROTOKV_CHECK(task != "qa_1" || !o.squad_path.empty(),
                  "RULER qa_1 needs a SQuAD file: give --squad FILE");
    PROTOKV_CHECK(task != "qa_2" || !o.hotpotqa_path.empty(),
                  "RULER qa_2 needs a HotpotQA file: give --hotpotqa FILE");
  }
  std::string essay_desc =
      "RULER repeated noise (no --haystack given; RULER uses Paul Graham essays)";
  if (!o.essay_text.empty()) {
    haystack_from_text(tok, o.essay_text, 1, benchmark.essay_name);  // empty / UTF-8 checks
    essay_desc = "file " + benchmark.essay_name;
  }
  std::vector<LongctxSample> samples = make_ruler_samples(tok, o);
  apply_limit(samples, run.limit);
  take_shard(samples, run);
  run.config["seed"] = o.seed;
  run.config["ruler"] = {
      {"tasks", o.tasks},
      {"lengths", o.lengths},
      {"samples_per_task_and_length", o.samples},
      {"essay_haystack", essay_desc},
      {"word_lists", "hand-written lists committed in src/eval/longctx_words.cpp"},
      {"squad", o.squad_path},
      {"hotpotqa", o.hotpotqa_path},
      {"scoring",
       "string_match_all (niah, vt, cwe, fwe), string_match_part (qa_1, qa_2), x100, as RULER"}};
  LongctxResult result = run_longctx(model.weights, tok, samples, ruler_score, run.options);
  LongctxReport report =
      assemble_longctx_report(run.config, std::move(result.records), result.wall_ms);
  write_report(run.out_dir, run.config, report);
  return report;
}

// ---- longbench ----------------------------------------------------------------------------

namespace {

// The datasets to run, in table order, each with its file.
std::vector<std::pair<const LongbenchDataset*, std::string>> longbench_files(
    const LongbenchBenchmark& b) {
  PROTOKV_CHECK(b.max_length >= 0, "max_length must be >= 0, got {}", b.max_length);
  std::error_code ec;
  PROTOKV_CHECK(fs::is_directory(b.data_dir, ec), "--data {} is not a directory", b.data_dir);
  std::vector<std::pair<const LongbenchDataset*, std::string>> files;
  const std::string suffix = b.longbench_e ? "_e.jsonl" : ".jsonl";
  if (!b.datasets.empty()) {
    for (const auto& name : b.datasets) {
      const auto& d = find_longbench_dataset(name);
      const fs::path file = fs::path(b.data_dir) / (d.name + suffix);
      PROTOKV_CHECK(fs::is_regular_file(file, ec), "no {} in {} for dataset {}",
                    file.filename().string(), b.data_dir, d.name);
      files.emplace_back(&d, file.string());
    }
  } else {
    for (const auto& d : longbench_datasets()) {
      const fs::path file = fs::path(b.data_dir) / (d.name + suffix);
      if (fs::is_regular_file(file, ec)) files.emplace_back(&d, file.string());
    }
    PROTOKV_CHECK(!files.empty(), "no LongBench{} file (<dataset>{}) in {}",
                  b.longbench_e ? "-E" : "", suffix, b.data_dir);
  }
  return files;
}

}  // namespace

void check_longbench_benchmark(const LongbenchBenchmark& benchmark) {
  longbench_files(benchmark);
}

LongctxReport run_longbench_benchmark(const LoadedModel& model, const LongbenchBenchmark& b,
                                      LongctxBenchmarkRun run) {
  const auto files = longbench_files(b);
  prepare(model, b.longbench_e ? "longbench-e" : "longbench", run);
  const Tokenizer& tok = *model.tokenizer;
  const int64_t ctx = model.weights.config.context_length;
  std::vector<LongctxSample> samples;
  std::map<std::string, int64_t> kept;  // limit: the first N samples of each dataset
  for (const auto& [d, file] : files) {
    for (const auto& ex : read_longbench_jsonl(file)) {
      if (run.limit > 0 && kept[d->name] >= run.limit) break;
      ++kept[d->name];
      try {
        samples.push_back(make_longbench_sample(tok, *d, ex, b.max_length, ctx));
      } catch (const Error& e) {  // its one error: a prompt beyond the context; name the flag
        fail("{}: give --max-length N", e.what());
      }
    }
  }
  take_shard(samples, run);
  for (auto& s : samples)
    s.meta["dataset_bucket"] =
        s.meta["dataset"].get<std::string>() + ":" + s.meta["bucket"].get<std::string>();
  nlohmann::json dataset_config = nlohmann::json::array();
  for (const auto& [d, file] : files)
    dataset_config.push_back({{"name", d->name},
                              {"max_new_tokens", d->max_new_tokens},
                              {"metric", d->metric},
                              {"chat_template", d->chat_template},
                              {"first_line_only", d->first_line_only},
                              {"prompt", d->prompt}});
  run.config["longbench"] = {
      {"data", b.data_dir},
      {"e", b.longbench_e},
      {"datasets", dataset_config},
      {"max_length", b.max_length},
      {"truncation",
       "middle (first and last max_length/2 tokens), capped at context - max new tokens"},
      {"chat_template_hook", "plain prompt (chat templates not wired yet)"},
      {"limit_per_dataset", run.limit}};
  run.config["limit"] = nullptr;  // applied per dataset, recorded above
  LongctxResult result = run_longctx(model.weights, tok, samples, longbench_score, run.options);
  LongctxReport report =
      assemble_longctx_report(run.config, std::move(result.records), result.wall_ms);
  write_report(run.out_dir, run.config, report);
  return report;
}

// ---- the report, and the merge of shards --------------------------------------------------

namespace {

// Runs given by ratio (--ratio): the score of every press at each compression ratio (kvpress's
// convention: the share of the compressed prompt's KV pairs removed, 1 - the kept share), with
// the paired difference against the reference, as a table (text and results) and an SVG line
// plot of score against ratio (kvpress's leaderboard figure). Nothing without ratio runs.
void add_score_by_ratio(const nlohmann::json& config, LongctxReport& report) {
  const std::string reference = config.at("reference").get<std::string>();
  std::vector<std::string> presses;                             // in run order
  std::map<std::string, std::map<double, std::string>> labels;  // press -> ratio -> label
  std::vector<double> ratios;
  for (const auto& r : config.at("runs")) {
    if (!r.contains("kept_share")) continue;
    const std::string press = r.at("press").get<std::string>();
    // Rounded to 1e-9 so that 1 - 0.875 prints as 0.125.
    const double ratio = std::round((1.0 - r["kept_share"].get<double>()) * 1e9) / 1e9;
    if (labels.count(press) == 0) presses.push_back(press);
    labels[press][ratio] = r.at("label").get<std::string>();
    if (std::find(ratios.begin(), ratios.end(), ratio) == ratios.end()) ratios.push_back(ratio);
  }
  if (presses.empty()) return;
  std::sort(ratios.begin(), ratios.end());
  std::vector<std::string> all_labels = {reference};
  for (const auto& press : presses)
    for (const auto& [ratio, label] : labels[press]) all_labels.push_back(label);
  const auto summaries = summarize(report.records, all_labels, reference);
  std::map<std::string, const LongctxSummary*> by_label;
  for (const auto& s : summaries) by_label[s.run] = &s;
  const LongctxSummary& ref = *by_label.at(reference);

  Table table;
  table.add_column("press", Table::Align::kLeft);
  table.add_column("0 (" + reference + ")");
  for (double ratio : ratios) table.add_column(fmt::format("{:g}", ratio));
  LinePlot plot;
  plot.title =
      fmt::format("score vs compression ratio — {} ({})",
                  fs::path(config.at("model").at("path").get<std::string>()).filename().string(),
                  config.at("mode").get<std::string>());
  plot.x_label = "compression ratio (share of the context's KV pairs removed)";
  plot.y_label = "score (x100)";
  nlohmann::json out = nlohmann::json::object();
  const double ref_score = ref.scored > 0 ? 100.0 * ref.mean_score : NAN;
  for (const auto& press : presses) {
    std::vector<std::string> row = {press, ref.scored > 0 ? fmt::format("{:.1f}", ref_score) : "-"};
    PlotSeries series{press, {{0.0, ref_score}}};
    for (double ratio : ratios) {
      const auto it = labels[press].find(ratio);
      if (it == labels[press].end()) {
        row.push_back("-");
        continue;
      }
      const LongctxSummary& s = *by_label.at(it->second);
      const std::string key = fmt::format("{:g}", ratio);
      if (s.scored == 0) {
        row.push_back("-");
        out[press][key] = nullptr;
        continue;
      }
      const double score = 100.0 * s.mean_score;
      const bool interval = s.paired > 1 && std::isfinite(s.diff_ci95);
      row.push_back(s.paired == 0 ? fmt::format("{:.1f}", score)
                    : interval    ? fmt::format("{:.1f} ({:+.1f} ± {:.1f})", score,
                                                100.0 * s.diff_mean, 100.0 * s.diff_ci95)
                                  : fmt::format("{:.1f} ({:+.1f})", score, 100.0 * s.diff_mean));
      out[press][key] = {
          {"score", score},
          {"run", it->second},
          {"paired", s.paired},
          {"diff", s.paired > 0 ? nlohmann::json(100.0 * s.diff_mean) : nlohmann::json()},
          {"ci95", interval ? nlohmann::json(100.0 * s.diff_ci95) : nlohmann::json()}};
      series.points.emplace_back(ratio, score);
    }
    table.add_row(row);
    plot.series.push_back(std::move(series));
  }
  report.text += fmt::format(
      "\nscore by compression ratio (kvpress's: share of the compressed prompt's KV pairs "
      "removed), Δ vs {} (95%):\n{}",
      reference, table.render());
  report.results["by_compression_ratio"] = out;
  report.figures.emplace_back("score_vs_ratio.svg", render_svg(plot));
}

}  // namespace

LongctxReport assemble_longctx_report(const nlohmann::json& config,
                                      std::vector<LongctxRecord> records, double wall_ms) {
  LongctxReport report;
  report.records = std::move(records);
  const std::string benchmark = config.at("benchmark").get<std::string>();
  if (benchmark == "niah") {
    assemble_niah(config, report);
  } else if (benchmark == "ruler") {
    assemble_ruler(config, report);
  } else if (benchmark == "longbench" || benchmark == "longbench-e") {
    assemble_longbench(config, report);
  } else {
    fail("unknown benchmark '{}' in the configuration", benchmark);
  }
  add_score_by_ratio(config, report);
  report.results["config"] = config;
  report.results["wall_ms"] = wall_ms;
  nlohmann::json errors = nlohmann::json::array();
  for (const auto& r : report.records)
    if (!r.error.empty()) errors.push_back({{"run", r.run}, {"id", r.id}, {"error", r.error}});
  report.results["skipped"] = errors;
  return report;
}

LongctxReport merge_longctx_runs(const std::vector<std::string>& dirs, const std::string& out_dir) {
  PROTOKV_CHECK(!dirs.empty(), "eval merge: no folder given");
  std::vector<ShardFolder> folders;
  std::vector<double> wall_ms_of;  // per folder, from its results.json (0 without one)
  for (const auto& dir : dirs) {
    folders.push_back(read_shard_folder(dir));
    PROTOKV_CHECK(
        folders.back().config.contains("benchmark") && folders.back().config.contains("runs"),
        "{}/config.json: not the configuration of eval niah, ruler or longbench", dir);
    const fs::path results = fs::path(dir) / "results.json";
    std::error_code ec;
    wall_ms_of.push_back(fs::is_regular_file(results, ec)
                             ? read_json_object_file(results.string()).value("wall_ms", 0.0)
                             : 0.0);
  }
  const nlohmann::json merged_config = check_shard_set(folders);
  const ShardFolder& first = folders.front();

  // Records, each shard complete: every run answered every sample of it once.
  const std::vector<std::string> labels = run_labels(first.config);
  std::map<std::string, size_t> run_order;
  for (size_t i = 0; i < labels.size(); ++i) run_order[labels[i]] = i;
  const nlohmann::json& config = first.config;
  std::vector<LongctxRecord> records;
  double wall_ms = 0.0;
  for (size_t fi = 0; fi < folders.size(); ++fi) {
    const ShardFolder& f = folders[fi];
    const nlohmann::json header =
        results_header_of(config, f.shard.active() ? f.shard.to_string() : "");
    const std::string path = (fs::path(f.dir) / "samples.jsonl").string();
    std::error_code ec;
    PROTOKV_CHECK(fs::is_regular_file(path, ec), "{}: missing", path);
    std::set<std::pair<size_t, int64_t>> seen;
    int64_t record_no = 0;
    for (const auto& j : read_results_file(path, header)) {
      ++record_no;
      LongctxRecord r;
      try {
        r = LongctxRecord::from_json(j);
      } catch (const nlohmann::json::exception& e) {
        fail("{} record {}: {}", path, record_no, e.what());
      }
      r.resumed = false;
      const auto run = run_order.find(r.run);
      PROTOKV_CHECK(run != run_order.end(), "{} record {}: run '{}' is not in its config.json",
                    path, record_no, r.run);
      PROTOKV_CHECK(r.sample >= 0,
                    "{} record {}: no sample index (written before protokv kept one); cannot "
                    "merge it",
                    path, record_no);
      PROTOKV_CHECK(f.samples < 0 || (r.sample < f.samples && f.shard.holds(r.sample)),
                    "{} record {}: sample {} is not one of shard {}", path, record_no, r.sample,
                    f.shard.to_string());
      PROTOKV_CHECK(seen.insert({run->second, r.sample}).second,
                    "{} record {}: run {} answered sample {} twice", path, record_no, r.run,
                    r.sample);
      records.push_back(std::move(r));
    }
    // A whole run (no shard) states no sample count: its records say how many samples it has.
    int64_t shard_samples = 0;
    if (f.samples >= 0) {
      shard_samples = shard_sample_count(f.shard, f.samples);
    } else {
      for (const auto& [run, sample] : seen) shard_samples = std::max(shard_samples, sample + 1);
    }
    const auto expected = static_cast<int64_t>(labels.size()) * shard_samples;
    PROTOKV_CHECK(static_cast<int64_t>(seen.size()) == expected,
                  "{}: {} of {} records ({} runs x {} samples): the shard did not finish "
                  "(resume it with --resume)",
                  path, seen.size(), expected, labels.size(), shard_samples);
    wall_ms += wall_ms_of[fi];
  }
  // The order of one run: run-major, samples in benchmark order.
  std::stable_sort(records.begin(), records.end(), [&](const auto& a, const auto& b) {
    const size_t ra = run_order.at(a.run), rb = run_order.at(b.run);
    return ra != rb ? ra < rb : a.sample < b.sample;
  });
  LongctxReport report = assemble_longctx_report(merged_config, std::move(records), wall_ms);
  report.results["merged_from"] = dirs;
  if (!out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    PROTOKV_CHECK(!ec, "cannot create {}: {}", out_dir, ec.message());
    ResultsFileWriter jsonl((fs::path(out_dir) / "samples.jsonl").string(),
                            results_header_of(config, ""), /*resume=*/false);
    for (const auto& r : report.records) jsonl.append(r.to_json());
    write_report(out_dir, merged_config, report);
  }
  return report;
}

}  // namespace protokv::eval
