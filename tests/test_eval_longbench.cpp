// SPDX-License-Identifier: Apache-2.0
// LongBench data, truncation and official metrics (eval/longbench.h), and `eval longbench`.
// Expected metric values are worked out by hand from the definitions in THUDM/LongBench
// metrics.py and the `rouge` package's rouge_score.py (comments show the arithmetic).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "eval/longbench.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::CommandResult;
using testing::expect_one_line_error;
using testing::run_protokv;
using testing::TempDir;

std::filesystem::path fixture_dir() {
  return std::filesystem::path(PROTOKV_SOURCE_DIR) / "tests" / "data" / "longbench";
}

std::string stories_args() {
  const auto dir = testing::stories_dir();
  return fmt::format("-m '{}' -z '{}'", (dir / "stories260K.bin").string(),
                     (dir / "tok512.bin").string());
}

TEST(LongbenchMetrics, QaF1) {
  // normalize: "eiffel tower paris" vs "eiffel tower" ("the" and ',' removed): 2 common,
  // P = 2/3, R = 1, F1 = 2 * (2/3) / (5/3) = 0.8.
  EXPECT_NEAR(eval::qa_f1_score("The Eiffel Tower, Paris", "Eiffel tower"), 0.8, 1e-12);
  EXPECT_DOUBLE_EQ(eval::qa_f1_score("An apple", "apple"), 1.0);  // article removed
  EXPECT_DOUBLE_EQ(eval::qa_f1_score("banana", "apple"), 0.0);
  // Counter intersection: pred {x, b, b}, truth {b, c}: min(2, 1) = 1 common, P = 1/3,
  // R = 1/2, F1 = 2 * (1/6) / (5/6) = 0.4.
  EXPECT_NEAR(eval::qa_f1_score("x b b", "b c"), 0.4, 1e-12);
}

TEST(LongbenchMetrics, QaF1Chinese) {
  // "猫和狗" segments into 猫/和/狗 (jieba too: single-character words); truth 狗:
  // 1 common, P = 1/3, R = 1, F1 = 0.5.
  EXPECT_NEAR(eval::qa_f1_zh_score("猫和狗", "狗"), 0.5, 1e-12);
  // Punctuation (Chinese and ASCII) is dropped before matching.
  EXPECT_NEAR(eval::qa_f1_zh_score("狗。", "狗！"), 1.0, 1e-12);
}

TEST(LongbenchMetrics, RougeL) {
  // One sentence each. Reference word set {the, cat, is, on, mat} (m = 5), hypothesis
  // {the, cat, sat, on, mat} (n = 5). LCS words {the, cat, on, mat}: 4. R = P = 0.8,
  // F = 2 * 0.64 / (1.6 + 1e-8).
  EXPECT_NEAR(eval::rouge_score("the cat sat on the mat", "the cat is on the mat"),
              2.0 * 0.64 / (1.6 + 1e-8), 1e-12);
  // Summary level with word sets: hyp sentences "a b" | "c d", ref "a c" | "b d"; the union of
  // the per-pair LCS words is {a, b, c, d}: R = P = 1, F = 2 / (2 + 1e-8).
  EXPECT_NEAR(eval::rouge_score("a b. c d", "a c. b d"), 2.0 / (2.0 + 1e-8), 1e-12);
  // An empty hypothesis makes the package raise; metrics.py returns 0.
  EXPECT_DOUBLE_EQ(eval::rouge_score("", "a b"), 0.0);
  EXPECT_DOUBLE_EQ(eval::rouge_score("...", "a b"), 0.0);
  // Chinese: characters are the words; 天空是蓝色的 vs 天空是蓝色: LCS 5 of 6 hyp, 5 of 5 ref:
  // P = 5/6, R = 1, F = 2 * (5/6) / (11/6 + 1e-8).
  EXPECT_NEAR(eval::rouge_zh_score("天空是蓝色的", "天空是蓝色"),
              2.0 * (5.0 / 6.0) / (11.0 / 6.0 + 1e-8), 1e-12);
}

TEST(LongbenchMetrics, Classification) {
  const std::vector<std::string> classes = {"Abbreviation", "Entity",   "Description",
                                            "Human being",  "Location", "Numeric value"};
  EXPECT_DOUBLE_EQ(eval::classification_score("Location", "Location", classes), 1.0);
  // Two classes named, the right one among them: 1/2.
  EXPECT_DOUBLE_EQ(eval::classification_score("Human being or Location", "Location", classes), 0.5);
  EXPECT_DOUBLE_EQ(eval::classification_score("Entity", "Location", classes), 0.0);
  // metrics.py removes from the list it iterates: with classes A, AB, ABC and truth ABC, "A" is
  // removed and "AB" is skipped, so two matches remain: 1/2 (not 1).
  EXPECT_DOUBLE_EQ(eval::classification_score("ABC", "ABC", {"A", "AB", "ABC"}), 0.5);
}

TEST(LongbenchMetrics, RetrievalCountAndCode) {
  // Numbers in the prediction: 3 and 12; one equals the paragraph id: 1/2.
  EXPECT_DOUBLE_EQ(eval::retrieval_score("Paragraph 3, not 12", "Paragraph 3"), 0.5);
  EXPECT_DOUBLE_EQ(eval::retrieval_score("no number", "Paragraph 3"), 0.0);
  EXPECT_DOUBLE_EQ(eval::retrieval_zh_score("段落5", "段落5"), 1.0);
  // Numbers 7 and 10, one right: 1/2.
  EXPECT_DOUBLE_EQ(eval::count_score("There are 7 unique paragraphs out of 10", "7"), 0.5);
  EXPECT_DOUBLE_EQ(eval::count_score("07", "7"), 0.0);  // string comparison, as str(n)
  // First line without # ` //: "return x + 1" (12 chars) vs "return x+1" (10): LCS 10,
  // ratio 20/22 = 0.909 -> round(90.9) = 91 -> 0.91.
  EXPECT_DOUBLE_EQ(eval::code_sim_score("# comment\nreturn x + 1\n", "return x+1"), 0.91);
  EXPECT_DOUBLE_EQ(eval::code_sim_score("// only comments", "return x"), 0.0);
}

TEST(LongbenchMetrics, SampleScoreTakesFirstLineAndBestAnswer) {
  eval::LongctxSample sample;
  sample.answers = {"London", "Paris"};
  sample.meta = {{"metric", "qa_f1"}, {"first_line_only", true}};
  EXPECT_DOUBLE_EQ(eval::longbench_score(sample, "\nParis\nLondon"), 1.0);  // best answer
  sample.answers = {"London"};
  EXPECT_DOUBLE_EQ(eval::longbench_score(sample, "\nParis\nLondon"), 0.0);  // first line only
  sample.meta["first_line_only"] = false;
  EXPECT_NEAR(eval::longbench_score(sample, "\nParis\nLondon"), 2.0 / 3.0, 1e-12);
}

TEST(Longbench, BucketsAndDatasets) {
  EXPECT_EQ(eval::longbench_bucket(3999), "0-4k");
  EXPECT_EQ(eval::longbench_bucket(4000), "4-8k");
  EXPECT_EQ(eval::longbench_bucket(8000), "8k+");
  EXPECT_EQ(eval::longbench_datasets().size(), 21u);
  EXPECT_EQ(eval::find_longbench_dataset("gov_report").max_new_tokens, 512);
  EXPECT_EQ(eval::find_longbench_dataset("trec").metric, "classification");
  EXPECT_THROW(eval::find_longbench_dataset("nope"), Error);
}

TEST(Longbench, ReadsTheFixtureAndReportsBadLines) {
  const auto examples = eval::read_longbench_jsonl((fixture_dir() / "hotpotqa.jsonl").string());
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].id, "fixture-hotpotqa-0");
  EXPECT_EQ(examples[0].answers, std::vector<std::string>{"Harbortown"});
  TempDir dir;
  {
    std::ofstream out(dir / "bad.jsonl");
    out << "{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"]}\n"
        << "{not json\n"
        << "{\"input\": \"q\", \"answers\": [\"a\"]}\n"
        // A length beyond int64_t (a fuzzing finding: undefined behaviour in the conversion).
        << "{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"], \"length\": 2e67}\n"
        << "{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"], \"length\": 12}\n";
  }
  const auto bad = eval::read_longbench_jsonl((dir / "bad.jsonl").string());
  ASSERT_EQ(bad.size(), 5u);
  EXPECT_NE(bad[3].error.find("line 4: field 'length' must be a whole number"), std::string::npos)
      << bad[3].error;
  EXPECT_TRUE(bad[4].error.empty()) << bad[4].error;
  EXPECT_EQ(bad[4].length, 12);
  EXPECT_TRUE(bad[0].error.empty());
  EXPECT_NE(bad[1].error.find("line 2: not a JSON object"), std::string::npos) << bad[1].error;
  EXPECT_NE(bad[2].error.find("missing field 'context'"), std::string::npos) << bad[2].error;
  EXPECT_THROW(eval::read_longbench_jsonl((dir / "none.jsonl").string()), Error);
}

TEST(Longbench, MiddleTruncationKeepsBothEnds) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = Tokenizer::load_llama2c((testing::stories_dir() / "tok512.bin").string(), 512);
  eval::LongbenchExample ex;
  ex.id = "x";
  ex.input = "Who?";
  ex.answers = {"a"};
  for (int i = 0; i < 200; ++i) ex.context += fmt::format("word{} ", i);
  const auto& d = eval::find_longbench_dataset("hotpotqa");
  const auto full = eval::make_longbench_sample(*tok, d, ex, 0, 100000);
  const auto cut = eval::make_longbench_sample(*tok, d, ex, 320, 100000);
  ASSERT_LT(full.question.size(), 160u);
  EXPECT_EQ(cut.context.size() + cut.question.size(), 320u);
  EXPECT_EQ(cut.question, full.question);  // the question is at the end: kept whole
  EXPECT_TRUE(std::equal(cut.context.begin(), cut.context.begin() + 160, full.context.begin()));
  EXPECT_TRUE(std::equal(cut.context.end() - 10, cut.context.end(), full.context.end() - 10));
  // Without --max-length, a prompt beyond the context is one clear error.
  EXPECT_THROW(eval::make_longbench_sample(*tok, d, ex, 0, 256), Error);
}

TEST(LongbenchCli, RunsOnTheFixtureAndLongbenchE) {
  PROTOKV_REQUIRE_STORIES();
  CommandResult r =
      run_protokv("eval longbench " + stories_args() + " --data '" + fixture_dir().string() +
                  "' --press full,snapkv --budget 32 --quiet -t 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["per_dataset"]["full"].size(), 10u);  // 9 datasets + average
  EXPECT_EQ(j["summary"][0]["scored"], 10);
  r = run_protokv("eval longbench " + stories_args() + " --data '" + fixture_dir().string() +
                  "' --e --quiet -t 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["per_dataset_length"]["full"].contains("hotpotqa:8k+"));
}

TEST(LongbenchCli, BadInputIsOneClearMessageOrASkippedSample) {
  PROTOKV_REQUIRE_STORIES();
  const std::string base = "eval longbench " + stories_args() + " --quiet -t 1 --data ";
  expect_one_line_error(run_protokv(base + "'" + fixture_dir().string() + "' --datasets nope"),
                        "unknown LongBench dataset 'nope'");
  TempDir dir;
  expect_one_line_error(run_protokv(base + "'" + dir.path().string() + "'"), "no LongBench");
  {
    std::ofstream out(dir / "hotpotqa.jsonl");
    out << "{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"], \"_id\": \"ok\"}\n"
        << "{broken\n";
  }
  CommandResult r = run_protokv(base + "'" + dir.path().string() + "' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["summary"][0]["scored"], 1);
  EXPECT_EQ(j["summary"][0]["skipped"], 1);
  EXPECT_NE(r.err.find("line 2: not a JSON object"), std::string::npos) << r.err;
  {
    std::string long_context;
    for (int i = 0; i < 600; ++i) long_context += "word ";
    std::ofstream out(dir / "hotpotqa.jsonl");
    out << nlohmann::json{{"input", "q"}, {"context", long_context}, {"answers", {"a"}}}.dump()
        << "\n";
  }
  expect_one_line_error(run_protokv(base + "'" + dir.path().string() + "'"), "give --max-length");
  r = run_protokv(base + "'" + dir.path().string() + "' --max-length 200 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["summary"][0]["scored"], 1);
}

}  // namespace
}  // namespace protokv

namespace protokv {
namespace {

// pred.py's build_chat: an instruct model's template wraps the prompt as the user turn, for the
// datasets that ask for it; a model without a template, or a dataset without chat, stays plain.
TEST(Longbench, ChatWrapUsesTheModelsTemplateForChatDatasets) {
  const auto path = testing::shared_dir() / "tokenizers" / "hf" / "llama3" / "tokenizer.json";
  if (!std::filesystem::exists(path)) {
    if (std::getenv("CI")) FAIL() << path << " not found";
    GTEST_SKIP() << path << " not found (set PROTOKV_SHARED_DIR); skipping";
  }
  const auto llama3 = Tokenizer::from_hf_json(path.string());
  const eval::LongbenchDataset& qa = eval::find_longbench_dataset("narrativeqa");
  ASSERT_TRUE(qa.chat_template);
  const eval::ChatWrap wrap = eval::longbench_chat_wrap(qa, *llama3);
  EXPECT_EQ(wrap.prefix, "<|start_header_id|>user<|end_header_id|>\n\n");
  EXPECT_EQ(wrap.suffix, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");

  const eval::LongbenchDataset& trec = eval::find_longbench_dataset("trec");
  ASSERT_FALSE(trec.chat_template);
  const eval::ChatWrap plain = eval::longbench_chat_wrap(trec, *llama3);
  EXPECT_TRUE(plain.prefix.empty() && plain.suffix.empty());
}

}  // namespace
}  // namespace protokv
