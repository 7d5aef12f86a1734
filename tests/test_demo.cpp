// `protokv demo` on the shipped recall model (models/protokv-recall.gguf): the structure of the
// story (full first, every registered press at both budgets, each answer checked against the
// planted value) and its bad-input errors. Which presses answer correctly is the model's business
// and is not pinned here.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "eval/demo.h"
#include "press/entry.h"
#include "test_util.h"

namespace protokv::eval {
namespace {

using testing::run_protokv;

std::filesystem::path recall_model_path() {
  return std::filesystem::path(PROTOKV_SOURCE_DIR) / "models" / "protokv-recall.gguf";
}

#define SKIP_WITHOUT_RECALL_MODEL()                               \
  if (!std::filesystem::is_regular_file(recall_model_path()))     \
  GTEST_SKIP() << "recall model " << recall_model_path().string() \
               << " is absent (it is committed in models/; restore it to run this test)"

// Without -m the demo finds the checkout's model from the binary's location (the test runs in the
// build folder, not the repository root).
TEST(RecallDemo, JsonHasEveryPressAtBothBudgetsWithCheckedAnswers) {
  SKIP_WITHOUT_RECALL_MODEL();
  const auto r = run_protokv("demo --json --quiet -t 1 --budget 32,128");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 2032);
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
}

}  // namespace
}  // namespace protokv::eval
