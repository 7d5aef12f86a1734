// SPDX-License-Identifier: Apache-2.0
// RULER generators and scoring (eval/ruler.h) and `eval ruler`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>

#include "eval/ruler.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

std::shared_ptr<Tokenizer> stories_tokenizer() {
  return Tokenizer::load_llama2c((testing::stories_dir() / "tok512.bin").string(), 512);
}

TEST(Ruler, StringMatchAllAndPartAsDefinedByRuler) {
  // string_match_all: share of references contained, case-insensitive.
  EXPECT_DOUBLE_EQ(eval::string_match_all("The numbers are 123 and 456", {"123", "456"}), 1.0);
  EXPECT_DOUBLE_EQ(eval::string_match_all("only 123 here", {"123", "456", "789", "000"}), 0.25);
  EXPECT_DOUBLE_EQ(eval::string_match_all("VAR abcde", {"ABCDE", "FGHIJ"}), 0.5);
  // string_match_part: 1 when any reference is contained.
  EXPECT_DOUBLE_EQ(eval::string_match_part("paris, france", {"London", "Paris"}), 1.0);
  EXPECT_DOUBLE_EQ(eval::string_match_part("rome", {"London", "Paris"}), 0.0);
}

TEST(Ruler, ZetaOfTwoIsPiSquaredOverSix) {
  EXPECT_NEAR(eval::riemann_zeta(2.0), std::numbers::pi * std::numbers::pi / 6.0, 1e-9);
  EXPECT_NEAR(eval::riemann_zeta(4.0), std::pow(std::numbers::pi, 4) / 90.0, 1e-9);
  EXPECT_THROW(eval::riemann_zeta(1.0), Error);
}

TEST(Ruler, DefaultLengthsFollowTheModelContext) {
  EXPECT_EQ(eval::default_ruler_lengths(512), (std::vector<int64_t>{512}));
  EXPECT_EQ(eval::default_ruler_lengths(20000), (std::vector<int64_t>{4096, 8192, 16384}));
}

TEST(Ruler, SamplesFitTheirLengthAndContainTheirAnswers) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = stories_tokenizer();
  eval::RulerOptions o;
  o.lengths = {4096};
  o.samples = 2;
  o.tasks = {"niah_single_1",
             "niah_single_3",
             "niah_multikey_2",
             "niah_multivalue",
             "niah_multiquery",
             "vt",
             "fwe"};
  const auto samples = eval::make_ruler_samples(*tok, o);
  ASSERT_EQ(samples.size(), 14u);
  for (const auto& s : samples) {
    ASSERT_TRUE(s.error.empty()) << s.id << ": " << s.error;
    const int64_t total =
        static_cast<int64_t>(s.context.size() + s.question.size()) + s.max_new_tokens;
    EXPECT_LE(total, 4096) << s.id;
    EXPECT_GT(total, 3500) << s.id;  // filled close to the length
    const std::string context = tok->decode(s.context);
    for (const auto& a : s.answers) EXPECT_NE(context.find(a), std::string::npos) << s.id << a;
    const std::string task = s.meta["task"];
    const std::map<std::string, size_t> expected_answers = {
        {"niah_multivalue", 4}, {"niah_multiquery", 4}, {"vt", 5}, {"fwe", 3}};
    if (expected_answers.count(task) > 0) {
      EXPECT_EQ(s.answers.size(), expected_answers.at(task)) << s.id;
    }
    // Every non-QA task (NIAH included) is scored with RULER's string_match_all: a reply with
    // one of the n references scores 1/n (string_match_part would give 1).
    EXPECT_EQ(s.meta["metric"], "string_match_all") << s.id;
    EXPECT_DOUBLE_EQ(eval::ruler_score(s, "so: " + s.answers[0]), 1.0 / s.answers.size()) << s.id;
    EXPECT_DOUBLE_EQ(eval::ruler_score(s, "no idea"), 0.0) << s.id;
    if (task == "niah_single_1") {
      // niah.py's singular wording for one needle and one query.
      EXPECT_EQ(context.rfind("A special magic number is hidden", 0), 0u) << context.substr(0, 80);
      EXPECT_NE(tok->decode(s.question).find("mentioned in the provided text is"),
                std::string::npos);
    }
  }
  // Seeded: the same options give the same samples.
  const auto again = eval::make_ruler_samples(*tok, o);
  for (size_t i = 0; i < samples.size(); ++i) EXPECT_EQ(samples[i].context, again[i].context);
}

TEST(Ruler, TooShortLengthIsASkippedSampleAndUnknownTaskAnError) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = stories_tokenizer();
  eval::RulerOptions o;
  o.lengths = {100};
  o.tasks = {"niah_single_1"};
  o.samples = 1;
  const auto samples = eval::make_ruler_samples(*tok, o);
  EXPECT_NE(samples[0].error.find("too short"), std::string::npos);
  o.tasks = {"niah_single_9"};
  EXPECT_THROW(eval::make_ruler_samples(*tok, o), Error);
}

TEST(Ruler, QaTasksReadSquadAndHotpotqa) {
  PROTOKV_REQUIRE_STORIES();
  testing::TempDir dir;
  {
    std::ofstream squad(dir / "squad.json");
    squad << R"({"data": [{"title": "t", "paragraphs": [
      {"context": "The river Alba flows to the sea.", "qas": [
        {"question": "Where does the Alba flow?", "answers": [{"text": "to the sea"}],
         "is_impossible": false},
        {"question": "Unanswerable?", "answers": [], "is_impossible": true}]},
      {"context": "Bread is baked at dawn.", "qas": []}]},
      {"title": "u", "paragraphs": [{"context": "Owls hunt at night.", "qas": [
        {"question": "When do owls hunt?", "answers": [{"text": "at night"}]}]}]}]})";
    std::ofstream hotpot(dir / "hotpot.json");
    hotpot << R"([{"question": "Which is older?", "answer": "Rome",
      "context": [["Rome", ["Rome is old.", " Very old."]], ["Paris", ["Paris is younger."]]]}])";
    std::ofstream bad(dir / "bad.json");
    bad << R"({"data": [{"paragraphs": [{"qas": []}]}]})";
  }
  const auto squad = eval::read_squad((dir / "squad.json").string());
  EXPECT_EQ(squad.documents.size(), 3u);
  ASSERT_EQ(squad.questions.size(), 2u);  // the impossible one is dropped
  EXPECT_EQ(squad.questions[0].answers, std::vector<std::string>{"to the sea"});
  EXPECT_EQ(squad.questions[0].more.size(), 1u);  // the other paragraph of its article
  const auto hotpot = eval::read_hotpotqa((dir / "hotpot.json").string());
  EXPECT_EQ(hotpot.documents[1], "Rome\nRome is old. Very old.");
  EXPECT_THROW(eval::read_squad((dir / "bad.json").string()), Error);

  const auto tok = stories_tokenizer();
  eval::RulerOptions o;
  o.tasks = {"qa_1", "qa_2"};
  o.lengths = {512};
  o.samples = 2;
  o.squad_path = (dir / "squad.json").string();
  o.hotpotqa_path = (dir / "hotpot.json").string();
  const auto samples = eval::make_ruler_samples(*tok, o);
  ASSERT_EQ(samples.size(), 4u);
  for (const auto& s : samples) {
    ASSERT_TRUE(s.error.empty()) << s.error;
    EXPECT_EQ(s.meta["metric"], "string_match_part");
    const std::string text = tok->decode(s.context);
    EXPECT_NE(text.find("Document 1:"), std::string::npos) << text;
    EXPECT_NE(text.find(s.answers[0]), std::string::npos) << text;  // gold document present
  }
  o.squad_path.clear();
  EXPECT_THROW(eval::make_ruler_samples(*tok, o), Error);
}

TEST(RulerCli, RunsEndToEnd) {
  PROTOKV_REQUIRE_STORIES();
  const auto dir = testing::stories_dir();
  const std::string model = fmt::format("-m '{}' -z '{}'", (dir / "stories260K.bin").string(),
                                        (dir / "tok512.bin").string());
  auto r = testing::run_protokv("eval ruler " + model +
                                " --tasks niah_single_1,fwe --samples 1 --press full,snapkv "
                                "--budget 64 --quiet -t 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["per_task"]["snapkv@64"].contains("fwe"));
  EXPECT_TRUE(j["per_task"]["full"].contains("average"));
  // Per task: the paired difference against full, consistent with the per-task scores (every
  // sample scored by both runs).
  EXPECT_FALSE(j["per_task_paired"].contains("full"));
  for (const char* task : {"niah_single_1", "fwe"}) {
    const auto& d = j["per_task_paired"]["snapkv@64"][task];
    ASSERT_TRUE(d.is_object()) << j["per_task_paired"];
    EXPECT_EQ(d["paired"].get<int>(), 1);
    EXPECT_TRUE(d["ci95"].is_null());  // one pair: no interval
    EXPECT_NEAR(
        d["diff"].get<double>(),
        j["per_task"]["snapkv@64"][task].get<double>() - j["per_task"]["full"][task].get<double>(),
        1e-9);
  }
  r = testing::run_protokv("eval ruler " + model + " --tasks nope");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown RULER task 'nope'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
}

// kvpress's leaderboard protocol: query-agnostic, the context length capped at the model's
// (stories260K: 512), kept shares 0.75 .. 0.125 = kvpress compression ratios 0.25 .. 0.875, full
// added as the reference; the score-by-ratio table restates each ratio run's score and its
// paired difference against full, and the plot is written.
TEST(RulerCli, KvpressProtocolGivesTheScoreByCompressionRatio) {
  PROTOKV_REQUIRE_STORIES();
  const auto dir = testing::stories_dir();
  const std::string model = fmt::format("-m '{}' -z '{}'", (dir / "stories260K.bin").string(),
                                        (dir / "tok512.bin").string());
  testing::TempDir tmp;
  auto r = testing::run_protokv("eval ruler " + model +
                                " --protocol kvpress --press snapkv,streaming_llm --tasks "
                                "niah_single_1,fwe --samples 2 --quiet -t 1 --json --out '" +
                                tmp.path().string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["mode"], "query-agnostic");
  EXPECT_EQ(j["config"]["ruler"]["lengths"], nlohmann::json::array({512}));
  EXPECT_EQ(j["config"]["protocol"]["name"], "kvpress");
  std::map<std::string, nlohmann::json> summary;
  for (const auto& s : j["summary"]) summary[s["run"].get<std::string>()] = s;
  ASSERT_EQ(summary.size(), 9u);  // full + 2 presses x 4 ratios
  const double full = 100.0 * summary.at("full")["score"].get<double>();
  for (const char* press : {"snapkv", "streaming_llm"}) {
    const auto& by_ratio = j["by_compression_ratio"][press];
    ASSERT_EQ(by_ratio.size(), 4u) << by_ratio;
    for (const auto& [ratio, kept] : std::vector<std::pair<std::string, std::string>>{
             {"0.25", "0.75"}, {"0.5", "0.5"}, {"0.75", "0.25"}, {"0.875", "0.125"}}) {
      const auto& cell = by_ratio[ratio];
      const std::string run = std::string(press) + "@r" + kept;
      EXPECT_EQ(cell["run"], run);
      const double score = 100.0 * summary.at(run)["score"].get<double>();
      EXPECT_NEAR(cell["score"].get<double>(), score, 1e-9);
      EXPECT_NEAR(cell["diff"].get<double>(), score - full, 1e-9);
    }
  }
  EXPECT_TRUE(std::filesystem::is_regular_file(tmp / "score_vs_ratio.svg"));
  EXPECT_NE(r.err.find("wrote"), std::string::npos);
  for (const char* fixed : {"--mode query-aware", "--budget 64", "--ratio 0.5", "--lengths 256"})
    testing::expect_run_fails_with_one_line("eval ruler " + model + " --protocol kvpress " + fixed,
                                            "the kvpress protocol fixes --");
  testing::expect_run_fails_with_one_line("eval ruler " + model + " --protocol nope",
                                          "not a known protocol");
}

}  // namespace
}  // namespace protokv
