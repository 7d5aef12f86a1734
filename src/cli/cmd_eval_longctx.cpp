// `protokv eval niah|ruler|longbench`: the long-context benchmarks of the papers, every
// (press, budget) on the same samples (eval/longctx_runner.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "eval/fidelity.h"
#include "eval/longbench.h"
#include "eval/longctx_runner.h"
#include "eval/niah.h"
#include "eval/report/table.h"
#include "eval/ruler.h"
#include "eval/spec_list.h"
#include "protokv/error.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

namespace fs = std::filesystem;

// Flags shared by the three benchmarks.
struct LongctxArgs {
  ModelOptions model;
  std::vector<std::string> presses = {"full"};
  std::string budgets;
  std::string ratios;
  std::string alloc;
  std::string mode = "query-aware";
  std::string reference = "full";
  int64_t limit = 0;
  uint64_t seed = 42;
  bool json = false;
  std::string out_dir;
  bool resume = false;
  bool share_prefill = false;
  bool quiet = false;
};

void add_longctx_options(CLI::App& cmd, LongctxArgs& args) {
  add_model_options(cmd, args.model);
  cmd.add_option("--press", args.presses,
                 "comma-separated press specs, e.g. full,snapkv,protokv:prototypes=lsh "
                 "(full = uncompressed reference)")
      ->capture_default_str();
  cmd.add_option("--budget", args.budgets, "comma-separated budgets (KV entries per head)");
  cmd.add_option("--ratio", args.ratios,
                 "comma-separated kept shares of the prompt in (0, 1], e.g. 0.016,0.1");
  cmd.add_option("--alloc", args.alloc, "budget allocator: uniform|pyramid|adakv");
  cmd.add_option("--mode", args.mode,
                 "query-aware (question compressed with the context) or query-agnostic "
                 "(context compressed first, question appended after)")
      ->capture_default_str();
  cmd.add_option("--reference", args.reference,
                 "run the others are paired against (accuracy difference, 95% interval)")
      ->capture_default_str();
  cmd.add_option("--limit", args.limit, "only the first N samples (0: all)")->capture_default_str();
  cmd.add_option("--seed", args.seed, "seed of the generated samples")->capture_default_str();
  cmd.add_flag("--json", args.json, "JSON on stdout (the content of results.json)");
  cmd.add_option("--out", args.out_dir,
                 "write DIR/results.json, config.json, samples.jsonl (one line per sample, "
                 "written as it is produced) and SVGs");
  cmd.add_flag("--share-prefill", args.share_prefill,
               "run each prompt through the model once and compress that for every press and "
               "budget (the same records bit for bit, much faster; prefill_ms then counts only "
               "the copy and the compression)");
  cmd.add_flag("--resume", args.resume,
               "continue an interrupted run: reuse DIR/samples.jsonl records (needs --out)");
  cmd.add_flag("--quiet", args.quiet, "no progress bar");
}

struct Prepared {
  LoadedModel model;
  eval::LongctxOptions options;
  nlohmann::json config;
};

Prepared prepare(const LongctxArgs& args, const std::string& benchmark) {
  check_mode(args.mode);
  PROTOKV_CHECK(args.limit >= 0, "--limit must be >= 0");
  PROTOKV_CHECK(!args.resume || !args.out_dir.empty(), "--resume needs --out DIR");
  Prepared p;
  const std::vector<int64_t> budgets = args.budgets.empty()
                                           ? std::vector<int64_t>{}
                                           : eval::parse_positive_list(args.budgets, "--budget");
  const std::vector<double> ratios =
      args.ratios.empty() ? std::vector<double>{} : eval::parse_ratio_list(args.ratios, "--ratio");
  const std::vector<std::string> presses = eval::split_press_specs(args.presses);
  for (const auto& press : presses)
    PROTOKV_CHECK(press == "full" || !budgets.empty() || !ratios.empty(),
                  "press {} needs --budget N[,N...] or --ratio R[,R...]", press);
  p.options.runs = eval::make_run_specs(presses, budgets, ratios);
  p.options.alloc = args.alloc;
  p.options.query_agnostic = args.mode == "query-agnostic";
  p.options.reference = args.reference;
  p.options.progress = !args.quiet;
  p.options.progress_label = benchmark;
  p.options.resume = args.resume;
  p.options.share_prefill = args.share_prefill;
  if (!args.out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(args.out_dir, ec);
    PROTOKV_CHECK(!ec, "cannot create {}: {}", args.out_dir, ec.message());
    p.options.jsonl_path = (fs::path(args.out_dir) / "samples.jsonl").string();
  }
  p.model = load_model_from_options(args.model, /*require_tokenizer=*/true);
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : p.options.runs)
    runs.push_back({{"label", r.label()},
                    {"press", r.press},
                    {"budget", r.budget.is_set() ? nlohmann::json(r.budget.to_string())
                                                 : nlohmann::json(nullptr)}});
  p.config = {
      {"benchmark", benchmark},
      {"model", model_json(p.model)},
      {"tokenizer", args.model.tokenizer_path.empty() ? "embedded" : args.model.tokenizer_path},
      {"runs", runs},
      {"alloc", args.alloc.empty() ? "default" : args.alloc},
      {"mode", args.mode},
      {"reference", args.reference},
      {"limit", args.limit},
      {"seed", args.seed},
      {"threads", num_threads()},
      {"decoding", "greedy (argmax), stop at EOS"},
      {"chat_template", "none (plain prompt)"}};
  return p;
}

void apply_limit(std::vector<eval::LongctxSample>& samples, int64_t limit) {
  if (limit > 0 && static_cast<int64_t>(samples.size()) > limit)
    samples.resize(static_cast<size_t>(limit));
}

std::string format_diff(const eval::LongctxSummary& s) {
  if (s.paired == 0) return "-";
  return fmt::format("{:+.1f} ± {:.1f}", 100.0 * s.diff_mean, 100.0 * s.diff_ci95);
}

// The main table: one row per run.
std::string summary_table(const std::vector<eval::LongctxSummary>& summaries,
                          const std::string& score_name) {
  eval::Table table;
  table.add_column("run", eval::Table::Align::kLeft);
  table.add_column(score_name);
  table.add_column("Δ vs ref (95%)");
  table.add_column("scored");
  table.add_column("skipped");
  table.add_column("compress ms");
  table.add_column("KV at answer");
  table.add_column("prefill peak KV");
  for (const auto& s : summaries)
    table.add_row({s.run, s.scored > 0 ? fmt::format("{:.1f}", 100.0 * s.mean_score) : "-",
                   format_diff(s), std::to_string(s.scored), std::to_string(s.skipped),
                   fmt::format("{:.2f}", s.compress_ms),
                   format_bytes(static_cast<size_t>(s.kv_bytes)),
                   format_bytes(static_cast<size_t>(s.peak_kv_bytes))});
  return table.render();
}

nlohmann::json summaries_json(const std::vector<eval::LongctxSummary>& summaries) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : summaries) j.push_back(s.to_json());
  return j;
}

// Rows: runs other than the reference; columns: per group (task, length, dataset...), the paired
// difference against the reference on the samples both scored, in points, with its 95% Student-t
// interval ("+x.x ± y.y"; no interval with one pair, "-" with none). `out[run][group]` gets
// {"diff", "ci95", "paired"} in points (ci95: the half-width; null without an interval).
std::string paired_group_table(const std::vector<eval::LongctxRecord>& records,
                               const std::vector<eval::LongctxRunSpec>& runs,
                               const std::vector<std::string>& groups, const std::string& group_key,
                               const std::string& reference, nlohmann::json& out) {
  out = nlohmann::json::object();
  const bool has_reference =
      std::any_of(runs.begin(), runs.end(), [&](const auto& r) { return r.label() == reference; });
  if (!has_reference) return "";
  eval::Table table;
  table.add_column("Δ vs " + reference + " (95%)", eval::Table::Align::kLeft);
  for (const auto& g : groups) table.add_column(g);
  std::vector<std::vector<eval::LongctxSummary>> per_group;  // [group][run]
  for (const auto& g : groups)
    per_group.push_back(eval::summarize(
        records, runs, reference,
        [&](const eval::LongctxRecord& r) { return r.meta.value(group_key, std::string()) == g; }));
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string label = runs[i].label();
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

// Skipped samples, one line each, so a bad sample is visible without reading the JSONL.
void report_errors(const std::vector<eval::LongctxRecord>& records, FILE* out) {
  std::map<std::string, int> seen;
  for (const auto& r : records) {
    if (r.error.empty() || seen[r.id]++ > 0) continue;
    std::fprintf(out, "skipped %s: %s\n", r.id.c_str(), r.error.c_str());
  }
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  PROTOKV_CHECK(out.good(), "cannot write {}", path.string());
  out << text;
}

// Prints (text or JSON) and writes results.json / config.json.
void finish(const LongctxArgs& args, const Prepared& p, const eval::LongctxResult& result,
            nlohmann::json results, const std::string& text_report) {
  results["config"] = p.config;
  results["wall_ms"] = result.wall_ms;
  nlohmann::json errors = nlohmann::json::array();
  for (const auto& r : result.records)
    if (!r.error.empty()) errors.push_back({{"run", r.run}, {"id", r.id}, {"error", r.error}});
  results["skipped"] = errors;
  FILE* info = args.json ? stderr : stdout;
  if (args.json) {
    std::printf("%s\n", results.dump(2).c_str());
  } else {
    std::printf("%s", text_report.c_str());
  }
  report_errors(result.records, info);
  if (!args.out_dir.empty()) {
    write_file(fs::path(args.out_dir) / "results.json", results.dump(2) + "\n");
    write_file(fs::path(args.out_dir) / "config.json", p.config.dump(2) + "\n");
    std::fprintf(info, "wrote %s\n", args.out_dir.c_str());
  }
}

std::vector<double> parse_depths(const std::string& text) {
  std::vector<double> depths;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string piece =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const double d = std::strtod(piece.c_str(), &end);
    PROTOKV_CHECK(!piece.empty() && end == piece.c_str() + piece.size() && d >= 0.0 && d <= 100.0,
                  "--depths: '{}' is not a percentage in [0, 100]", piece);
    depths.push_back(d);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return depths;
}

// ---- niah ---------------------------------------------------------------------------------

struct NiahArgs {
  LongctxArgs common;
  std::string lengths;
  std::string depths;
  std::string haystack_file;
  std::string haystack_kind = "noise";
  eval::NiahOptions niah;
};

void run_niah(NiahArgs& args) {
  Prepared p = prepare(args.common, "niah");
  const Tokenizer& tok = *p.model.tokenizer;
  eval::NiahOptions& o = args.niah;
  o.seed = args.common.seed;
  PROTOKV_CHECK(o.max_new_tokens >= 1, "--max-new-tokens must be at least 1");
  PROTOKV_CHECK(o.samples_per_cell >= 1, "--samples must be at least 1");
  PROTOKV_CHECK(o.needle.find("{value}") != std::string::npos,
                "--needle must contain {{value}} (the answer), got '{}'", o.needle);
  const int64_t ctx = p.model.weights.config.context_length;
  o.lengths = args.lengths.empty() ? eval::default_niah_lengths(ctx, o.max_new_tokens)
                                   : eval::parse_positive_list(args.lengths, "--lengths");
  o.depths = args.depths.empty() ? eval::default_niah_depths() : parse_depths(args.depths);
  for (int64_t L : o.lengths)
    PROTOKV_CHECK(L + o.max_new_tokens <= ctx,
                  "--lengths: {} + {} new tokens exceeds the model's context of {} tokens", L,
                  o.max_new_tokens, ctx);
  const int64_t longest = *std::max_element(o.lengths.begin(), o.lengths.end());
  std::vector<int32_t> haystack;
  std::string haystack_desc;
  if (!args.haystack_file.empty()) {
    haystack = eval::haystack_from_text(tok, read_text_file(args.haystack_file), longest,
                                        args.haystack_file);
    haystack_desc = "file " + args.haystack_file + " (repeated/cut to length)";
  } else if (args.haystack_kind == "noise") {
    haystack = eval::haystack_noise(tok, longest);
    haystack_desc = "RULER repeated noise (\"" + std::string(eval::kRulerNoise) + "\")";
  } else if (args.haystack_kind == "model") {
    auto sampled = eval::samples_from_model(p.model.weights, tok.bos_id(), tok.eos_id(),
                                            std::max<int64_t>(longest, 2), 0, 1, o.seed);
    for (int32_t t : sampled[0].prompt)
      if (t != tok.bos_id() && t != tok.eos_id()) haystack.push_back(t);
    while (static_cast<int64_t>(haystack.size()) < longest) {
      const auto copy = haystack;
      haystack.insert(haystack.end(), copy.begin(), copy.end());
    }
    haystack_desc = fmt::format("model-sampled (temperature 1, seed {})", o.seed);
  } else {
    fail("--haystack-kind must be noise or model, got '{}'", args.haystack_kind);
  }
  std::vector<eval::LongctxSample> samples = eval::make_niah_samples(tok, haystack, o);
  apply_limit(samples, args.common.limit);
  p.config["niah"] = {{"lengths", o.lengths},
                      {"depths", o.depths},
                      {"needle", o.needle},
                      {"question", o.question},
                      {"max_new_tokens", o.max_new_tokens},
                      {"samples_per_cell", o.samples_per_cell},
                      {"haystack", haystack_desc},
                      {"scoring", "exact containment of the needle's value"}};

  eval::LongctxResult result =
      eval::run_longctx(p.model.weights, tok, samples, eval::niah_score, p.options);
  const auto summaries = eval::summarize(result.records, p.options.runs, p.options.reference);
  nlohmann::json results;
  results["summary"] = summaries_json(summaries);
  std::string report = fmt::format(
      "eval niah: {}, {} lengths x {} depths x {} sample(s), mode {}, haystack {}\n", p.model.path,
      o.lengths.size(), o.depths.size(), o.samples_per_cell, args.common.mode, haystack_desc);
  report += summary_table(summaries, "accuracy %");
  nlohmann::json grids = nlohmann::json::object();
  for (const auto& run : p.options.runs) {
    const auto grid = eval::niah_grid(result.records, run.label(), o);
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
    grids[run.label()] = cells;
    report += fmt::format("  {} accuracy by length:{}\n", run.label(), by_length);
    if (!args.common.out_dir.empty()) {
      const std::string title =
          fmt::format("NIAH {} — {} ({})", run.label(), fs::path(p.model.path).filename().string(),
                      args.common.mode);
      std::string file = "heatmap_" + run.label() + ".svg";
      for (char& c : file)
        if (c == '/' || c == ':' || c == ',' || c == '=') c = '_';
      write_file(fs::path(args.common.out_dir) / file, eval::render_niah_heatmap(grid, o, title));
    }
  }
  results["cells"] = grids;
  std::vector<std::string> length_names;
  for (int64_t L : o.lengths) length_names.push_back(std::to_string(L));
  for (auto& r : result.records)
    r.meta["length_name"] = std::to_string(r.meta.value("length", int64_t{0}));
  nlohmann::json per_length_paired;
  report += paired_group_table(result.records, p.options.runs, length_names, "length_name",
                               p.options.reference, per_length_paired);
  results["per_length_paired"] = per_length_paired;
  finish(args.common, p, result, results, report);
}

// ---- ruler --------------------------------------------------------------------------------

struct RulerArgs {
  LongctxArgs common;
  std::string tasks;
  std::string lengths;
  std::string essay_file;
  std::string squad;
  std::string hotpotqa;
  int samples = 4;
};

// Rows: runs; columns: one score per group (task, dataset...) and their average.
std::string group_table(const std::vector<eval::LongctxRecord>& records,
                        const std::vector<eval::LongctxRunSpec>& runs,
                        const std::vector<std::string>& groups, const std::string& group_key,
                        nlohmann::json& out) {
  eval::Table table;
  table.add_column("run", eval::Table::Align::kLeft);
  for (const auto& g : groups) table.add_column(g);
  table.add_column("average");
  out = nlohmann::json::object();
  for (const auto& run : runs) {
    std::vector<std::string> row = {run.label()};
    double sum = 0.0;
    int n = 0;
    for (const auto& g : groups) {
      const auto s = eval::summarize(records, {run}, "", [&](const eval::LongctxRecord& r) {
        return r.meta.value(group_key, std::string()) == g;
      });
      if (s[0].scored > 0) {
        row.push_back(fmt::format("{:.2f}", 100.0 * s[0].mean_score));
        out[run.label()][g] = 100.0 * s[0].mean_score;
        sum += 100.0 * s[0].mean_score;
        ++n;
      } else {
        row.push_back("-");
        out[run.label()][g] = nullptr;
      }
    }
    row.push_back(n > 0 ? fmt::format("{:.2f}", sum / n) : "-");
    out[run.label()]["average"] = n > 0 ? nlohmann::json(sum / n) : nlohmann::json();
    table.add_row(row);
  }
  return table.render();
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    std::string piece =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    PROTOKV_CHECK(!piece.empty(), "empty name in list '{}'", text);
    names.push_back(piece);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

void run_ruler(RulerArgs& args) {
  Prepared p = prepare(args.common, "ruler");
  const Tokenizer& tok = *p.model.tokenizer;
  eval::RulerOptions o;
  o.tasks = args.tasks.empty() ? eval::ruler_task_names() : split_names(args.tasks);
  const int64_t ctx = p.model.weights.config.context_length;
  o.lengths = args.lengths.empty() ? eval::default_ruler_lengths(ctx)
                                   : eval::parse_positive_list(args.lengths, "--lengths");
  for (int64_t L : o.lengths)
    PROTOKV_CHECK(L <= ctx, "--lengths: {} exceeds the model's context of {} tokens", L, ctx);
  PROTOKV_CHECK(args.samples >= 1, "--samples must be at least 1");
  o.samples = args.samples;
  o.seed = args.common.seed;
  o.squad_path = args.squad;
  o.hotpotqa_path = args.hotpotqa;
  // qa_1 / qa_2 join the default task list when their data is given.
  if (args.tasks.empty() && !args.squad.empty()) o.tasks.push_back("qa_1");
  if (args.tasks.empty() && !args.hotpotqa.empty()) o.tasks.push_back("qa_2");
  for (const auto& task : o.tasks) {
    PROTOKV_CHECK(task != "qa_1" || !args.squad.empty(),
                  "RULER qa_1 needs a SQuAD file: give --squad FILE");
    PROTOKV_CHECK(task != "qa_2" || !args.hotpotqa.empty(),
                  "RULER qa_2 needs a HotpotQA file: give --hotpotqa FILE");
  }
  std::string essay_desc =
      "RULER repeated noise (no --haystack given; RULER uses Paul Graham essays)";
  if (!args.essay_file.empty()) {
    o.essay_text = read_text_file(args.essay_file);
    eval::haystack_from_text(tok, o.essay_text, 1, args.essay_file);  // empty / UTF-8 checks
    essay_desc = "file " + args.essay_file;
  }
  std::vector<eval::LongctxSample> samples = eval::make_ruler_samples(tok, o);
  apply_limit(samples, args.common.limit);
  p.config["ruler"] = {{"tasks", o.tasks},
                       {"lengths", o.lengths},
                       {"samples_per_task_and_length", o.samples},
                       {"essay_haystack", essay_desc},
                       {"word_lists", "hand-written lists committed in src/eval/longctx_words.cpp"},
                       {"squad", args.squad},
                       {"hotpotqa", args.hotpotqa},
                       {"scoring",
                        "string_match_all (niah, vt, cwe, fwe), string_match_part "
                        "(qa_1, qa_2), x100, as RULER"}};
  eval::LongctxResult result =
      eval::run_longctx(p.model.weights, tok, samples, eval::ruler_score, p.options);
  const auto summaries = eval::summarize(result.records, p.options.runs, p.options.reference);
  nlohmann::json results;
  results["summary"] = summaries_json(summaries);
  nlohmann::json per_task;
  std::string report =
      fmt::format("eval ruler: {}, lengths {}, {} sample(s) per task, mode {}\n", p.model.path,
                  fmt::join(o.lengths, ","), o.samples, args.common.mode);
  report += group_table(result.records, p.options.runs, o.tasks, "task", per_task);
  nlohmann::json per_task_paired;
  const std::string task_diffs = paired_group_table(result.records, p.options.runs, o.tasks, "task",
                                                    p.options.reference, per_task_paired);
  if (!task_diffs.empty()) report += "\n" + task_diffs;
  report += "\n" + summary_table(summaries, "score (all)");
  results["per_task"] = per_task;
  results["per_task_paired"] = per_task_paired;
  if (o.lengths.size() > 1) {
    std::vector<std::string> lengths;
    for (int64_t L : o.lengths) lengths.push_back(std::to_string(L));
    for (auto& r : result.records)
      r.meta["length_name"] = std::to_string(r.meta.value("length", int64_t{0}));
    nlohmann::json per_length;
    report += "\nby length:\n" +
              group_table(result.records, p.options.runs, lengths, "length_name", per_length);
    results["per_length"] = per_length;
    nlohmann::json per_length_paired;
    report += paired_group_table(result.records, p.options.runs, lengths, "length_name",
                                 p.options.reference, per_length_paired);
    results["per_length_paired"] = per_length_paired;
  }
  finish(args.common, p, result, results, report);
}

// ---- longbench ----------------------------------------------------------------------------

struct LongbenchArgs {
  LongctxArgs common;
  std::string data_dir;
  std::string datasets;
  bool longbench_e = false;
  int64_t max_length = 0;
};

void run_longbench(LongbenchArgs& args) {
  PROTOKV_CHECK(args.max_length >= 0, "--max-length must be positive");
  std::error_code ec;
  PROTOKV_CHECK(fs::is_directory(args.data_dir, ec), "--data {} is not a directory", args.data_dir);
  // Names first: an unknown dataset fails before the model is loaded.
  std::vector<const eval::LongbenchDataset*> datasets;
  const std::string suffix = args.longbench_e ? "_e.jsonl" : ".jsonl";
  if (!args.datasets.empty()) {
    for (const auto& name : split_names(args.datasets)) {
      const auto& d = eval::find_longbench_dataset(name);
      const fs::path file = fs::path(args.data_dir) / (d.name + suffix);
      PROTOKV_CHECK(fs::is_regular_file(file, ec), "no {} in {} for dataset {}",
                    file.filename().string(), args.data_dir, d.name);
      datasets.push_back(&d);
    }
  } else {
    for (const auto& d : eval::longbench_datasets())
      if (fs::is_regular_file(fs::path(args.data_dir) / (d.name + suffix), ec))
        datasets.push_back(&d);
    PROTOKV_CHECK(!datasets.empty(), "no LongBench{} file (<dataset>{}) in {}",
                  args.longbench_e ? "-E" : "", suffix, args.data_dir);
  }
  Prepared p = prepare(args.common, args.longbench_e ? "longbench-e" : "longbench");
  const Tokenizer& tok = *p.model.tokenizer;
  const int64_t ctx = p.model.weights.config.context_length;
  std::vector<eval::LongctxSample> samples;
  std::vector<std::string> names;
  for (const auto* d : datasets) {
    names.push_back(d->name);
    const std::string file = (fs::path(args.data_dir) / (d->name + suffix)).string();
    for (const auto& ex : eval::read_longbench_jsonl(file)) {
      try {
        samples.push_back(eval::make_longbench_sample(tok, *d, ex, args.max_length, ctx));
      } catch (const Error& e) {  // its one error: a prompt beyond the context; name the flag
        fail("{}: give --max-length N", e.what());
      }
    }
  }
  // --limit: the first N samples of each dataset.
  if (args.common.limit > 0) {
    std::map<std::string, int64_t> kept;
    std::vector<eval::LongctxSample> limited;
    for (auto& s : samples)
      if (kept[s.meta["dataset"].get<std::string>()]++ < args.common.limit)
        limited.push_back(std::move(s));
    samples = std::move(limited);
  }
  for (auto& s : samples)
    s.meta["dataset_bucket"] =
        s.meta["dataset"].get<std::string>() + ":" + s.meta["bucket"].get<std::string>();
  nlohmann::json dataset_config = nlohmann::json::array();
  for (const auto* d : datasets)
    dataset_config.push_back({{"name", d->name},
                              {"max_new_tokens", d->max_new_tokens},
                              {"metric", d->metric},
                              {"chat_template", d->chat_template},
                              {"first_line_only", d->first_line_only},
                              {"prompt", d->prompt}});
  p.config["longbench"] = {{"data", args.data_dir},
                           {"e", args.longbench_e},
                           {"datasets", dataset_config},
                           {"max_length", args.max_length},
                           {"truncation",
                            "middle (first and last max_length/2 tokens), capped at context - max "
                            "new tokens"},
                           {"chat_template_hook", "plain prompt (chat templates not wired yet)"},
                           {"limit_per_dataset", args.common.limit}};
  p.config["limit"] = nullptr;  // applied per dataset, recorded above
  eval::LongctxResult result =
      eval::run_longctx(p.model.weights, tok, samples, eval::longbench_score, p.options);
  const auto summaries = eval::summarize(result.records, p.options.runs, p.options.reference);
  nlohmann::json results;
  results["summary"] = summaries_json(summaries);
  nlohmann::json per_dataset;
  std::string report =
      fmt::format("eval longbench{}: {}, {} dataset(s), max length {}, mode {}\n",
                  args.longbench_e ? " -E" : "", p.model.path, names.size(),
                  args.max_length > 0 ? std::to_string(args.max_length) : "none", args.common.mode);
  report += group_table(result.records, p.options.runs, names, "dataset", per_dataset);
  results["per_dataset"] = per_dataset;
  if (args.longbench_e) {
    std::vector<std::string> groups;
    for (const auto& n : names)
      for (const char* b : {"0-4k", "4-8k", "8k+"}) groups.push_back(n + ":" + b);
    nlohmann::json per_bucket;
    report += "\nby length (LongBench-E):\n" +
              group_table(result.records, p.options.runs, groups, "dataset_bucket", per_bucket);
    results["per_dataset_length"] = per_bucket;
  }
  report += "\n" + summary_table(summaries, "score (all)");
  finish(args.common, p, result, results, report);
}

}  // namespace

void register_eval_longctx(CLI::App& eval) {
  {
    auto args = std::make_shared<NiahArgs>();
    auto* cmd = eval.add_subcommand(
        "niah",
        "Needle in a haystack (Kamradt): a grid of context lengths x needle depths per "
        "(press, budget); greedy answer scored by exact containment of the needle's value; "
        "heat-map SVG per run with --out.");
    add_longctx_options(*cmd, args->common);
    cmd->add_option("--lengths", args->lengths,
                    "comma-separated prompt lengths in tokens (default: 512..context in 4-8 "
                    "geometric steps, min(512, context/4) on small models)");
    cmd->add_option("--depths", args->depths,
                    "comma-separated needle depths in % (default 0,10,...,100)");
    cmd->add_option("--haystack", args->haystack_file,
                    "UTF-8 text file for the haystack (repeated/cut to length)");
    cmd->add_option("--haystack-kind", args->haystack_kind,
                    "without --haystack: noise (RULER's repeated sentences) or model (the "
                    "model's own sampled text)")
        ->capture_default_str();
    cmd->add_option("--needle", args->niah.needle, "needle template ({key}, {value})")
        ->capture_default_str();
    cmd->add_option("--question", args->niah.question,
                    "question template ({key}); appended after the context")
        ->capture_default_str();
    cmd->add_option("--max-new-tokens", args->niah.max_new_tokens, "tokens generated")
        ->capture_default_str();
    cmd->add_option("--samples", args->niah.samples_per_cell, "samples (key/value pairs) per cell")
        ->capture_default_str();
    cmd->callback([args] { run_niah(*args); });
  }
  {
    auto args = std::make_shared<RulerArgs>();
    auto* cmd = eval.add_subcommand(
        "ruler",
        "RULER's synthetic tasks (niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, "
        "niah_multiquery, vt, cwe, fwe; qa_1/qa_2 with --squad/--hotpotqa) with its templates, "
        "generators (seeded) and scoring (string_match_all / string_match_part x100), per task "
        "and averaged, per (press, budget).");
    add_longctx_options(*cmd, args->common);
    cmd->add_option("--tasks", args->tasks, "comma-separated tasks (default: all eleven)");
    cmd->add_option("--lengths", args->lengths,
                    "comma-separated sequence lengths (prompt + generated tokens; default "
                    "4096, 8192, ... up to the context, or the context when smaller)");
    cmd->add_option("--samples", args->samples, "samples per task and length")
        ->capture_default_str();
    cmd->add_option("--haystack", args->essay_file,
                    "UTF-8 text for the essay haystack (RULER: Paul Graham essays); default: "
                    "repeated noise");
    cmd->add_option("--squad", args->squad,
                    "SQuAD JSON (v2.0 dev format) for qa_1 (added to the default tasks)");
    cmd->add_option("--hotpotqa", args->hotpotqa,
                    "HotpotQA JSON (distractor dev format) for qa_2 (added to the default tasks)");
    cmd->callback([args] { run_ruler(*args); });
  }
  {
    auto args = std::make_shared<LongbenchArgs>();
    auto* cmd = eval.add_subcommand(
        "longbench",
        "LongBench / LongBench-E on the official JSONL files: official prompt templates, "
        "max new tokens, middle truncation to --max-length, official metrics (qa_f1, rouge_l, "
        "classification, retrieval, count, code_sim; Chinese with a character-level stand-in "
        "for jieba), per dataset (and per length bucket with --e) and averaged.");
    add_longctx_options(*cmd, args->common);
    cmd->add_option("--data", args->data_dir,
                    "directory of <dataset>.jsonl files (<dataset>_e.jsonl with --e)")
        ->required();
    cmd->add_option("--datasets", args->datasets,
                    "comma-separated datasets (default: every file found in --data)");
    cmd->add_flag("--e", args->longbench_e, "LongBench-E: *_e.jsonl, scores per length bucket");
    cmd->add_option("--max-length", args->max_length,
                    "truncate prompts in the middle to N tokens (as pred.py); without it, a "
                    "prompt beyond the model's context is an error")
        ->capture_default_str();
    cmd->callback([args] { run_longbench(*args); });
  }
}

}  // namespace protokv::cli
