// SPDX-License-Identifier: Apache-2.0
// Sharded evaluations (eval/shard.h): `--shard I/N` splits the samples round-robin, and
// `protokv eval merge` joins the shards' folders into exactly the tables one run writes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "eval/shard.h"
#include "protokv/error.h"
#include "test_util.h"

namespace protokv {
namespace {

namespace fs = std::filesystem;

TEST(EvalShard, ParsesIAndNAndRefusesTheRest) {
  const auto s = eval::EvalShard::parse("2/8");
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 8);
  EXPECT_TRUE(s.active());
  EXPECT_EQ(s.to_string(), "2/8");
  EXPECT_FALSE(eval::EvalShard::parse("1/1").active());
  for (const char* bad : {"0/3", "4/3", "3", "a/b", "1/0", "1/100001", "1/3x", " 1/3", "-1/3", "/3",
                          "1/", "1//3", "99999999999999999999/3"})
    EXPECT_THROW(eval::EvalShard::parse(bad), Error) << bad;
}

// The shard of sample k is (k mod N) + 1.
std::vector<int64_t> samples_of(const eval::EvalShard& shard, int64_t total) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < total; ++k)
    if (shard.holds(k)) out.push_back(k);
  return out;
}

TEST(EvalShard, ShardsPartitionTheSamplesRoundRobin) {
  EXPECT_EQ(samples_of(eval::EvalShard{2, 3}, 8), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_TRUE(samples_of(eval::EvalShard{5, 5}, 3).empty());
  for (int64_t total : {0, 1, 7, 30}) {
    std::set<int64_t> seen;
    for (int64_t i = 1; i <= 4; ++i) {
      const eval::EvalShard shard{i, 4};
      const auto mine = samples_of(shard, total);
      EXPECT_EQ(eval::shard_sample_count(shard, total), static_cast<int64_t>(mine.size()))
          << i << "/4 of " << total;
      for (int64_t k : mine) EXPECT_TRUE(seen.insert(k).second) << k;
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), total);
  }
  // A count read from a file is computed, not allocated.
  EXPECT_EQ(eval::shard_sample_count(eval::EvalShard{1, 2}, int64_t{1} << 60), int64_t{1} << 59);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every measured time (a number under a key with "_ms" in it) set to zero, at any depth.
void zero_times_in(nlohmann::json& j) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key().find("_ms") != std::string::npos && it->is_number())
        *it = 0.0;
      else
        zero_times_in(*it);
    }
  } else if (j.is_array()) {
    for (auto& value : j) zero_times_in(value);
  }
}

// The measured times of every record set to zero: what two runs of the same samples cannot
// share, so that the tables built on them can be compared byte for byte.
void zero_times(const fs::path& jsonl) {
  std::istringstream in(read_file(jsonl));
  std::string line, out;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    zero_times_in(j);
    out += j.dump() + "\n";
  }
  std::ofstream(jsonl, std::ios::binary) << out;
}

// stdout of a text report without its last line ("wrote DIR").
std::string tables(const std::string& out) {
  return out.substr(0, out.rfind("wrote "));
}

nlohmann::json results_without_run_facts(const fs::path& dir) {
  auto j = nlohmann::json::parse(read_file(dir / "results.json"));
  j.erase("wall_ms");
  j.erase("merged_from");
  return j;
}

// One run and the same run in 3 shards (merged out of order): the merge of the shards gives the
// tables, results, records and figures of the one run, byte for byte once the measured times
// (which no two runs share) are equal. `subfolder`: where the run writes under --out (eval
// fidelity's own folder; "{}" stands for the shard's "_shard<I>of3", or nothing).
void expect_three_shards_merge_to_one_run(const std::string& eval_args,
                                          const std::vector<std::string>& figures,
                                          const std::string& subfolder = "") {
  testing::TempDir tmp;
  auto run = [&](const std::string& args) {
    const auto r = testing::run_protokv(eval_args + " --quiet -t 1 " + args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    return r;
  };
  auto folder = [&](const std::string& out, const std::string& shard) {
    return "'" + (tmp / out / fmt::format(fmt::runtime(subfolder), shard)).string() + "'";
  };
  const std::string whole_dir = folder("whole", "");
  auto shard_dir = [&](int i) {
    return folder(fmt::format("s{}", i), fmt::format("_shard{}of3", i));
  };
  const auto whole = run(fmt::format("--out '{}'", (tmp / "whole").string()));
  for (int i = 1; i <= 3; ++i) {
    const auto shard =
        run(fmt::format("--shard {}/3 --out '{}'", i, (tmp / fmt::format("s{}", i)).string()));
    EXPECT_NE(shard.out.find(fmt::format(", shard {}/3", i)), std::string::npos) << shard.out;
  }
  auto merge = [&](const std::string& dirs, const std::string& out) {
    const auto r =
        testing::run_protokv(fmt::format("eval merge {} --out '{}'", dirs, (tmp / out).string()));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  };
  // Its own folder merged: the run's own tables, timings included.
  EXPECT_EQ(tables(merge(whole_dir, "m1").out), tables(whole.out));

  for (const auto& dir : {whole_dir, shard_dir(1), shard_dir(2), shard_dir(3)})
    zero_times(fs::path(dir.substr(1, dir.size() - 2)) / "samples.jsonl");
  const auto one = merge(whole_dir, "one");
  const auto three = merge(shard_dir(3) + " " + shard_dir(1) + " " + shard_dir(2), "three");
  EXPECT_EQ(tables(three.out), tables(one.out));
  EXPECT_FALSE(tables(three.out).empty());
  EXPECT_EQ(read_file(tmp / "three" / "samples.jsonl"), read_file(tmp / "one" / "samples.jsonl"));
  EXPECT_EQ(results_without_run_facts(tmp / "three"), results_without_run_facts(tmp / "one"));
  for (const auto& figure : figures)
    EXPECT_EQ(read_file(tmp / "three" / figure), read_file(tmp / "one" / figure)) << figure;
  // The merged configuration is the one run's: no shard left in it.
  EXPECT_EQ(read_file(tmp / "three" / "config.json"), read_file(tmp / "one" / "config.json"));
  EXPECT_EQ(nlohmann::json::parse(read_file(tmp / "three" / "config.json")).count("shard"), 0u);
}

std::string stories_model() {
  const auto dir = testing::stories_dir();
  return fmt::format("-m '{}' -z '{}'", (dir / "stories260K.bin").string(),
                     (dir / "tok512.bin").string());
}

TEST(EvalMerge, ThreeRulerShardsMergeToOneRunsTables) {
  PROTOKV_REQUIRE_STORIES();
  expect_three_shards_merge_to_one_run(
      "eval ruler " + stories_model() +
          " --tasks niah_single_1,niah_multikey_1,fwe --samples 3 --press full,snapkv,"
          "streaming_llm --budget 64 --share-prefill --batch-decode",
      {});
}

TEST(EvalMerge, ThreeNiahShardsMergeToOneRunsTablesAndHeatMaps) {
  PROTOKV_REQUIRE_STORIES();
  expect_three_shards_merge_to_one_run("eval niah " + stories_model() +
                                           " --lengths 256,480 --depths 0,50,100 --press "
                                           "full,snapkv --budget 48 -ctk f16 -ctv bf16",
                                       {"heatmap_full.svg", "heatmap_snapkv@48.svg"});
}

TEST(EvalMerge, ThreeLongbenchEShardsMergeToOneRunsTables) {
  PROTOKV_REQUIRE_STORIES();
  const auto data = fs::path(PROTOKV_SOURCE_DIR) / "tests" / "data" / "longbench";
  expect_three_shards_merge_to_one_run("eval longbench " + stories_model() + " --data '" +
                                           data.string() + "' --e --press full,snapkv --budget 32",
                                       {});
}

// chelsea refuses every budget here (its sinks and recent window need 81 entries): a refusal is
// recorded on every sample, so each shard's records are those of the single run.
TEST(EvalMerge, ThreeFidelityShardsMergeToOneRunsReport) {
  PROTOKV_REQUIRE_STORIES();
  expect_three_shards_merge_to_one_run(
      "eval fidelity " + stories_model() +
          " --press full,snapkv,h2o,chelsea --budget 32,64 --kv-memory-share 0.3 --prompt-len 128 "
          "--continuation 8 --samples 5",
      {"kl_mean.svg", "recall.svg", "kl_mean_vs_memory.svg"}, "fidelity_stories260K_p128_c8_s5{}");
}

TEST(EvalMerge, RefusesMissingRepeatedUnfinishedAndForeignShards) {
  PROTOKV_REQUIRE_STORIES();
  testing::TempDir tmp;
  const std::string eval = "eval ruler " + stories_model() +
                           " --tasks niah_single_1,fwe --samples 2 --press full --quiet -t 1";
  auto dir = [&](const std::string& name) { return "'" + (tmp / name).string() + "'"; };
  for (int i = 1; i <= 3; ++i)
    ASSERT_EQ(testing::run_protokv(
                  fmt::format("{} --shard {}/3 --out {}", eval, i, dir(fmt::format("s{}", i))))
                  .exit_code,
              0);
  const std::string merge = "eval merge ";
  testing::expect_run_fails_with_one_line(merge + dir("s1") + " " + dir("s3"),
                                          "shard 2/3 is missing");
  testing::expect_run_fails_with_one_line(
      merge + dir("s1") + " " + dir("s2") + " " + dir("s2") + " " + dir("s3"),
      "shard 2/3 is given twice");
  testing::expect_run_fails_with_one_line(merge + dir("nowhere"), "config.json: missing");

  // Stopped before the end: no config.json yet, or fewer records than the shard holds.
  fs::copy(tmp / "s2", tmp / "stopped");
  fs::remove(tmp / "stopped" / "config.json");
  testing::expect_run_fails_with_one_line(
      merge + dir("s1") + " " + dir("stopped") + " " + dir("s3"), "config.json: missing");
  fs::copy(tmp / "s2", tmp / "short");
  {
    const std::string jsonl = read_file(tmp / "short" / "samples.jsonl");
    const size_t last = jsonl.rfind('\n', jsonl.size() - 2);
    std::ofstream(tmp / "short" / "samples.jsonl", std::ios::binary) << jsonl.substr(0, last + 1);
  }
  testing::expect_run_fails_with_one_line(merge + dir("s1") + " " + dir("short") + " " + dir("s3"),
                                          "the shard did not finish");

  // A config.json claiming an absurd sample count: one clear line, nothing allocated for it.
  for (const char* name : {"huge1", "huge2", "huge3"}) {
    const std::string from = std::string("s") + name[4];
    fs::copy(tmp / from, tmp / name);
    auto config = nlohmann::json::parse(read_file(tmp / name / "config.json"));
    config["shard"]["samples"] = int64_t{1} << 62;
    std::ofstream(tmp / name / "config.json", std::ios::binary) << config.dump();
  }
  testing::expect_run_fails_with_one_line(
      merge + dir("huge1") + " " + dir("huge2") + " " + dir("huge3"), "the shard did not finish");

  // A shard of another run (another seed) and of another split.
  ASSERT_EQ(
      testing::run_protokv(fmt::format("{} --seed 7 --shard 2/3 --out {}", eval, dir("seed7")))
          .exit_code,
      0);
  testing::expect_run_fails_with_one_line(merge + dir("s1") + " " + dir("seed7") + " " + dir("s3"),
                                          "their configurations differ in \"seed\"");
  ASSERT_EQ(
      testing::run_protokv(fmt::format("{} --shard 2/2 --out {}", eval, dir("half"))).exit_code, 0);
  testing::expect_run_fails_with_one_line(merge + dir("s1") + " " + dir("half"),
                                          "not one run's shards");

  // A shard's folder resumes as that shard only.
  testing::expect_run_fails_with_one_line(
      fmt::format("{} --shard 1/3 --out {} --resume", eval, dir("s2")),
      "written with another configuration");
  testing::expect_run_fails_with_one_line(eval + " --shard 4/3", "--shard: '4/3' is not I/N");
  testing::expect_run_fails_with_one_line(eval + " --shard 0/3", "--shard: '0/3' is not I/N");
}

TEST(EvalMerge, FidelityShardsRefuseAnEmptyShardAndAMissingOne) {
  PROTOKV_REQUIRE_STORIES();
  testing::TempDir tmp;
  const auto dir = testing::stories_dir();
  const std::string eval = fmt::format(
      "eval fidelity -m '{}' -z '{}' --press snapkv --budget 32 --prompt-len 64 --continuation 4 "
      "--samples 3 --quiet -t 1 --out '{}'",
      (dir / "stories260K.bin").string(), (dir / "tok512.bin").string(), tmp.path().string());
  testing::expect_run_fails_with_one_line(eval + " --shard 4/4", "no sample falls to this shard");
  ASSERT_EQ(testing::run_protokv(eval + " --shard 1/2").exit_code, 0);
  const auto first = tmp / "fidelity_stories260K_p64_c4_s3_shard1of2";
  testing::expect_run_fails_with_one_line("eval merge '" + first.string() + "'",
                                          "shard 2/2 is missing");
  // The second shard's folder holds the first's records: refused as another configuration.
  std::filesystem::copy(first, tmp / "fidelity_stories260K_p64_c4_s3_shard2of2");
  testing::expect_run_fails_with_one_line(eval + " --shard 2/2 --resume",
                                          "written with another configuration");
}

}  // namespace
}  // namespace protokv
