// SPDX-License-Identifier: Apache-2.0
// A fidelity report as JSON, as a text table, and as a directory of files with plots.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "eval/fidelity.h"
#include "eval/report/table.h"
#include "eval/svg_plot.h"
#include "protokv/error.h"
#include "protokv/json_keys.h"

namespace protokv::eval {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string format_metric(double v, int precision = 4) {
  if (std::isnan(v)) return "-";
  if (v == 0.0) return "0";
  if (std::abs(v) < std::pow(10.0, -precision + 1)) return fmt::format("{:.2e}", v);
  return fmt::format("{:.{}f}", v, precision);
}

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// The reference's per-sample KL and top-1 at `row`'s budget or memory share ("full": KL 0, top-1 1
// on every sample).
bool reference_samples(const FidelityReport& report, const FidelityRow& row, size_t count,
                       std::vector<double>& kl, std::vector<double>& top1) {
  if (report.paired_reference == "full") {
    kl.assign(count, 0.0);
    top1.assign(count, 1.0);
    return true;
  }
  for (const auto& ref : report.rows) {
    if (ref.press == report.paired_reference && ref.budget == row.budget &&
        ref.memory_share == row.memory_share && ref.error.empty()) {
      kl = ref.kl_samples;
      top1 = ref.top1_samples;
      return true;
    }
  }
  return false;
}

// A row's mean KV bytes stored after prefill (or attended per decode step) as a share of the full
// cache's: the prompt length is the same for every sample, so is the full cache's size.
double share_of_full(const FidelityReport& report, const RunningStats& bytes) {
  if (bytes.count() == 0 || report.reference.kv_bytes.count() == 0) return kNaN;
  return bytes.mean() / report.reference.kv_bytes.mean();
}

// "128", or "m0.25 (B 123)" for a memory-share row (B: the mean budget solved per sample).
std::string format_point(const FidelityRow& row) {
  if (row.memory_share <= 0.0) return fmt::format("{}", row.budget);
  if (row.solved_budget.count() == 0) return fmt::format("m{:g}", row.memory_share);
  return fmt::format("m{:g} (B {:.0f})", row.memory_share, row.solved_budget.mean());
}

struct RowPairs {
  bool valid = false;
  PairedDifference kl, top1;
};

RowPairs row_pairs(const FidelityReport& report, const FidelityRow& row) {
  RowPairs out;
  std::vector<double> kl, top1;
  if (!row.error.empty() || !reference_samples(report, row, row.kl_samples.size(), kl, top1))
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
    if (row.memory_share > 0.0) {
      r["memory_share"] = row.memory_share;
      r["budget"] = nullptr;  // solved per sample: solved_budget
    }
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
    if (row.memory_share > 0.0) {
      r["solved_budget"] = stat(row.solved_budget);
      r["solved_budget_min"] = number_or_null(row.solved_budget.min());
      r["solved_budget_max"] = number_or_null(row.solved_budget.max());
    }
    r[json_keys::kStoredShare] = number_or_null(share_of_full(report, row.kv_bytes));
    r[json_keys::kAttendedShare] = number_or_null(share_of_full(report, row.kv_bytes_attended));
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
    r[json_keys::kKvBytes] = stat(row.kv_bytes);
    r[json_keys::kKvBytesAttended] = stat(row.kv_bytes_attended);
    r["entries_stored"] = stat(row.entries_stored);
    r["tokens_represented"] = stat(row.tokens_represented);
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
                              {json_keys::kKvBytes, report.reference.kv_bytes.mean()},
                              {"prefill_ms", report.reference.prefill_ms.mean()},
                              {"decode_ms_per_token", report.reference.decode_ms_per_token.mean()}};
  return {{"config", report.config}, {"full", reference}, {"results", results}};
}

std::string fidelity_title(const FidelityReport& report) {
  const nlohmann::json& c = report.config;
  const auto samples = c.at("samples").get<int64_t>();
  std::string shard;
  if (c.contains("shard"))
    shard = fmt::format(", shard {}/{}", c["shard"].at("index").get<int64_t>(),
                        c["shard"].at("count").get<int64_t>());
  const std::string model = c.value("model", std::string("?"));
  std::string title = model == "SYNTHETIC" ? "SYNTHETIC model and workload (random weights)\n" : "";
  title += fmt::format(
      "eval fidelity: {}, prompt {} tokens, continuation {} ({}), {} sample{}, mode "
      "query-aware{}\n",
      model, c.at("prompt_len").get<int64_t>(), c.at("continuation").get<int64_t>(),
      c.at("continuation_source").get<std::string>(), samples, samples == 1 ? "" : "s", shard);
  return title;
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
  table.add_column("stored");
  table.add_column("attended");
  table.add_column("tok/entry");
  table.add_column("compress ms");
  for (const auto& row : report.rows) {
    std::vector<std::string> cells = {row.press, format_point(row)};
    if (!row.error.empty()) {
      cells.push_back("n/a: " + row.error);
      cells.resize(table.columns());
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
    const auto share = [](double x) {
      return std::isnan(x) ? std::string("-") : fmt::format("{:.1f}%", 100.0 * x);
    };
    cells.push_back(share(share_of_full(report, row.kv_bytes)));
    cells.push_back(share(share_of_full(report, row.kv_bytes_attended)));
    // Prompt tokens per stored entry: 1.00 unless the press merges (chelsea).
    cells.push_back(
        row.entries_stored.count() > 0 && row.entries_stored.mean() > 0.0
            ? fmt::format("{:.2f}", row.tokens_represented.mean() / row.entries_stored.mean())
            : "-");
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
      "t interval; * = the interval excludes 0; stored / attended: KV bytes kept after prefill / "
      "read per decode step, as a share of the full cache's; m<S> (B <b>): the budget solved per "
      "sample to store the share S (mean b); tok/entry: prompt tokens per stored entry (> 1 when "
      "entries are merged)\n",
      report.paired_reference);
  return out;
}

std::string fidelity_out_dir(const std::string& out, const std::string& model_path,
                             int64_t prompt_len, int64_t continuation, int samples,
                             const EvalShard& shard) {
  std::string name =
      fmt::format("fidelity_{}_p{}_c{}_s{}", std::filesystem::path(model_path).stem().string(),
                  prompt_len, continuation, samples);
  if (shard.active()) name += fmt::format("_shard{}of{}", shard.index, shard.count);
  return (std::filesystem::path(out) / name).string();
}

std::string open_fidelity_out_dir(const std::string& out, const std::string& model_path,
                                  int64_t prompt_len, int64_t continuation, int samples,
                                  bool resume, FidelityOptions& options) {
  std::string dir =
      fidelity_out_dir(out, model_path, prompt_len, continuation, samples, options.shard);
  // A quantised cache's run is another run, not a resumable part of the F32 one.
  if (options.cache_type != KvCacheType{})
    dir += fmt::format("_k{}_v{}", dtype_name(options.cache_type.key),
                       dtype_name(options.cache_type.value));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  PROTOKV_CHECK(!ec, "cannot create output directory {}: {}", dir, ec.message());
  options.jsonl_path = (std::filesystem::path(dir) / "samples.jsonl").string();
  options.resume = resume;
  return dir;
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
  // One point per row on a press's line: x from the row, or skipped (NaN).
  const auto add_points = [&](LinePlot& plot, const Metric& metric,
                              double (*x_of)(const FidelityReport&, const FidelityRow&)) {
    for (const auto& row : report.rows) {
      const double x = x_of(report, row);
      if (std::isnan(x)) continue;
      auto it = std::find_if(plot.series.begin(), plot.series.end(),
                             [&](const PlotSeries& s) { return s.name == row.press; });
      if (it == plot.series.end()) {
        plot.series.push_back({row.press, {}});
        it = plot.series.end() - 1;
      }
      it->points.emplace_back(x, metric.get(row));
    }
  };
  const bool has_budget_rows =
      std::any_of(report.rows.begin(), report.rows.end(),
                  [](const FidelityRow& row) { return row.memory_share <= 0.0; });
  for (const auto& metric : kMetrics) {
    const std::string file = metric.file;
    const std::string stem = file.substr(0, file.size() - 4);
    const bool is_ppl = stem == "ppl";
    if (has_budget_rows) {
      LinePlot plot;
      plot.title = std::string(metric.title) + subtitle;
      plot.x_label = "budget (entries per KV head)";
      plot.y_label = metric.y_label;
      plot.log2_x = true;
      add_points(plot, metric, [](const FidelityReport&, const FidelityRow& row) {
        return row.memory_share > 0.0 ? kNaN : static_cast<double>(row.budget);
      });
      if (is_ppl && report.reference.ppl.count() > 0) {
        PlotSeries full{"full (reference)", {}};
        for (int64_t b : report.config.value("budgets", std::vector<int64_t>{})) {
          full.points.emplace_back(static_cast<double>(b), report.reference.ppl.mean());
        }
        plot.series.push_back(std::move(full));
      }
      write(file, render_svg(plot));
    }
    // Equal memory: every row at the share of the full cache's KV bytes it stored.
    LinePlot plot;
    plot.title = std::string(metric.title) + subtitle;
    plot.x_label = "KV bytes stored after prefill (% of the full cache)";
    plot.x_ticks_at_data = false;
    plot.y_label = metric.y_label;
    add_points(plot, metric, [](const FidelityReport& r, const FidelityRow& row) {
      return 100.0 * share_of_full(r, row.kv_bytes);
    });
    write(stem + "_vs_memory.svg", render_svg(plot));
  }
  return written;
}

}  // namespace protokv::eval
