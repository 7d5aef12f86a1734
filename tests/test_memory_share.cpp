// SPDX-License-Identifier: Apache-2.0
// Equal-memory budgets (--kv-memory-share): the solved budget makes each press store the asked
// share of the full cache's KV bytes, whatever it keeps beside its budget (pod's values, chelsea's
// outlier heads), and a press that cannot reach the share says so.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "eval/fidelity.h"
#include "eval/longctx_runner.h"
#include "eval/memory_share.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "protokv/press_spec.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

std::string recall_model_path() {
  return (std::filesystem::path(PROTOKV_SOURCE_DIR) / "models" / "protokv-recall.gguf").string();
}

// The stored share of `press` at the solved budget for a prompt of n random tokens.
struct Solved {
  eval::MemoryShareBudget budget;
  double stored_share = 0.0;
  int probes = 0;
};

Solved solve_and_run(const LoadedModel& model, const std::string& press, double share,
                     int n = 600) {
  const std::vector<int32_t> prompt = testing::random_tokens(n, model.weights.config.vocab_size, 7);
  const auto spec = PressSpec::parse(press);
  std::shared_ptr<const PrefilledPrompt> prefilled;
  Solved out;
  out.budget = eval::solve_memory_share(
      model.weights, spec, n,
      [&]() -> const PrefilledPrompt& {
        ++out.probes;
        prefilled = PrefilledPrompt::make(model.weights, prompt);
        return *prefilled;
      },
      share);
  SessionOptions options;
  options.press = spec;
  options.budget.entries = out.budget.entries;
  Session session(model.weights, options);
  session.prefill(prompt);
  EXPECT_EQ(out.budget.full_kv_bytes, full_kv_bytes(model.weights.config, n));
  out.stored_share = static_cast<double>(session.cache().kv_bytes()) /
                     static_cast<double>(out.budget.full_kv_bytes);
  return out;
}

TEST(MemoryShare, AnEvictingPressStoresTheShareOfThePrompt) {
  const LoadedModel model = load_model(recall_model_path());
  const Solved s = solve_and_run(model, "snapkv", 0.25);
  EXPECT_EQ(s.budget.entries, 150);  // floor(0.25 * 600), no trial compression needed
  EXPECT_FALSE(s.budget.probed);
  EXPECT_EQ(s.probes, 0);
  EXPECT_DOUBLE_EQ(s.stored_share, 0.25);
}

TEST(MemoryShare, PressesThatStoreBeyondTheirBudgetGetASmallerBudgetForTheSameMemory) {
  const LoadedModel model = load_model(recall_model_path());
  // Entries per head over both layers of the recall model: one entry of one layer is 1/1200.
  const double entry = 1.0 / 1200.0;
  // pod with delta=0 groups both layers: every value and layer 0's keys stay (3/4 of the cache),
  // layer 1 keeps B keys; chelsea's outlier heads (half of them here) keep everything, on top of
  // the others' B with reallocate=0.
  const std::vector<std::pair<std::string, double>> cases = {
      {"pod:delta=0", 0.8}, {"chelsea:outliers=0.5,reallocate=0", 0.6}};
  for (const auto& [press, share] : cases) {
    SCOPED_TRACE(press);
    const Solved s = solve_and_run(model, press, share);
    EXPECT_TRUE(s.budget.probed);
    EXPECT_EQ(s.probes, 1);  // one prefill for both trial compressions
    EXPECT_LE(s.stored_share, share + 1e-9);
    EXPECT_GE(s.stored_share, share - 4 * entry);
    // What it keeps beside the budget costs budget: fewer entries than share x prompt.
    EXPECT_LT(s.budget.entries, static_cast<int64_t>(share * 600));
  }
}

// With App. C.2's reallocation chelsea holds layers x heads x B entries in all: its solved budget
// is the share of the prompt, as for an evicting press.
TEST(MemoryShare, ChelseaWithReallocationStoresItsBudget) {
  const LoadedModel model = load_model(recall_model_path());
  const Solved s = solve_and_run(model, "chelsea:outliers=0.25", 0.6);
  EXPECT_TRUE(s.budget.probed);
  EXPECT_NEAR(static_cast<double>(s.budget.entries), 360.0, 1.0);
  EXPECT_NEAR(s.stored_share, 0.6, 2.0 / 1200.0);
}

TEST(MemoryShare, APressThatStoresEverythingCannotReachAShare) {
  const LoadedModel model = load_model(recall_model_path());
  try {
    solve_and_run(model, "clusterkv", 0.25);
    FAIL() << "clusterkv reached a memory share of 0.25";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("100.0% of the full cache at every budget"),
              std::string::npos)
        << e.what();
  }
  // pod keeps every value: half the bytes at least.
  EXPECT_THROW(solve_and_run(model, "pod:delta=0", 0.2), Error);
  EXPECT_THROW(solve_and_run(model, "snapkv", 0.0), Error);
  EXPECT_THROW(solve_and_run(model, "snapkv", 1.5), Error);
}

TEST(MemoryShare, LongContextRunsRecordTheSolvedBudgetAndTheStoredShare) {
  const LoadedModel model = load_model(recall_model_path());
  std::vector<eval::LongctxSample> samples(2);
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].id = fmt::format("s{}", i);
    samples[i].context = testing::random_tokens(400 + 100 * static_cast<int>(i),
                                                model.weights.config.vocab_size, 3 + i);
    samples[i].context[0] = model.tokenizer->bos_id();
    samples[i].max_new_tokens = 2;
  }
  eval::LongctxOptions options;
  options.runs = eval::make_run_specs({"full", "snapkv", "pod:delta=0"}, {}, {}, {0.8});
  ASSERT_EQ(options.runs.size(), 3u);
  EXPECT_EQ(options.runs[1].label(), "snapkv@m0.8");
  options.progress = false;
  options.share_prefill = true;
  const eval::LongctxResult result = eval::run_longctx(
      model.weights, *model.tokenizer, samples,
      [](const eval::LongctxSample&, const std::string&) { return 1.0; }, options);
  for (const auto& r : result.records) {
    ASSERT_TRUE(r.error.empty()) << r.run << ": " << r.error;
    EXPECT_EQ(r.full_kv_bytes, full_kv_bytes(model.weights.config, r.prompt_tokens));
    if (r.run == "full") {
      EXPECT_EQ(r.budget, 0);
      continue;
    }
    EXPECT_GT(r.budget, 0) << r.run;
    const double stored = static_cast<double>(r.kv_bytes) / static_cast<double>(r.full_kv_bytes);
    EXPECT_NEAR(stored, 0.8, 0.01) << r.run;  // kv_bytes: after the prefill (query-aware)
    const nlohmann::json j = r.to_json();
    EXPECT_EQ(eval::LongctxRecord::from_json(j).budget, r.budget);
  }
  const auto summaries = eval::summarize(result.records, options.runs, "full");
  EXPECT_NEAR(summaries[0].stored_share, 1.0, 0.01);
  EXPECT_NEAR(summaries[1].stored_share, 0.8, 0.01);
  EXPECT_NEAR(summaries[2].stored_share, 0.8, 0.01);
  EXPECT_THROW(eval::make_run_specs({"snapkv"}, {}, {}, {1.5}), Error);
}

TEST(MemoryShare, GenerateSolvesTheBudgetAndReportsTheStoredShare) {
  const std::string model = recall_model_path();
  std::string text;
  for (int i = 0; i < 15; ++i) text += "the key is 42 and the lock is 7, remember the key. ";
  const testing::CommandResult r = testing::run_protokv(fmt::format(
      "generate -m {} -p '{}' --press pod:delta=0 --kv-memory-share 0.9 -n 2 --json", model, text));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--kv-memory-share 0.9: budget"), std::string::npos) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["kv_memory_share"], 0.9);
  const double stored =
      j["kv_bytes_after_prefill"].get<double>() / j["kv_bytes_full"].get<double>();
  EXPECT_LE(stored, 0.9 + 1e-9);
  EXPECT_GT(stored, 0.85);
  // The solver's trial sessions round the prompt as the run asks (pod shares keys: it probes).
  const testing::CommandResult rounded = testing::run_protokv(
      fmt::format("generate -m {} -p '{}' --press pod:delta=0 --kv-memory-share 0.9 -n 2 --json "
                  "--llama-cpp-arithmetic",
                  model, text));
  ASSERT_EQ(rounded.exit_code, 0) << rounded.err;
  EXPECT_EQ(nlohmann::json::parse(rounded.out)["config"]["llama_cpp_arithmetic"], true);
  const testing::CommandResult flash = testing::run_protokv(
      fmt::format("generate -m {} -p '{}' --press pod:delta=0 --kv-memory-share 0.9 -n 2 --json "
                  "--llama-cpp-arithmetic --llama-cpp-flash-attn --cache-type-k f16",
                  model, text));
  ASSERT_EQ(flash.exit_code, 0) << flash.err;
  EXPECT_EQ(nlohmann::json::parse(flash.out)["config"]["llama_cpp_flash_attention"], true);
  EXPECT_EQ(nlohmann::json::parse(flash.out)["config"]["llama_cpp_threads"], 1);
  const std::string generate = fmt::format("generate -m {} -p '{}'", model, text);
  testing::expect_run_fails_with_one_line(generate + " --llama-cpp-flash-attn",
                                          "--llama-cpp-arithmetic");
  testing::expect_run_fails_with_one_line(
      generate + " --llama-cpp-arithmetic --llama-cpp-flash-attn --llama-cpp-threads 0",
      "--llama-cpp-threads");
  testing::expect_run_fails_with_one_line(
      generate + " --press snapkv --kv-memory-share 0.5 --budget 8", "not both");
  testing::expect_run_fails_with_one_line(generate + " --press snapkv --kv-memory-share 1.5",
                                          "(0, 1]");
  testing::expect_run_fails_with_one_line(generate + " --press clusterkv --kv-memory-share 0.5",
                                          "out of reach");
}

// eval fidelity --kv-memory-share: rows after the budgets' rows, each sample at its solved budget.
TEST(MemoryShare, FidelityRowsAtASolvedBudgetMatchTheRowsAtThatBudget) {
  const LoadedModel model = load_model(recall_model_path());
  std::vector<eval::FidelitySample> samples(3);
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].prompt = testing::random_tokens(256, model.weights.config.vocab_size, 11 + i);
    samples[i].prompt[0] = model.tokenizer->bos_id();
    samples[i].origin = {{"seed", 11 + i}};
  }
  eval::FidelityOptions options;
  options.presses = {"snapkv", "pod:delta=0", "clusterkv"};
  options.budgets = {64};
  options.memory_shares = {0.25, 0.8};
  options.continuation = 4;
  options.progress = false;
  const eval::FidelityReport both = eval::run_fidelity(model.weights, samples, options);
  ASSERT_EQ(both.rows.size(), 9u);
  const auto row = [](const eval::FidelityReport& r, const std::string& press, double share) {
    for (const auto& row : r.rows)
      if (row.press == press && row.memory_share == share) return row;
    ADD_FAILURE() << press << " @ m" << share << " missing";
    return eval::FidelityRow();
  };
  const double full_bytes = both.reference.kv_bytes.mean();
  // snapkv evicts to B = floor(0.25 * 256) = 64: the very numbers of the budget-64 row.
  const eval::FidelityRow snap = row(both, "snapkv", 0.25);
  ASSERT_TRUE(snap.error.empty()) << snap.error;
  EXPECT_EQ(snap.budget, 0);
  EXPECT_EQ(snap.solved_budget.mean(), 64.0);
  EXPECT_EQ(snap.solved_budget.count(), 3);
  EXPECT_EQ(snap.kl_samples, both.rows[0].kl_samples);
  EXPECT_EQ(snap.recall.mean(), both.rows[0].recall.mean());
  EXPECT_DOUBLE_EQ(snap.kv_bytes.mean() / full_bytes, 0.25);
  // pod keeps every value: at 0.8 it stores the share within an entry per layer, with a budget
  // below 0.8 * 256; 0.25 is out of reach, as is any share below 1 for clusterkv.
  const eval::FidelityRow pod = row(both, "pod:delta=0", 0.8);
  ASSERT_TRUE(pod.error.empty()) << pod.error;
  EXPECT_LT(pod.solved_budget.mean(), 0.8 * 256);
  EXPECT_NEAR(pod.kv_bytes.mean() / full_bytes, 0.8, 2.0 / 512.0);
  EXPECT_LE(pod.kv_bytes.mean() / full_bytes, 0.8 + 1e-12);
  EXPECT_FALSE(row(both, "pod:delta=0", 0.25).error.empty());
  EXPECT_NE(row(both, "clusterkv", 0.8).error.find("100.0% of the full cache"), std::string::npos)
      << row(both, "clusterkv", 0.8).error;

  // Shares alone: the reference still records full's top-B for the solved budgets (recall).
  options.budgets.clear();
  options.presses = {"snapkv"};
  const eval::FidelityReport shares_only = eval::run_fidelity(model.weights, samples, options);
  ASSERT_EQ(shares_only.rows.size(), 2u);
  EXPECT_EQ(shares_only.rows[0].recall.count(), 3);
  EXPECT_EQ(shares_only.rows[0].recall.mean(), snap.recall.mean());
  EXPECT_EQ(shares_only.rows[0].kl_samples, snap.kl_samples);

  // Reported: JSON rows carry the share, the solved budget and the stored / attended shares; the
  // table names the row by its share and the mean budget.
  const nlohmann::json j = eval::to_json(both);
  const auto& snap_json = j["results"][1];
  EXPECT_EQ(snap_json["memory_share"], 0.25);
  EXPECT_EQ(snap_json["solved_budget"], 64.0);
  EXPECT_DOUBLE_EQ(snap_json["stored_share"].get<double>(), 0.25);
  EXPECT_LE(snap_json["attended_share"].get<double>(), 0.26);
  EXPECT_EQ(j["config"]["memory_shares"], nlohmann::json::array({0.25, 0.8}));
  const std::string table = eval::render_table(both);
  EXPECT_NE(table.find("m0.25 (B 64)"), std::string::npos) << table;
  EXPECT_NE(table.find("25.0%"), std::string::npos) << table;
}

TEST(MemoryShare, FidelityCliTakesSharesAndResumesThem) {
  const testing::TempDir dir;
  const std::string base = fmt::format(
      "eval fidelity --synthetic --press snapkv,pod:sinks=4 --prompt-len 64 --continuation 4 "
      "--samples "
      "2 --quiet --out {}",
      dir.path().string());
  // pod on the synthetic model stores at least 63% (every value, the lowest layers' keys).
  const testing::CommandResult r = testing::run_protokv(base + " --kv-memory-share 0.7 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["solved_budget"], 44.0);  // snapkv: floor(0.7 * 64)
  for (const auto& row : j["results"]) {
    ASSERT_FALSE(row.contains("error")) << row.dump();
    EXPECT_LE(row["stored_share"].get<double>(), 0.7 + 1e-12) << row["press"];
    EXPECT_GT(row["stored_share"].get<double>(), 0.65) << row["press"];
  }
  const auto folder = std::filesystem::directory_iterator(dir.path())->path();
  EXPECT_TRUE(std::filesystem::exists(folder / "kl_mean_vs_memory.svg"));
  EXPECT_FALSE(std::filesystem::exists(folder / "kl_mean.svg"));  // no budget rows
  // Resuming reads both samples back; another share is another configuration.
  const testing::CommandResult again =
      testing::run_protokv(base + " --kv-memory-share 0.7 --json --resume");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)["results"][1]["kl_mean"], j["results"][1]["kl_mean"]);
  testing::expect_run_fails_with_one_line(base + " --kv-memory-share 0.6 --resume",
                                          "another configuration");
  testing::expect_run_fails_with_one_line(base + " --kv-memory-share 1.5", "(0, 1]");
  testing::expect_run_fails_with_one_line(base, "--kv-memory-share");
}

}  // namespace
}  // namespace protokv
