// SPDX-License-Identifier: Apache-2.0
#pragma once
// `protokv demo`: the story of KV-cache compression in one prompt: a fact planted in a long
// context, a question, the full cache and presses at small budgets answering it, each answer
// checked against the planted value, with KV bytes, compression and decode time. Two prompt
// formats, chosen by the model:
//  - a model with a chat template (SmolLM2-135M-Instruct, fetched by tools/fetch_models.sh, is
//    the default when present): a story in plain English with the fact inside, the question in the
//    user turn and RULER's answer prefix opening the assistant turn, as an instruct model is used;
//  - a model without one (the shipped recall model models/protokv-recall.gguf, trained on that
//    layout): exactly one `eval niah` cell, the noise haystack and the raw question.
// `protokv demo --synthetic`: the whole path on a SYNTHETIC model and workload generated in
// memory (needs no model file): prefill, compression by several presses at two budgets,
// teacher-forced decode, one fidelity table.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
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

// Which model `protokv demo` runs, and the one line that says why.
struct DemoModelChoice {
  std::string path;
  std::string reason;
};

// `explicit_path` (-m) when given; else SmolLM2-135M-Instruct where tools/fetch_models.sh puts it
// (eval/fetched_models.h), when it is there; else `recall_model` (the shipped model).
DemoModelChoice choose_demo_model(const std::string& explicit_path,
                                  const std::string& recall_model);

// The chat prompt's haystack: a short English story written for the demo, without digits
// (eval/demo_story.cpp).
std::string_view demo_story();

struct RecallDemoOptions {
  std::string model_path;    // resolved by the caller (choose_demo_model)
  std::string model_choice;  // the line saying why this model (printed and in the JSON)
  // "": the model's own chat template when it has one (detected as `generate --chat` does), else
  // the plain `eval niah` layout; "none": the plain layout; else a template family name.
  std::string chat_template;
  // Prompt length in tokens (all of it: BOS, chat markup, haystack, needle, question, answer
  // prefix); 0: 2032 in the plain layout (the shipped recall model answers every `eval niah`
  // depth at that length with the full cache, models/protokv-recall.md), 1024 with a chat
  // template (a few seconds per run for a 135M model on 2 cores).
  int64_t length = 0;
  double depth = 50.0;  // percent of the haystack before the needle
  // Empty: 32,128 in the plain layout; 128 (12.5% of 1024) with a chat template.
  std::vector<int64_t> budgets;
  // Empty: full, then in the plain layout every registered press (press_table()) at every
  // budget; with a chat template (a real model, seconds per run) kChatPresses.
  std::vector<std::string> presses;
  int max_new_tokens = 16;
  uint64_t seed = 42;
  bool progress = true;
};

// The presses of the chat demo when none are given: an eviction baseline of each kind (position,
// accumulated attention, observation window) and ProtoKV.
inline const std::vector<std::string> kChatPresses = {"streaming_llm", "h2o", "snapkv", "protokv"};

struct RecallDemoRow {
  std::string press;
  int64_t budget = 0;  // 0: full (no budget)
  LongctxRecord record;
  bool correct = false;
  std::string answer;  // the prediction's first line, trimmed
};

struct RecallDemoReport {
  RecallDemoOptions options;  // length and budgets resolved
  std::string model_description;
  std::string chat_template;  // the family used ("chatml"); empty: the plain `eval niah` layout
  std::string answer_prefix;  // chat: the assistant turn's opening, part of the prompt
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
