// SPDX-License-Identifier: Apache-2.0
// The fuzz targets (fuzz/) in the ordinary test run, so that every build (Release, ASan + UBSan)
// checks them: each target's seed corpus is accepted (the seeds are valid inputs, so a target
// that refuses everything, or a reader that broke, fails here), deterministic mutations of every
// seed are refused or accepted without a crash, and every committed regression case
// (fuzz/regressions/TARGET/) runs clean.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "test_util.h"

namespace protokv {
namespace {

using fuzz::Outcome;

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const auto& target : fuzz::targets()) names.emplace_back(target.name);
  return names;
}

std::vector<std::filesystem::path> files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  if (!std::filesystem::is_directory(dir)) return files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().filename().string()[0] != '.')
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

Outcome run_bytes(const fuzz::Target& target, const std::string& bytes) {
  return target.run(fuzz::Bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

class FuzzTarget : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzTarget, AcceptsItsSeedsAndSurvivesTheirMutations) {
  PROTOKV_REQUIRE_STORIES();  // the seeds of several targets come from shared/
  const fuzz::Target& target = fuzz::find_target(GetParam());
  testing::TempDir dir;
  target.write_seeds(dir.path(), testing::shared_dir());
  const auto seeds = files_in(dir.path());
  ASSERT_FALSE(seeds.empty()) << target.name << " wrote no seeds";
  for (const auto& seed : seeds) {
    const std::string bytes = fuzz::read_file_bytes(seed);
    EXPECT_EQ(run_bytes(target, bytes), Outcome::kAccepted)
        << target.name << ": seed " << seed.filename() << " refused";
    // Truncations and byte flips at a few fixed places: refused or accepted, never a crash.
    for (const size_t cut : {size_t{0}, size_t{1}, bytes.size() / 2, bytes.size() - 1})
      if (cut < bytes.size()) (void)run_bytes(target, bytes.substr(0, cut));
    for (const size_t at : {size_t{0}, size_t{9}, bytes.size() / 3, bytes.size() * 2 / 3}) {
      if (at >= bytes.size()) continue;
      std::string flipped = bytes;
      flipped[at] = static_cast<char>(flipped[at] ^ 0xff);
      (void)run_bytes(target, flipped);
    }
  }
}

TEST_P(FuzzTarget, CommittedRegressionCasesRunClean) {
  PROTOKV_REQUIRE_STORIES();
  const fuzz::Target& target = fuzz::find_target(GetParam());
  for (const auto& path :
       files_in(std::filesystem::path(PROTOKV_SOURCE_DIR) / "fuzz" / "regressions" / GetParam()))
    (void)run_bytes(target, fuzz::read_file_bytes(path));  // a crash or sanitizer report fails
}

INSTANTIATE_TEST_SUITE_P(All, FuzzTarget, ::testing::ValuesIn(target_names()),
                         [](const auto& info) { return info.param; });

TEST(FuzzTargets, AnUnknownTargetIsOneLineNamingTheKnownOnes) {
  try {
    (void)fuzz::find_target("gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gguf_model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace protokv
