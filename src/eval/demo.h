#pragma once
// `protokv demo`: the story of KV-cache compression on the project's own trained recall model
// (models/protokv-recall.gguf): one needle-in-a-haystack prompt in exactly `eval niah`'s layout,
// the full cache and every registered press at two budgets answer its question, each answer
// checked against the planted value, with KV bytes, compression and decode time.
// `protokv demo --synthetic`: the whole path on a SYNTHETIC model and workload generated in
// memory (needs no model file): prefill, compression by several presses at two budgets,
// teacher-forced decode, one fidelity table.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/fidelity.h"
#include "eval/longctx_runner.h"
#include "eval/niah.h"
#include "eval/synthetic.h"

namespace protokv::eval {

struct DemoOptions {
  bool tiny = false;  // small model and prompt (tests, sanitizers)
  std::vector<std::string> presses = {"streaming_llm", "h2o", "snapkv", "pyramidkv", "protokv"};
  std::vector<int64_t> budgets = {64, 256};
  int64_t prompt_len = 1024;
  int64_t continuation = 32;
  uint64_t seed = 1;
  bool progress = true;
};

struct DemoReport {
  SyntheticModelSpec model;
  FidelityReport fidelity;
};

DemoReport run_demo(const DemoOptions& options);
// The comparison table plus the SYNTHETIC labels and how to run the same on a real model.
std::string render_demo(const DemoReport& report);
nlohmann::json demo_json(const DemoReport& report);

// ---- the recall demo (the default) ----------------------------------------------------------

struct RecallDemoOptions {
  std::string model_path;  // resolved by the caller (the CLI: models/protokv-recall.gguf)
  // Prompt length in tokens (BOS + haystack + needle + question): the length at which the shipped
  // model answers every `eval niah` depth with the full cache (models/protokv-recall.md).
  int64_t length = 2032;
  double depth = 50.0;  // percent of the haystack before the needle
  std::vector<int64_t> budgets = {32, 128};
  // Empty: full, then every registered press (press_table()) at every budget.
  std::vector<std::string> presses;
  int max_new_tokens = 16;
  uint64_t seed = 42;
  bool progress = true;
};

struct RecallDemoRow {
  std::string press;
  int64_t budget = 0;  // 0: full (no budget)
  LongctxRecord record;
  bool correct = false;
  std::string answer;  // the prediction's first line, trimmed
};

struct RecallDemoReport {
  RecallDemoOptions options;
  std::string model_description;
  int threads = 0;
  LongctxSample sample;
  std::string needle_text;
  std::string question_text;
  std::string value;
  std::vector<RecallDemoRow> rows;  // full first
  double wall_ms = 0.0;
  std::string heatmap_command;
};

// Throws Error for an unreadable model, a model without a tokenizer, bad budgets or a length
// that does not fit the model's context.
RecallDemoReport run_recall_demo(const RecallDemoOptions& options);
std::string render_recall_demo(const RecallDemoReport& report);
nlohmann::json recall_demo_json(const RecallDemoReport& report);

}  // namespace protokv::eval
