#include "eval/demo.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "eval/report/table.h"
#include "press/entry.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {

DemoReport run_demo(const DemoOptions& options) {
  DemoReport report;
  report.model = options.tiny ? SyntheticModelSpec::tiny() : SyntheticModelSpec{};
  DemoOptions resolved = options;
  if (options.tiny) {
    // Keep the budgets meaningful for the shorter prompt.
    resolved.prompt_len = std::min<int64_t>(options.prompt_len, 192);
    resolved.continuation = std::min<int64_t>(options.continuation, 8);
  }
  const ModelWeights weights = make_synthetic_model(report.model);
  const auto samples =
      samples_synthetic(report.model.vocab_size, resolved.prompt_len, 1, resolved.seed);
  FidelityOptions fidelity;
  fidelity.presses = resolved.presses;
  fidelity.budgets = resolved.budgets;
  fidelity.continuation = resolved.continuation;
  // Decode timings are part of the table: no observer in the loop.
  fidelity.attention_metrics = false;
  fidelity.progress = resolved.progress;
  report.fidelity = run_fidelity(weights, samples, fidelity);
  report.fidelity.config["model"] = "SYNTHETIC";
  report.fidelity.config["model_description"] = report.model.describe();
  report.fidelity.config["workload"] =
      "SYNTHETIC prompt: filler tokens, repeated 8-token motifs, planted key-value pairs, ending "
      "by recalling some keys; continuation = the full cache's greedy output";
  return report;
}

std::string render_demo(const DemoReport& report) {
  const FidelityReport& f = report.fidelity;
  const int64_t prompt_len = f.config.value("prompt_len", int64_t{0});
  const int64_t continuation = f.config.value("continuation", int64_t{0});
  std::string out;
  out += "protokv demo — everything below is SYNTHETIC (generated in memory, nothing downloaded)\n";
  out += fmt::format("model:    {}\n", report.model.describe());
  out += fmt::format(
      "workload: SYNTHETIC prompt of {} tokens (filler, repeated motifs, planted key-value "
      "pairs); teacher-forced continuation of {} tokens (the full cache's greedy output)\n",
      prompt_len, continuation);
  out += fmt::format("threads:  {}\n\n", f.config.value("threads", 0));

  Table table;
  table.add_column("press", Table::Align::kLeft);
  table.add_column("budget");
  table.add_column("KV bytes");
  table.add_column("compress ms");
  table.add_column("prefill ms");
  table.add_column("decode ms/tok");
  table.add_column("KL vs full");
  table.add_column("top-1");
  table.add_row({"full", "-", fmt::format("{:.0f}", f.reference.kv_bytes.mean()), "0",
                 fmt::format("{:.1f}", f.reference.prefill_ms.mean()),
                 fmt::format("{:.3f}", f.reference.decode_ms_per_token.mean()), "0", "1.000"});
  for (const auto& row : f.rows) {
    if (!row.error.empty()) {
      table.add_row({row.press, fmt::format("{}", row.budget), "n/a", "", "", "", "", row.error});
      continue;
    }
    const double kl = row.kl_mean.mean();
    table.add_row(
        {row.press, fmt::format("{}", row.budget), fmt::format("{:.0f}", row.kv_bytes.mean()),
         fmt::format("{:.2f}", row.compress_ms.mean()),
         fmt::format("{:.1f}", row.prefill_ms.mean()),
         fmt::format("{:.3f}", row.decode_ms_per_token.mean()),
         kl == 0.0 ? "0" : fmt::format("{:.4f}", kl), fmt::format("{:.3f}", row.top1.mean())});
  }
  out += table.render();
  out += fmt::format(
      "\nKL vs full: mean next-token KL(full || press) in nats over the {} forced tokens; top-1: "
      "share of steps with the same argmax as full. SYNTHETIC random weights: the numbers show the "
      "pipeline works, not how the methods rank on real text.\n",
      continuation);
  out +=
      "\nThe same on a real model (GGUF or llama2.c checkpoint):\n"
      "  protokv eval fidelity -m model.gguf -f text.txt --press "
      "streaming_llm,h2o,snapkv,pyramidkv,protokv --budget 64,256\n"
      "  (without -f the prompts are the model's own sampled text; add --out DIR for JSON and "
      "plots)\n";
  return out;
}

nlohmann::json demo_json(const DemoReport& report) {
  nlohmann::json j = to_json(report.fidelity);
  j["synthetic"] = true;
  return j;
}

// ---- the recall demo -------------------------------------------------------------------------

namespace {

// The answer as shown: the greedy text up to its first '.' (the needle's sentence ends there),
// without surrounding spaces, at most 20 characters ("4829103." from " 4829103. The special").
std::string short_answer(const std::string& text) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  std::string line(std::find_if(text.begin(), text.end(), not_space), text.end());
  const size_t period = line.find('.');
  line =
      line.substr(0, std::min(line.find('\n'), period == std::string::npos ? period : period + 1));
  line.erase(std::find_if(line.rbegin(), line.rend(), not_space).base(), line.end());
  if (line.size() > 20) {
    size_t cut = 17;  // not inside a UTF-8 sequence
    while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
    line = line.substr(0, cut) + "...";
  }
  return line;
}

// A recall press (clusterkv) stores every entry and attends to a selection: its attended bytes
// are the ones its budget bounds.
bool is_recall_press(const std::string& name) {
  const press::PressEntry* entry = press::find_press_entry(name.substr(0, name.find(':')));
  return entry != nullptr && entry->recalls;
}

std::string human_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024.0) return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0));
  if (bytes >= 1024.0) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.0f} B", bytes);
}

double decode_ms_per_token(const LongctxRecord& r) {
  // decode_ms covers the generated tokens after the first (the first comes from prefill's logits).
  return r.generated_tokens > 1 ? r.decode_ms / static_cast<double>(r.generated_tokens - 1) : 0.0;
}

std::string press_list(const RecallDemoReport& report) {
  std::vector<std::string> seen;
  std::string list;
  for (const auto& row : report.rows) {
    if (std::find(seen.begin(), seen.end(), row.press) != seen.end()) continue;
    seen.push_back(row.press);
    list += (list.empty() ? "" : ",") + row.press;
  }
  return list;
}

}  // namespace

RecallDemoReport run_recall_demo(const RecallDemoOptions& options) {
  PROTOKV_CHECK(!options.budgets.empty(), "demo: at least one budget is needed");
  for (int64_t b : options.budgets)
    PROTOKV_CHECK(b >= 1, "demo: budget {} must be a positive number of entries per head", b);
  PROTOKV_CHECK(options.depth >= 0.0 && options.depth <= 100.0,
                "demo: depth {} is outside [0, 100]", options.depth);
  PROTOKV_CHECK(options.max_new_tokens >= 1, "demo: at least one new token is needed");
  PROTOKV_CHECK(std::filesystem::is_regular_file(options.model_path),
                "demo: model file {} not found (pass -m PATH, or --synthetic for the built-in "
                "random-weight model)",
                options.model_path);
  const LoadedModel model = load_model(options.model_path);
  PROTOKV_CHECK(model.tokenizer != nullptr, "demo: {} carries no tokenizer", options.model_path);
  const Tokenizer& tokenizer = *model.tokenizer;
  const ModelConfig& c = model.weights.config;
  PROTOKV_CHECK(options.length >= 16 && options.length + options.max_new_tokens <= c.context_length,
                "demo: length {} + {} new tokens does not fit the model's context of {} tokens",
                options.length, options.max_new_tokens, c.context_length);

  RecallDemoReport report;
  report.options = options;
  report.threads = num_threads();
  report.model_description = fmt::format(
      "{} ({}, {:.2f}M parameters, {} layers, {} query / {} KV heads, head dim {}, context {})",
      options.model_path, c.architecture,
      static_cast<double>(model.weights.parameter_count()) / 1e6, c.n_layers, c.n_heads,
      c.n_kv_heads, c.head_dim(), c.context_length);

  // One `eval niah` cell: the same generator, haystack, needle and question templates.
  NiahOptions niah;
  niah.lengths = {options.length};
  niah.depths = {options.depth};
  niah.max_new_tokens = options.max_new_tokens;
  niah.seed = options.seed;
  const auto samples =
      make_niah_samples(tokenizer, haystack_noise(tokenizer, options.length), niah);
  PROTOKV_CHECK(samples.size() == 1 && samples[0].error.empty(), "demo: {}",
                samples.empty() ? "no sample" : samples[0].error);
  report.sample = samples[0];
  const std::string key = report.sample.meta.at("key").get<std::string>();
  report.value = report.sample.answers.at(0);
  report.needle_text = fill_niah_template(niah.needle, key, report.value);
  report.question_text = fill_niah_template(niah.question, key, report.value);

  std::vector<std::string> presses = options.presses;
  if (presses.empty())
    for (const press::PressEntry* entry : press::press_table()) presses.emplace_back(entry->name);
  if (std::find(presses.begin(), presses.end(), "full") == presses.end())
    presses.insert(presses.begin(), "full");
  LongctxOptions run_options;
  run_options.runs = make_run_specs(presses, options.budgets, {});
  run_options.progress = options.progress;
  run_options.progress_label = "demo";
  const LongctxResult result =
      run_longctx(model.weights, tokenizer, samples, niah_score, run_options);
  report.wall_ms = result.wall_ms;
  for (size_t i = 0; i < result.records.size(); ++i) {
    const LongctxRunSpec& spec = run_options.runs[i];
    RecallDemoRow row;
    row.press = spec.press;
    row.budget = spec.budget.is_set() ? spec.budget.entries : 0;
    row.record = result.records[i];
    row.correct = row.record.error.empty() && row.record.score > 0.5;
    row.answer = short_answer(row.record.prediction);
    report.rows.push_back(std::move(row));
  }

  std::string budgets;
  for (int64_t b : options.budgets) budgets += (budgets.empty() ? "" : ",") + std::to_string(b);
  report.heatmap_command = fmt::format(
      "protokv eval niah -m {} --press {} --budget {} --lengths 512,1024,2032 "
      "--depths 0,25,50,75,100 --out niah_heatmaps",
      options.model_path, press_list(report), budgets);
  return report;
}

std::string render_recall_demo(const RecallDemoReport& report) {
  const RecallDemoOptions& o = report.options;
  const int64_t length = o.length;
  std::string out;
  out += "protokv demo — what does a compressed KV cache still remember?\n";
  out += fmt::format("model:     {}\n", report.model_description);
  out += fmt::format(
      "prompt:    {} tokens in `eval niah`'s layout: RULER's noise haystack \"{}\" repeated, with "
      "one planted fact at token {} ({:g}% depth):\n",
      length, kRulerNoise, report.sample.meta.value("needle_token", int64_t{0}), o.depth);
  out += fmt::format("             \"{}\"\n", report.needle_text);
  std::string question = report.question_text;
  std::replace(question.begin(), question.end(), '\n', ' ');
  out += fmt::format("question:  \"{}\" (prefilled and compressed with the context)\n",
                     question.substr(question.find_first_not_of(' ')));
  std::string budgets;
  for (int64_t b : o.budgets)
    budgets += fmt::format("{}{} ({:.1f}% of the prompt)", budgets.empty() ? "" : ", ", b,
                           100.0 * static_cast<double>(b) / static_cast<double>(length));
  out += fmt::format("budgets:   {} KV entries per head; greedy answer of up to {} tokens\n",
                     budgets, o.max_new_tokens);
  out += fmt::format("threads:   {}\n\n", report.threads);

  Table table;
  table.add_column("press", Table::Align::kLeft);
  table.add_column("budget");
  table.add_column("answer", Table::Align::kLeft);
  table.add_column("", Table::Align::kLeft);
  table.add_column("KV stored");
  table.add_column("KV attended");
  table.add_column("compress ms");
  table.add_column("decode ms/tok");
  int correct = 0, scored = 0;
  std::string skipped;
  for (const auto& row : report.rows) {
    const std::string budget = row.budget > 0 ? std::to_string(row.budget) : "-";
    if (!row.record.error.empty()) {
      table.add_row({row.press, budget, "(skipped, below)", "", "", "", "", ""});
      skipped += fmt::format("skipped {}@{}: {}\n", row.press, budget, row.record.error);
      continue;
    }
    ++scored;
    correct += row.correct ? 1 : 0;
    const LongctxRecord& r = row.record;
    const bool show_attended =
        r.attended_kv_bytes > 0 && (is_recall_press(row.press) || r.attended_kv_bytes < r.kv_bytes);
    table.add_row({row.press, budget, row.answer.empty() ? "(empty)" : row.answer,
                   row.correct ? "✓" : "✗", human_bytes(static_cast<double>(r.kv_bytes)),
                   show_attended ? human_bytes(static_cast<double>(r.attended_kv_bytes)) : "",
                   fmt::format("{:.2f}", r.compress_ms),
                   fmt::format("{:.3f}", decode_ms_per_token(r))});
  }
  out += table.render();
  out += skipped;
  out += fmt::format(
      "\n✓: the answer contains the planted value {}; {} of {} runs found it ({:.1f} s in all).\n"
      "KV stored: keys and values kept after compression (the full cache: every prompt token); "
      "KV attended (recall presses, which store everything): what the last decode step read. "
      "decode ms/tok: greedy answer tokens after the first. One prompt is an anecdote, not a "
      "benchmark: the heat maps below are.\n",
      report.value, correct, scored, report.wall_ms / 1000.0);
  out += "\nNIAH heat maps (lengths x depths, one SVG per press and budget, in niah_heatmaps/):\n";
  out += "  " + report.heatmap_command + "\n";
  return out;
}

nlohmann::json recall_demo_json(const RecallDemoReport& report) {
  const RecallDemoOptions& o = report.options;
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& row : report.rows) {
    const LongctxRecord& r = row.record;
    nlohmann::json j = {{"press", row.press},
                        {"budget", row.budget > 0 ? nlohmann::json(row.budget) : nlohmann::json()},
                        {"label", r.run}};
    if (!r.error.empty()) {
      j["error"] = r.error;
    } else {
      j["answer"] = row.answer;
      j["prediction"] = r.prediction;
      j["correct"] = row.correct;
      j["kv_bytes"] = r.kv_bytes;
      j["attended_kv_bytes"] = r.attended_kv_bytes;
      j["compress_ms"] = r.compress_ms;
      j["prefill_ms"] = r.prefill_ms;
      j["decode_ms_per_token"] = decode_ms_per_token(r);
      j["generated_tokens"] = r.generated_tokens;
    }
    runs.push_back(std::move(j));
  }
  return {{"model", o.model_path},
          {"model_description", report.model_description},
          {"prompt_tokens", o.length},
          {"depth", o.depth},
          {"needle_token", report.sample.meta.value("needle_token", int64_t{0})},
          {"needle", report.needle_text},
          {"question", report.question_text},
          {"value", report.value},
          {"budgets", o.budgets},
          {"max_new_tokens", o.max_new_tokens},
          {"seed", o.seed},
          {"threads", report.threads},
          {"mode", "query-aware"},
          {"runs", runs},
          {"wall_ms", report.wall_ms},
          {"heatmap_command", report.heatmap_command}};
}

}  // namespace protokv::eval
