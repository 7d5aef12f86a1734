// SPDX-License-Identifier: Apache-2.0
#include "eval/demo.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <span>

#include "core/units.h"
#include "eval/fetched_models.h"
#include "eval/longctx_words.h"
#include "eval/report/table.h"
#include "press/entry.h"
#include "protokv/error.h"
#include "protokv/json_keys.h"
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

// RULER's niah template (scripts/data/synthetic/constants.py, as src/eval/ruler.cpp has it), in
// the singular for one needle, as an instruct model is asked: the instruction and the text in the
// user turn, the question after it, and the answer prefix opening the assistant turn so that the
// greedy answer starts with the value.
constexpr const char* kChatInstruction =
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. I "
    "will quiz you about the numbers afterwards.\n";
constexpr const char* kChatQuestion =
    "\nWhat is the special magic number for {key} mentioned in the provided text?";
constexpr const char* kChatAnswerPrefix =
    "The special magic number for {key} mentioned in the provided text is";

struct ChatPrompt {
  LongctxSample sample;
  std::string needle_text;
  std::string question_text;
  std::string answer_prefix;
};

// One prompt of exactly `length` tokens: the chat markup up to the user's text, the story with the
// needle at `depth` percent of it (moved back to just after a sentence's '.', as `eval niah`
// does), then the question, the markup that opens the assistant turn and the answer prefix. The
// story is repeated (paragraph break between copies) when the length asks for more text.
ChatPrompt make_chat_prompt(const Tokenizer& tokenizer, ChatTemplate family, int64_t length,
                            double depth, int max_new_tokens, uint64_t seed) {
  // Key and value drawn as make_niah_samples draws sample 0's.
  std::mt19937_64 rng(seed * 1000003ULL);
  const auto& keys = adjective_noun_keys();
  const std::string& key =
      keys[static_cast<size_t>(uniform_int(rng, 0, static_cast<int64_t>(keys.size()) - 1))];
  const std::string value = random_number_text(rng);

  ChatPrompt p;
  p.needle_text = fill_niah_template(NiahOptions{}.needle, key, value);
  p.question_text = fill_niah_template(kChatQuestion, key, value);
  p.answer_prefix = fill_niah_template(kChatAnswerPrefix, key, value);
  // The template's text around the user's message, found by rendering a marker in its place.
  const std::string marker = "\x1f";
  const ChatMessage user{"user", marker};
  const std::string rendered =
      render_chat(family, std::span<const ChatMessage>(&user, 1), /*add_generation_prompt=*/true);
  const size_t at_marker = rendered.find(marker);
  PROTOKV_CHECK(at_marker != std::string::npos, "demo: the chat template dropped the user's text");
  const std::vector<int32_t> head = tokenizer.encode(
      rendered.substr(0, at_marker) + kChatInstruction, {tokenizer.add_bos(), true});
  p.sample.question = tokenizer.encode(
      p.question_text + rendered.substr(at_marker + marker.size()) + p.answer_prefix,
      {false, true});
  // After a sentence the needle is a sentence of its own (leading space); at depth 0 it opens the
  // text and a line break separates it from the story.
  const bool first = depth == 0.0;
  const std::vector<int32_t> needle =
      tokenizer.encode(first ? p.needle_text + "\n" : " " + p.needle_text, {false, false});
  const int64_t n =
      length - static_cast<int64_t>(head.size() + needle.size() + p.sample.question.size());
  PROTOKV_CHECK(n >= 16,
                "demo: length {} leaves no room for the story (chat markup, needle and question "
                "take {} tokens)",
                length, length - n);
  std::string text(demo_story());
  std::vector<int32_t> story = tokenizer.encode(text, {false, false});
  while (static_cast<int64_t>(story.size()) < n) {
    text += "\n\n" + std::string(demo_story());
    story = tokenizer.encode(text, {false, false});
  }
  auto at = static_cast<int64_t>(std::floor(static_cast<double>(n) * depth / 100.0));
  if (!first && at < n) {
    while (at > 0 &&
           tokenizer.decode(-1, story[static_cast<size_t>(at - 1)]).find('.') == std::string::npos)
      --at;
  }
  p.sample.id = fmt::format("L{}_D{:g}_S0", length, depth);
  p.sample.answers = {value};
  p.sample.max_new_tokens = max_new_tokens;
  p.sample.meta = {{"length", length},
                   {"depth", depth},
                   {"key", key},
                   {"value", value},
                   {"needle_token", static_cast<int64_t>(head.size()) + at}};
  std::vector<int32_t>& context = p.sample.context;
  context = head;
  context.insert(context.end(), story.begin(), story.begin() + at);
  context.insert(context.end(), needle.begin(), needle.end());
  context.insert(context.end(), story.begin() + at, story.begin() + n);
  return p;
}

// The family of the chat template to use ("" for the plain layout); see
// RecallDemoOptions::chat_template.
std::string resolve_chat_template(const std::string& requested, const Tokenizer& tokenizer) {
  if (requested == "none") return "";
  if (!requested.empty())
    return std::string(chat_template_name(chat_template_from_name(requested)));
  if (tokenizer.chat_template().empty()) return "";
  try {
    return std::string(chat_template_name(detect_chat_template(tokenizer.chat_template())));
  } catch (const Error&) {
    return "";  // a template of no known family: the plain layout still works
  }
}

}  // namespace

DemoModelChoice choose_demo_model(const std::string& explicit_path,
                                  const std::string& recall_model) {
  if (!explicit_path.empty()) return {explicit_path, "given with -m"};
  const std::filesystem::path smollm2 = find_fetched_model(kSmollm2File);
  if (!smollm2.empty())
    return {smollm2.string(),
            fmt::format("SmolLM2-135M-Instruct, a real pretrained instruct model, fetched by "
                        "tools/fetch_models.sh into {} (-m {} for the shipped recall model)",
                        fetched_models_dir().string(), recall_model)};
  return {recall_model,
          fmt::format("the shipped recall model: {} has no {} (tools/fetch_models.sh fetches "
                      "SmolLM2-135M-Instruct, which the demo then runs)",
                      fetched_models_dir().string(), kSmollm2File)};
}

RecallDemoReport run_recall_demo(const RecallDemoOptions& options) {
  for (int64_t b : options.budgets)
    PROTOKV_CHECK(b >= 1, "demo: budget {} must be a positive number of entries per head", b);
  PROTOKV_CHECK(options.length == 0 || options.length >= 16,
                "demo: length {} is too short (at least 16 tokens)", options.length);
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

  RecallDemoReport report;
  report.chat_template = resolve_chat_template(options.chat_template, tokenizer);
  const bool chat = !report.chat_template.empty();
  report.options = options;
  RecallDemoOptions& o = report.options;
  if (o.length == 0) o.length = chat ? 1024 : 2032;
  if (o.budgets.empty())
    o.budgets = chat ? std::vector<int64_t>{128} : std::vector<int64_t>{32, 128};
  PROTOKV_CHECK(o.length + o.max_new_tokens <= c.context_length,
                "demo: length {} + {} new tokens does not fit the model's context of {} tokens",
                o.length, o.max_new_tokens, c.context_length);
  report.threads = num_threads();
  report.model_description = fmt::format(
      "{} ({}, {:.2f}M parameters, {} layers, {} query / {} KV heads, head dim {}, context {})",
      o.model_path, c.architecture, static_cast<double>(model.weights.parameter_count()) / 1e6,
      c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.context_length);

  std::vector<LongctxSample> samples;
  if (chat) {
    ChatPrompt prompt = make_chat_prompt(tokenizer, chat_template_from_name(report.chat_template),
                                         o.length, o.depth, o.max_new_tokens, o.seed);
    report.needle_text = std::move(prompt.needle_text);
    report.question_text = std::move(prompt.question_text);
    report.answer_prefix = std::move(prompt.answer_prefix);
    samples.push_back(std::move(prompt.sample));
  } else {
    // One `eval niah` cell: the same generator, haystack, needle and question templates.
    NiahOptions niah;
    niah.lengths = {o.length};
    niah.depths = {o.depth};
    niah.max_new_tokens = o.max_new_tokens;
    niah.seed = o.seed;
    samples = make_niah_samples(tokenizer, haystack_noise(tokenizer, o.length), niah);
    PROTOKV_CHECK(samples.size() == 1 && samples[0].error.empty(), "demo: {}",
                  samples.empty() ? "no sample" : samples[0].error);
    const std::string key = samples[0].meta.at("key").get<std::string>();
    report.needle_text = fill_niah_template(niah.needle, key, samples[0].answers.at(0));
    report.question_text = fill_niah_template(niah.question, key, samples[0].answers.at(0));
  }
  report.sample = samples[0];
  report.value = report.sample.answers.at(0);
  PROTOKV_CHECK(static_cast<int64_t>(report.sample.context.size() +
                                     report.sample.question.size()) == o.length,
                "demo: internal error: the prompt has {} tokens, not {}",
                report.sample.context.size() + report.sample.question.size(), o.length);

  std::vector<std::string> presses = o.presses;
  if (presses.empty()) {
    if (chat) {
      presses = kChatPresses;
    } else {
      for (const press::PressEntry* entry : press::press_table()) presses.emplace_back(entry->name);
    }
  }
  if (std::find(presses.begin(), presses.end(), "full") == presses.end())
    presses.insert(presses.begin(), "full");
  LongctxOptions run_options;
  run_options.runs = make_run_specs(presses, o.budgets, {});
  run_options.progress = o.progress;
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
  for (int64_t b : o.budgets) budgets += (budgets.empty() ? "" : ",") + std::to_string(b);
  // `eval niah` asks in the plain layout only (no chat template, noise haystack unless
  // --haystack): for a chat model the heat maps are the plain-prompt counterpart of this demo.
  report.heatmap_command = fmt::format(
      "protokv eval niah -m {} --press {} --budget {} --lengths {} --depths 0,25,50,75,100{} "
      "--out niah_heatmaps",
      o.model_path, press_list(report), budgets, chat ? "1024,2048,4096" : "512,1024,2032",
      chat ? " --haystack TEXT_FILE" : "");
  return report;
}

std::string render_recall_demo(const RecallDemoReport& report) {
  const RecallDemoOptions& o = report.options;
  const int64_t length = o.length;
  std::string out;
  out += "protokv demo — what does a compressed KV cache still remember?\n";
  out += fmt::format("model:     {}\n", report.model_description);
  if (!o.model_choice.empty()) out += fmt::format("why:       {}\n", o.model_choice);
  const int64_t needle_token = report.sample.meta.value("needle_token", int64_t{0});
  if (report.chat_template.empty()) {
    out += fmt::format(
        "prompt:    {} tokens in `eval niah`'s layout: RULER's noise haystack \"{}\" repeated, "
        "with one planted fact at token {} ({:g}% depth):\n",
        length, kRulerNoise, needle_token, o.depth);
  } else {
    out += fmt::format(
        "prompt:    {} tokens in the model's chat template ({}): RULER's niah instruction, then a "
        "short story (English prose written for this demo, repeated when the length asks for "
        "more) with one planted fact at token {} ({:g}% depth):\n",
        length, report.chat_template, needle_token, o.depth);
  }
  out += fmt::format("             \"{}\"\n", report.needle_text);
  std::string question = report.question_text;
  std::replace(question.begin(), question.end(), '\n', ' ');
  question = question.substr(question.find_first_not_of(' '));
  if (report.chat_template.empty()) {
    out += fmt::format("question:  \"{}\" (prefilled and compressed with the context)\n", question);
  } else {
    out += fmt::format(
        "question:  \"{}\" ending the user turn; the assistant turn opens with \"{}\" (all "
        "prefilled and compressed with the context)\n",
        question, report.answer_prefix);
  }
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
                   row.correct ? "✓" : "✗", format_bytes(static_cast<double>(r.kv_bytes), 2),
                   show_attended ? format_bytes(static_cast<double>(r.attended_kv_bytes), 2) : "",
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
      j[json_keys::kKvBytes] = r.kv_bytes;
      j[json_keys::kAttendedKvBytes] = r.attended_kv_bytes;
      j["compress_ms"] = r.compress_ms;
      j["prefill_ms"] = r.prefill_ms;
      j["decode_ms_per_token"] = decode_ms_per_token(r);
      j["generated_tokens"] = r.generated_tokens;
    }
    runs.push_back(std::move(j));
  }
  return {{"model", o.model_path},
          {"model_choice", o.model_choice},
          {"model_description", report.model_description},
          {"prompt_format", report.chat_template.empty() ? "eval niah layout"
                                                         : "chat template " + report.chat_template},
          {"answer_prefix", report.answer_prefix},
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
