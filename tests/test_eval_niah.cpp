// SPDX-License-Identifier: Apache-2.0
// The long-context harness (eval/longctx_runner.h) and `eval niah`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "eval/longctx_bench.h"
#include "eval/longctx_runner.h"
#include "eval/longctx_words.h"
#include "eval/niah.h"
#include "eval/spec_list.h"
#include "eval/statistics.h"
#include "protokv/error.h"
#include "protokv/limits.h"
#include "protokv/press_spec.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::CommandResult;
using testing::expect_one_line_error;
using testing::run_protokv;
using testing::TempDir;

std::string stories_args() {
  const auto dir = testing::stories_dir();
  return fmt::format("-m '{}' -z '{}'", (dir / "stories260K.bin").string(),
                     (dir / "tok512.bin").string());
}

LoadedModel load_stories() {
  return load_model((testing::stories_dir() / "stories260K.bin").string(),
                    (testing::stories_dir() / "tok512.bin").string());
}

// Lengths 128 and 200 x depths 0 and 100: four prompts.
eval::NiahBenchmark small_niah_grid() {
  eval::NiahBenchmark niah;
  niah.niah.lengths = {128, 200};
  niah.niah.depths = {0, 100};
  return niah;
}

std::vector<std::string> read_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

TEST(LongctxRunner, PairedDifferenceMatchesHandComputation) {
  // d = {1, 0, -1, 0}: mean 0, sd = sqrt(2/3), half-width t(0.975, 3) * sd / 2 = 3.182 * sd / 2.
  const eval::PairedDifference d = eval::paired_difference({1, 1, 0, 1}, {0, 1, 1, 1});
  EXPECT_DOUBLE_EQ(d.mean, 0.0);
  EXPECT_NEAR(d.half_width(), 3.182 * std::sqrt(2.0 / 3.0) / 2.0, 1e-12);
  // One sample: a mean, but no interval.
  const eval::PairedDifference one = eval::paired_difference({1}, {0});
  EXPECT_DOUBLE_EQ(one.mean, 1.0);
  EXPECT_TRUE(std::isnan(one.half_width()));
}

TEST(LongctxRunner, RunSpecsPutFullOnceAndNeedABudget) {
  const auto runs = eval::make_run_specs({"full", "snapkv", "full"}, {16, 32}, {0.5});
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].label(), "full");
  EXPECT_EQ(runs[1].label(), "snapkv@16");
  EXPECT_EQ(runs[3].label(), "snapkv@r0.5");
  EXPECT_THROW(eval::make_run_specs({"snapkv"}, {}, {}), Error);
  EXPECT_THROW(eval::parse_ratio_list("0.5,1.5"), Error);
  EXPECT_THROW(eval::make_run_specs({"snapkv", "snapkv"}, {16}, {}), Error);  // labels collide
  // At most limits::kMaxEvalRuns runs (full adds none beyond its one): at the limit, and one over.
  std::vector<int64_t> budgets(limits::kMaxEvalRuns / 2);
  for (size_t i = 0; i < budgets.size(); ++i) budgets[i] = static_cast<int64_t>(i) + 1;
  EXPECT_EQ(eval::make_run_specs({"full", "snapkv", "h2o"}, budgets, {}).size(),
            limits::kMaxEvalRuns + 1);
  budgets.push_back(100000);
  EXPECT_THROW(eval::make_run_specs({"snapkv", "h2o"}, budgets, {}), Error);
}

TEST(LongctxRunner, SummaryPairsOnlySamplesBothScored) {
  std::vector<eval::LongctxRecord> records;
  auto add = [&](const std::string& run, const std::string& id, double score,
                 const std::string& error = "") {
    eval::LongctxRecord r;
    r.run = run;
    r.id = id;
    r.score = score;
    r.error = error;
    records.push_back(r);
  };
  add("full", "a", 1);
  add("full", "b", 1);
  add("full", "c", 0);
  add("snapkv@8", "a", 0);
  add("snapkv@8", "b", 1);
  add("snapkv@8", "c", 0, "refused");
  const auto runs = eval::make_run_specs({"full", "snapkv"}, {8}, {});
  const auto s = eval::summarize(records, runs, "full");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NEAR(s[0].mean_score, 2.0 / 3.0, 1e-12);
  EXPECT_EQ(s[1].scored, 2);
  EXPECT_EQ(s[1].skipped, 1);
  EXPECT_EQ(s[1].paired, 2);
  EXPECT_DOUBLE_EQ(s[1].diff_mean, -0.5);
}

TEST(LongctxRunner, GroupSummaryPairsWithinTheGroup) {
  // The per-task / per-length differences of `eval ruler` and `eval niah`: summarize() with a
  // group filter pairs each run with the reference on that group's samples only.
  std::vector<eval::LongctxRecord> records;
  auto add = [&](const std::string& run, const std::string& id, const std::string& task,
                 double score) {
    eval::LongctxRecord r;
    r.run = run;
    r.id = id;
    r.score = score;
    r.meta = {{"task", task}};
    records.push_back(r);
  };
  for (const char* id : {"a1", "a2", "a3"}) add("full", id, "a", 1);
  add("full", "b1", "b", 0);
  add("full", "b2", "b", 1);
  add("snapkv@8", "a1", "a", 1);
  add("snapkv@8", "a2", "a", 0);
  add("snapkv@8", "a3", "a", 0);
  add("snapkv@8", "b1", "b", 1);
  add("snapkv@8", "b2", "b", 1);
  const auto runs = eval::make_run_specs({"full", "snapkv"}, {8}, {});
  const auto in_task = [](const std::string& task) {
    return [task](const eval::LongctxRecord& r) { return r.meta.value("task", "") == task; };
  };
  const auto a = eval::summarize(records, runs, "full", in_task("a"));
  EXPECT_EQ(a[1].paired, 3);
  EXPECT_NEAR(a[1].diff_mean, -2.0 / 3.0, 1e-12);
  // d = {0, -1, -1}: sd = sqrt(1/3), half-width t(0.975, 2) * sd / sqrt(3) = 4.303 / 3.
  EXPECT_NEAR(a[1].diff_ci95, 4.303 / 3.0, 1e-12);
  const auto b = eval::summarize(records, runs, "full", in_task("b"));
  EXPECT_EQ(b[1].paired, 2);
  EXPECT_DOUBLE_EQ(b[1].diff_mean, 0.5);
}

TEST(LongctxRunner, EtaFormat) {
  EXPECT_EQ(eval::format_eta(0, 10, 0.0), "?");
  EXPECT_EQ(eval::format_eta(1, 11, 1000.0), "10s");
  EXPECT_EQ(eval::format_eta(1, 101, 1000.0), "1m40s");
}

TEST(LongctxWords, SeededGeneratorsRepeat) {
  std::mt19937_64 a(7), b(7);
  EXPECT_EQ(eval::random_number_text(a), eval::random_number_text(b));
  const std::string uuid = eval::random_uuid(a);
  EXPECT_EQ(uuid.size(), 36u);
  EXPECT_EQ(uuid[14], '4');
  EXPECT_GT(eval::adjective_noun_keys().size(), 1000u);
  const auto idx = eval::sample_indices(a, 10, 10);
  EXPECT_EQ(std::set<int64_t>(idx.begin(), idx.end()).size(), 10u);
}

TEST(Niah, DefaultGrid) {
  const auto small = eval::default_niah_lengths(512, 16);
  ASSERT_EQ(small.size(), 4u);
  EXPECT_EQ(small.front(), 124);
  EXPECT_EQ(small.back(), 496);
  const auto big = eval::default_niah_lengths(32768, 16);
  EXPECT_EQ(big.front(), 512);
  EXPECT_EQ(big.back(), 32752);
  EXPECT_GE(big.size(), 4u);
  EXPECT_LE(big.size(), 8u);
  EXPECT_EQ(eval::default_niah_depths().size(), 11u);
}

// The library call the CLI and the Python package share: a press given as an object (as a Python
// press is) runs under its own name and answers exactly as the same press given by spec; the
// progress sink sees every step.
TEST(Niah, BenchmarkRunsPressObjectsAndReportsProgress) {
  PROTOKV_REQUIRE_STORIES();
  const LoadedModel model = load_stories();
  const eval::NiahBenchmark niah = small_niah_grid();
  eval::LongctxBenchmarkRun run;
  run.options.runs = eval::make_run_specs({"full", "snapkv", "mine"}, {32}, {});
  run.options.runs[2].press_object = PressSpec::parse("snapkv", "");
  std::vector<std::pair<int64_t, int64_t>> steps;
  run.options.progress_sink = [&](int64_t done, int64_t total, const std::string&) {
    steps.emplace_back(done, total);
  };
  const eval::LongctxReport report = eval::run_niah_benchmark(model, niah, run);
  ASSERT_EQ(report.records.size(), 3u * 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& spec = report.records[4 + i];
    const auto& object = report.records[8 + i];
    EXPECT_EQ(spec.run, "snapkv@32");
    EXPECT_EQ(object.run, "mine@32");
    EXPECT_TRUE(object.error.empty()) << object.error;
    EXPECT_EQ(object.prediction, spec.prediction);
    EXPECT_EQ(object.kv_bytes, spec.kv_bytes);
  }
  EXPECT_EQ(report.results["summary"][2]["run"], "mine@32");
  EXPECT_EQ(report.figures.size(), 3u);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), std::make_pair(int64_t{12}, int64_t{12}));
  // A press object carries its own allocator.
  run.options.alloc = "pyramid";
  try {
    eval::run_niah_benchmark(model, niah, run);
    ADD_FAILURE() << "an allocator beside a press object was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("carries its own allocator"), std::string::npos)
        << e.what();
  }
  // A disabled progress calls no sink.
  steps.clear();
  run.options.alloc.clear();
  run.options.progress = false;
  run.options.runs.resize(1);
  eval::run_niah_benchmark(model, niah, run);
  EXPECT_TRUE(steps.empty());
}

TEST(Niah, BatchedDecodeGivesTheSameRecords) {
  PROTOKV_REQUIRE_STORIES();
  const LoadedModel model = load_stories();
  const eval::NiahBenchmark niah = small_niah_grid();
  // Presses with decode-time state too (h2o's running scores, clusterkv's re-clustering, pod's
  // window, chelsea's merges), and chelsea@12, which refuses its budget: an error record.
  eval::LongctxBenchmarkRun run;
  run.options.runs = eval::make_run_specs(
      {"full", "snapkv", "h2o:decode=1", "clusterkv", "chelsea", "pod", "protokv"}, {12, 40}, {});
  run.options.progress = false;
  for (const bool query_agnostic : {false, true}) {
    run.options.query_agnostic = query_agnostic;
    run.options.share_prefill = false;
    run.options.batch_decode = false;
    const eval::LongctxReport alone = eval::run_niah_benchmark(model, niah, run);
    run.options.batch_decode = true;
    const eval::LongctxReport batched = eval::run_niah_benchmark(model, niah, run);
    run.options.share_prefill = true;
    const eval::LongctxReport both = eval::run_niah_benchmark(model, niah, run);
    EXPECT_EQ(both.results["config"].value("batch_decode", false), true);
    ASSERT_EQ(alone.records.size(), 13u * 4u);
    size_t errors = 0, long_answers = 0;
    for (const auto* other : {&batched, &both}) {
      ASSERT_EQ(other->records.size(), alone.records.size());
      for (size_t i = 0; i < alone.records.size(); ++i) {
        const auto& a = alone.records[i];
        const auto& b = other->records[i];
        EXPECT_EQ(a.run, b.run);
        EXPECT_EQ(a.id, b.id);
        EXPECT_EQ(a.error, b.error) << a.run;
        EXPECT_EQ(a.prediction, b.prediction) << a.run << " " << a.id;
        EXPECT_EQ(a.generated_tokens, b.generated_tokens) << a.run << " " << a.id;
        EXPECT_EQ(a.kv_bytes, b.kv_bytes) << a.run;
        EXPECT_EQ(a.attended_kv_bytes, b.attended_kv_bytes) << a.run;
        EXPECT_EQ(a.score, b.score) << a.run;
        errors += !a.error.empty();
        long_answers += a.generated_tokens > 4;
      }
    }
    EXPECT_GT(errors, 0u);  // chelsea@12
    EXPECT_GT(long_answers, 40u);
  }
}

TEST(LongctxRunner, AScorerErrorSkipsItsRecordNotTheRun) {
  PROTOKV_REQUIRE_STORIES();
  const LoadedModel model = load_stories();
  std::vector<eval::LongctxSample> samples(3);
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].id = fmt::format("s{}", i);
    samples[i].context = model.tokenizer->encode("Once upon a time there was a cat", true);
    samples[i].max_new_tokens = 4;
  }
  const eval::LongctxScorer scorer = [](const eval::LongctxSample& s, const std::string&) {
    if (s.id == "s1") fail("cannot score {}", s.id);
    return 1.0;
  };
  eval::LongctxOptions options;
  options.runs = eval::make_run_specs({"full", "snapkv"}, {16}, {});
  options.progress = false;
  for (const bool batch : {false, true}) {
    options.batch_decode = batch;
    const eval::LongctxResult result =
        eval::run_longctx(model.weights, *model.tokenizer, samples, scorer, options);
    ASSERT_EQ(result.records.size(), 6u);
    for (const auto& r : result.records) {
      EXPECT_FALSE(r.prediction.empty()) << r.id;
      if (r.id == "s1") {
        EXPECT_EQ(r.error, "cannot score s1");
        EXPECT_EQ(r.score, 0.0);
      } else {
        EXPECT_TRUE(r.error.empty()) << r.error;
        EXPECT_EQ(r.score, 1.0);
      }
    }
  }
}

TEST(LongctxRunner, EveryRunStoresTheCacheType) {
  PROTOKV_REQUIRE_STORIES();
  const LoadedModel model = load_stories();  // heads of 8: f16 and bf16 rows
  const eval::NiahBenchmark niah = small_niah_grid();
  eval::LongctxBenchmarkRun run;
  run.options.runs = eval::make_run_specs({"full", "snapkv"}, {12}, {}, {0.5});
  run.options.progress = false;
  const eval::LongctxReport f32 = eval::run_niah_benchmark(model, niah, run);
  run.options.cache_type = {DType::F16, DType::F16};
  const eval::LongctxReport f16 = eval::run_niah_benchmark(model, niah, run);
  // A shared prompt is prefilled into the runs' cache type (a session refuses another one).
  run.options.share_prefill = true;
  const eval::LongctxReport shared = eval::run_niah_benchmark(model, niah, run);
  EXPECT_EQ(f16.results["config"]["cache_type_k"], "f16");
  EXPECT_EQ(f32.results["config"]["cache_type_v"], "f32");
  ASSERT_EQ(f16.records.size(), f32.records.size());
  ASSERT_EQ(shared.records.size(), f32.records.size());
  for (size_t i = 0; i < f32.records.size(); ++i) {
    const auto& a = f32.records[i];
    const auto& b = f16.records[i];
    ASSERT_TRUE(b.error.empty()) << b.run << ": " << b.error;
    EXPECT_EQ(2 * b.full_kv_bytes, a.full_kv_bytes) << b.run;
    // The same share of a full cache half as large: the same budget, half the bytes.
    EXPECT_EQ(b.budget, a.budget) << b.run;
    EXPECT_EQ(2 * b.kv_bytes, a.kv_bytes) << b.run;
    EXPECT_EQ(shared.records[i].error, "") << b.run;
    EXPECT_EQ(shared.records[i].kv_bytes, b.kv_bytes) << b.run;
    EXPECT_EQ(shared.records[i].prediction, b.prediction) << b.run;
  }
}

TEST(NiahCli, TakesTheCacheTypeFlags) {
  PROTOKV_REQUIRE_STORIES();
  const CommandResult r = run_protokv(
      "eval niah " + stories_args() +
      " --press full --lengths 128 --depths 50 --quiet -t 1 --json -ctk f16 --cache-type-v bf16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["cache_type_k"], "f16");
  EXPECT_EQ(j["config"]["cache_type_v"], "bf16");
  expect_one_line_error(run_protokv("eval niah " + stories_args() +
                                    " --press full --lengths 128 --quiet -t 1 -ctk q8_0"),
                        "--cache-type-k: q8_0 stores blocks of 32 values");
}

TEST(Niah, SamplesHaveExactLengthAndTheNeedleAtItsDepth) {
  PROTOKV_REQUIRE_STORIES();
  const auto tok = Tokenizer::load_llama2c((testing::stories_dir() / "tok512.bin").string(), 512);
  eval::NiahOptions o;
  o.lengths = {200, 300};
  o.depths = {0, 50, 100};
  const auto haystack = eval::haystack_noise(*tok, 300);
  const auto samples = eval::make_niah_samples(*tok, haystack, o);
  ASSERT_EQ(samples.size(), 6u);
  for (const auto& s : samples) {
    EXPECT_TRUE(s.error.empty()) << s.error;
    EXPECT_EQ(static_cast<int64_t>(s.context.size() + s.question.size()),
              s.meta["length"].get<int64_t>());
    const std::string text = tok->decode(s.context);
    const std::string needle = fmt::format("The special magic number for {} is {}.",
                                           s.meta["key"].get<std::string>(), s.answers[0]);
    const size_t at = text.find(needle);
    ASSERT_NE(at, std::string::npos) << text;
    const double depth = s.meta["depth"].get<double>();
    if (depth == 0.0) {
      EXPECT_LT(at, 2u);
    }
    if (depth == 100.0) {
      EXPECT_EQ(at + needle.size(), text.size());
    }
    if (depth == 50.0) {
      EXPECT_GT(at, text.size() / 4);
      EXPECT_LT(at, text.size() * 3 / 4);
      EXPECT_EQ(text[at - 2], '.');  // after a sentence end
    }
  }
  // A length too short for needle + question is a skipped sample, not a failure.
  o.lengths = {20};
  const auto tiny = eval::make_niah_samples(*tok, haystack, o);
  EXPECT_FALSE(tiny[0].error.empty());
  EXPECT_DOUBLE_EQ(eval::niah_score(samples[0], "It is " + samples[0].answers[0] + "."), 1.0);
  EXPECT_DOUBLE_EQ(eval::niah_score(samples[0], "no idea"), 0.0);
}

TEST(Niah, HeatmapHasOneCellPerLengthAndDepth) {
  eval::NiahOptions o;
  o.lengths = {100, 200, 300};
  o.depths = {0, 50, 100};
  std::vector<std::vector<double>> grid(3, std::vector<double>(3, 1.0));
  grid[1][1] = 0.0;
  grid[2][2] = std::nan("");
  const std::string svg = eval::render_niah_heatmap(grid, o, "t <x>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("t &lt;x&gt;"), std::string::npos);
  size_t cells = 0;
  for (size_t p = svg.find("stroke=\"white\""); p != std::string::npos;
       p = svg.find("stroke=\"white\"", p + 1))
    ++cells;
  EXPECT_EQ(cells, 9u);
  EXPECT_NE(svg.find("#d73027"), std::string::npos);  // accuracy 0: red
  EXPECT_NE(svg.find("#1a9850"), std::string::npos);  // accuracy 1: green
}

TEST(NiahCli, RunsEndToEndAndResumes) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  const std::string base =
      "eval niah " + stories_args() +
      " --press full,streaming_llm --budget 32 --lengths 128,256 --depths 0,100 --quiet -t 1 "
      "--out '" +
      dir.path().string() + "'";
  CommandResult r = run_protokv(base + " --limit 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("streaming_llm@32"), std::string::npos) << r.out;
  auto lines = read_lines(dir / "samples.jsonl");
  EXPECT_EQ(lines.size(), 1u + 2 * 2);  // header + 2 samples x 2 runs
  // Simulate an interruption in the middle of a line, then resume the whole grid.
  {
    std::ofstream out(dir / "samples.jsonl", std::ios::app);
    out << "{\"run\":\"full\",\"id\":\"L2";
  }
  r = run_protokv(base + " --resume --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  lines = read_lines(dir / "samples.jsonl");
  EXPECT_EQ(lines.size(), 1u + 4 * 2);
  for (size_t i = 1; i < lines.size(); ++i)
    EXPECT_FALSE(nlohmann::json::parse(lines[i]).is_discarded());
  const auto results = nlohmann::json::parse(r.out);
  EXPECT_EQ(results["summary"].size(), 2u);
  EXPECT_EQ(results["summary"][0]["scored"].get<int>(), 4);
  EXPECT_TRUE(results["summary"][1].contains("diff_vs_reference"));
  EXPECT_TRUE(std::filesystem::exists(dir / "heatmap_streaming_llm@32.svg"));
  // Per length: the paired difference against full, none for full itself.
  const auto& by_length = results["per_length_paired"];
  EXPECT_FALSE(by_length.contains("full"));
  for (const char* length : {"128", "256"}) {
    const auto& d = by_length["streaming_llm@32"][length];
    EXPECT_EQ(d["paired"].get<int>(), 2) << d;
    EXPECT_TRUE(d.contains("diff") && d.contains("ci95")) << d;
  }
  const auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  EXPECT_EQ(config["niah"]["lengths"].size(), 2u);
  EXPECT_EQ(config["mode"], "query-aware");
  // A resume under another mode is refused.
  r = run_protokv(base + " --resume --mode query-agnostic");
  expect_one_line_error(r, "another configuration");
}

TEST(NiahCli, QueryAgnosticRuns) {
  PROTOKV_REQUIRE_STORIES();
  const CommandResult r =
      run_protokv("eval niah " + stories_args() +
                  " --press snapkv --ratio 0.5 --lengths 200 --depths 50 --mode query-agnostic "
                  "--quiet -t 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["summary"][0]["run"], "snapkv@r0.5");
  EXPECT_EQ(j["summary"][0]["scored"], 1);
}

TEST(NiahCli, SharedPrefillGivesTheSameRecords) {
  PROTOKV_REQUIRE_STORIES();
  const std::string base = "eval niah " + stories_args() +
                           " --press full,snapkv,pyramidkv --budget 24 --lengths 160,200 "
                           "--depths 0,50 --quiet -t 1 --json";
  const CommandResult own = run_protokv(base);
  const CommandResult shared = run_protokv(base + " --share-prefill");
  ASSERT_EQ(own.exit_code, 0) << own.err;
  ASSERT_EQ(shared.exit_code, 0) << shared.err;
  const auto a = nlohmann::json::parse(own.out), b = nlohmann::json::parse(shared.out);
  ASSERT_EQ(a["summary"].size(), 3u);
  for (size_t i = 0; i < a["summary"].size(); ++i) {
    EXPECT_EQ(a["summary"][i]["run"], b["summary"][i]["run"]);
    EXPECT_EQ(a["summary"][i]["score"], b["summary"][i]["score"]) << i;
    EXPECT_EQ(a["summary"][i]["kv_bytes"], b["summary"][i]["kv_bytes"]) << i;
  }
}

TEST(NiahCli, BadHaystackIsOneClearError) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  {
    std::ofstream(dir / "empty.txt") << "  \n";
    std::ofstream(dir / "binary.txt", std::ios::binary) << std::string("abc\xFF\xFE def", 9);
  }
  const std::string base = "eval niah " + stories_args() + " --lengths 128 --depths 0 --haystack ";
  expect_one_line_error(run_protokv(base + "'" + (dir / "empty.txt").string() + "'"), "empty");
  expect_one_line_error(run_protokv(base + "'" + (dir / "binary.txt").string() + "'"),
                        "not valid UTF-8");
  expect_one_line_error(run_protokv(base + "'" + (dir / "missing.txt").string() + "'"),
                        "not found");
  expect_one_line_error(run_protokv("eval niah " + stories_args() + " --lengths 600 --depths 0"),
                        "exceeds the model's context");
}

}  // namespace
}  // namespace protokv
