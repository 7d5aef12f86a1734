// SPDX-License-Identifier: Apache-2.0
// `protokv demo` on the shipped recall model (models/protokv-recall.gguf): the structure of the
// story (full first, every registered press at both budgets, each answer checked against the
// planted value), the chat-template layout it uses for instruct models, which model it picks
// (SmolLM2 when tools/fetch_models.sh fetched it, else the recall model) and its bad-input errors.
// Which presses answer correctly is the model's business and is not pinned here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "eval/demo.h"
#include "eval/fetched_models.h"
#include "press/entry.h"
#include "protokv/model.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv::eval {
namespace {

using testing::run_protokv;

std::filesystem::path recall_model_path() {
  return std::filesystem::path(PROTOKV_SOURCE_DIR) / "models" / "protokv-recall.gguf";
}

// Sets an environment variable (nullptr: unsets it) for the scope of a test; the CLI runs started
// meanwhile inherit it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* value) {
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> old_;
};

#define SKIP_WITHOUT_RECALL_MODEL()                               \
  if (!std::filesystem::is_regular_file(recall_model_path()))     \
  GTEST_SKIP() << "recall model " << recall_model_path().string() \
               << " is absent (it is committed in models/; restore it to run this test)"

// Without -m the demo finds the checkout's model from the binary's location (the test runs in the
// build folder, not the repository root).
// An empty models folder stands for a machine where tools/fetch_models.sh has not run.
TEST(RecallDemo, JsonHasEveryPressAtBothBudgetsWithCheckedAnswers) {
  SKIP_WITHOUT_RECALL_MODEL();
  testing::TempDir no_models;
  ScopedEnv models_dir("PROTOKV_MODELS_DIR", no_models.path().c_str());
  const auto r = run_protokv("demo --json --quiet -t 1 --budget 32,128");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 2032);
  EXPECT_EQ(j["prompt_format"], "eval niah layout");
  EXPECT_NE(j["model_choice"].get<std::string>().find("shipped recall model"), std::string::npos)
      << j["model_choice"];
  const std::string value = j["value"];
  EXPECT_EQ(value.size(), 7u);
  EXPECT_NE(j["needle"].get<std::string>().find(value), std::string::npos);
  EXPECT_EQ(j["question"].get<std::string>().find(value), std::string::npos);
  const auto& runs = j["runs"];
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs[0]["press"], "full");
  EXPECT_TRUE(runs[0]["budget"].is_null());
  // The full cache is scored like every press: its answer is checked, never assumed right.
  ASSERT_TRUE(runs[0].contains("correct")) << runs[0].dump();
  EXPECT_TRUE(runs[0]["correct"].is_boolean());
  std::set<std::string> labels;
  for (const auto& run : runs) {
    labels.insert(run["label"].get<std::string>());
    if (run.contains("error")) continue;  // e.g. a press that refuses a budget this small
    ASSERT_TRUE(run["correct"].is_boolean()) << run.dump();
    EXPECT_EQ(run["correct"].get<bool>(),
              run["prediction"].get<std::string>().find(value) != std::string::npos)
        << run.dump();
    EXPECT_GT(run["kv_bytes"].get<double>(), 0.0) << run.dump();
    EXPECT_GT(run["attended_kv_bytes"].get<double>(), 0.0) << run.dump();
    EXPECT_GE(run["compress_ms"].get<double>(), 0.0);
    EXPECT_GT(run["decode_ms_per_token"].get<double>(), 0.0) << run.dump();
  }
  // Every registered press appears at both budgets, so a new press joins the demo by itself.
  for (const press::PressEntry* entry : press::press_table()) {
    if (!entry->compresses) continue;
    for (const char* budget : {"@32", "@128"})
      EXPECT_EQ(labels.count(std::string(entry->name) + budget), 1u) << entry->name << budget;
  }
  EXPECT_EQ(runs.size(), 1 + 2 * (press::press_table().size() - 1));
  EXPECT_NE(j["heatmap_command"].get<std::string>().find("eval niah"), std::string::npos);
}

TEST(RecallDemo, TableMarksEachAnswerAndEndsWithTheHeatMapCommand) {
  SKIP_WITHOUT_RECALL_MODEL();
  const auto r = run_protokv("demo --quiet -t 1 -m '" + recall_model_path().string() +
                             "' --press snapkv --budget 16,64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2032 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("The special magic number for"), std::string::npos) << r.out;
  // Rows: full, snapkv@16, snapkv@64, each with a mark.
  int marks = 0;
  for (size_t at = 0; (at = r.out.find("\n", at)) != std::string::npos; ++at) {
    const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
    if (line.rfind("full ", 0) == 0 || line.rfind("snapkv ", 0) == 0) {
      EXPECT_TRUE(line.find("✓") != std::string::npos || line.find("✗") != std::string::npos)
          << line;
      ++marks;
    }
  }
  EXPECT_EQ(marks, 3) << r.out;
  const std::string command = "protokv eval niah -m ";
  const size_t at = r.out.find(command);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string last_line = r.out.substr(at);
  EXPECT_NE(last_line.find("--press full,snapkv --budget 16,64"), std::string::npos) << last_line;
  EXPECT_NE(last_line.find("--out "), std::string::npos) << last_line;
}

TEST(RecallDemo, LibraryRowsMatchTheirPredictions) {
  SKIP_WITHOUT_RECALL_MODEL();
  RecallDemoOptions options;
  options.model_path = recall_model_path().string();
  options.length = 512;
  options.presses = {"streaming_llm"};
  options.budgets = {16};
  options.progress = false;
  const RecallDemoReport report = run_recall_demo(options);
  ASSERT_EQ(report.rows.size(), 2u);
  EXPECT_EQ(report.rows[0].press, "full");
  EXPECT_EQ(report.rows[1].press, "streaming_llm");
  EXPECT_EQ(report.rows[1].budget, 16);
  for (const auto& row : report.rows) {
    ASSERT_TRUE(row.record.error.empty()) << row.record.error;
    EXPECT_EQ(row.correct, row.record.prediction.find(report.value) != std::string::npos);
    EXPECT_EQ(row.record.prompt_tokens, 512);
  }
  EXPECT_EQ(report.rows[1].record.kv_bytes * 512 / 16, report.rows[0].record.kv_bytes);
  const auto j = recall_demo_json(report);
  EXPECT_EQ(j["runs"].size(), 2u);
}

// The choice follows tools/fetch_models.sh's folder: SmolLM2 when its file is there, the shipped
// recall model otherwise, -m above both. (An empty file stands for the model: only its presence
// decides.)
TEST(DemoModelChoice, PicksFetchedSmollm2WhenPresentElseTheRecallModel) {
  testing::TempDir dir;
  ScopedEnv models_dir("PROTOKV_MODELS_DIR", dir.path().c_str());
  const DemoModelChoice without = choose_demo_model("", "models/protokv-recall.gguf");
  EXPECT_EQ(without.path, "models/protokv-recall.gguf");
  EXPECT_NE(without.reason.find("tools/fetch_models.sh"), std::string::npos) << without.reason;
  EXPECT_NE(without.reason.find(dir.path().string()), std::string::npos) << without.reason;

  const auto smollm2 = dir / std::string(kSmollm2File);
  std::ofstream(smollm2).put('x');
  const DemoModelChoice with = choose_demo_model("", "models/protokv-recall.gguf");
  EXPECT_EQ(with.path, smollm2.string());
  EXPECT_NE(with.reason.find("SmolLM2-135M-Instruct"), std::string::npos) << with.reason;

  const DemoModelChoice given = choose_demo_model("other.gguf", "models/protokv-recall.gguf");
  EXPECT_EQ(given.path, "other.gguf");
  EXPECT_NE(given.reason.find("-m"), std::string::npos) << given.reason;

  // A folder, not a file, of that name is not a model.
  std::filesystem::remove(smollm2);
  std::filesystem::create_directory(smollm2);
  EXPECT_EQ(choose_demo_model("", "recall.gguf").path, "recall.gguf");
}

// The same folder rule as the script: PROTOKV_MODELS_DIR, else ${PROTOKV_CACHE:-$HOME/.cache/
// protokv}/models, an empty variable counting as unset.
TEST(DemoModelChoice, FetchedModelsDirFollowsTheFetchScript) {
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv models_dir("PROTOKV_MODELS_DIR", "/m");
    ScopedEnv cache("PROTOKV_CACHE", "/c");
    EXPECT_EQ(fetched_models_dir(), std::filesystem::path("/m"));
  }
  {
    ScopedEnv models_dir("PROTOKV_MODELS_DIR", "");
    ScopedEnv cache("PROTOKV_CACHE", "/c");
    EXPECT_EQ(fetched_models_dir(), std::filesystem::path("/c/models"));
  }
  {
    ScopedEnv models_dir("PROTOKV_MODELS_DIR", nullptr);
    ScopedEnv cache("PROTOKV_CACHE", "");
    EXPECT_EQ(fetched_models_dir(), std::filesystem::path("/home/someone/.cache/protokv/models"));
  }
}

// The CLI goes through the choice: with a (corrupt) SmolLM2 file in the folder it loads that file
// and fails on it; with an empty folder it runs the recall model and says why.
TEST(DemoModelChoice, CliRunsTheChosenModelAndSaysWhy) {
  testing::TempDir dir;
  ScopedEnv models_dir("PROTOKV_MODELS_DIR", dir.path().c_str());
  const auto smollm2 = dir / std::string(kSmollm2File);
  std::ofstream(smollm2) << "not a gguf file";
  testing::expect_run_fails_with_one_line("demo --quiet -t 1", smollm2.string());
  std::filesystem::remove(smollm2);
  SKIP_WITHOUT_RECALL_MODEL();
  const auto r = run_protokv("demo --quiet -t 1 --press snapkv --budget 32 --length 512");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("models/protokv-recall.gguf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("why:       the shipped recall model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("`eval niah`'s layout"), std::string::npos) << r.out;
}

// The chat layout (what SmolLM2 gets), forced on the small recall model: the prompt has exactly the
// asked length, opens with the template's user turn, holds the needle where the report says and
// ends with the assistant turn and the answer prefix.
TEST(RecallDemo, ChatLayoutHasTheExactLengthTheNeedleAndTheAnswerPrefix) {
  SKIP_WITHOUT_RECALL_MODEL();
  RecallDemoOptions options;
  options.model_path = recall_model_path().string();
  options.model_choice = "test";
  options.chat_template = "chatml";
  options.length = 600;
  options.depth = 40.0;
  options.presses = {"snapkv"};
  options.budgets = {32};
  options.max_new_tokens = 4;
  options.progress = false;
  const RecallDemoReport report = run_recall_demo(options);
  EXPECT_EQ(report.chat_template, "chatml");
  ASSERT_EQ(report.rows.size(), 2u);
  for (const auto& row : report.rows) {
    ASSERT_TRUE(row.record.error.empty()) << row.record.error;
    EXPECT_EQ(row.record.prompt_tokens, 600);
    EXPECT_EQ(row.correct, row.record.prediction.find(report.value) != std::string::npos);
  }
  const LongctxSample& sample = report.sample;
  EXPECT_EQ(sample.context.size() + sample.question.size(), 600u);
  const LoadedModel model = load_model(options.model_path);
  const std::string context = model.tokenizer->decode(sample.context);
  const std::string question = model.tokenizer->decode(sample.question);
  EXPECT_EQ(context.find("<|im_start|>user\nSome special magic numbers"), 0u) << context;
  EXPECT_NE(context.find(report.needle_text), std::string::npos);
  EXPECT_NE(context.find("The ferry left the mainland"), std::string::npos);
  EXPECT_NE(report.needle_text.find(report.value), std::string::npos);
  EXPECT_NE(report.answer_prefix.find(sample.meta.at("key").get<std::string>()), std::string::npos);
  const std::string tail = "<|im_end|>\n<|im_start|>assistant\n" + report.answer_prefix;
  ASSERT_GE(question.size(), tail.size());
  EXPECT_EQ(question.substr(question.size() - tail.size()), tail) << question;
  EXPECT_EQ(question.find(report.value), std::string::npos) << question;
  // The needle starts at the reported token.
  const auto at = sample.meta.at("needle_token").get<size_t>();
  ASSERT_LT(at, sample.context.size());
  const std::vector<int32_t> from_needle(sample.context.begin() + static_cast<ptrdiff_t>(at),
                                         sample.context.end());
  const std::string rest = model.tokenizer->decode(from_needle);
  EXPECT_EQ(rest.find(report.needle_text), rest.find_first_not_of(' ')) << rest.substr(0, 80);
  const auto j = recall_demo_json(report);
  EXPECT_EQ(j["prompt_format"], "chat template chatml");
  EXPECT_EQ(j["answer_prefix"], report.answer_prefix);
}

TEST(RecallDemo, BadInputIsOneLineAndNonZero) {
  testing::expect_run_fails_with_one_line("demo --quiet -m /nonexistent/recall.gguf", "not found");
  testing::expect_run_fails_with_one_line("demo --quiet --budget 0", "--budget");
  testing::expect_run_fails_with_one_line("demo --quiet --budget 32,abc", "--budget");
  testing::expect_run_fails_with_one_line("demo --quiet --synthetic -m x.gguf", "--synthetic");
  SKIP_WITHOUT_RECALL_MODEL();
  testing::expect_run_fails_with_one_line(
      "demo --quiet -m '" + recall_model_path().string() + "' --length 4096", "context");
  testing::expect_run_fails_with_one_line(
      "demo --quiet -m '" + recall_model_path().string() + "' --depth 150", "depth");
  testing::expect_run_fails_with_one_line(
      "demo --quiet -m '" + recall_model_path().string() + "' --press nosuchpress", "nosuchpress");
  testing::expect_run_fails_with_one_line(
      "demo --quiet -m '" + recall_model_path().string() + "' --chat-template nosuchtemplate",
      "--chat-template: unknown chat template 'nosuchtemplate'");
  testing::expect_run_fails_with_one_line(
      "demo --quiet -m '" + recall_model_path().string() + "' --chat-template chatml --length 40",
      "no room");
}

}  // namespace
}  // namespace protokv::eval
