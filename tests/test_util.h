// SPDX-License-Identifier: Apache-2.0
#pragma once
// Test helpers: locating ../shared, temporary files, running the CLI.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "protokv/kv_cache.h"

namespace protokv::testing {

// A cache head's keys / values as F32 rows [size, head_dim] (a copy; keys only of a head that
// holds all of them).
inline std::vector<float> cache_keys(const HeadCache& head) {
  std::vector<float> out(static_cast<size_t>(head.size() * head.head_dim()));
  head.read_keys(0, head.size(), out.data());
  return out;
}
inline std::vector<float> cache_values(const HeadCache& head) {
  std::vector<float> out(static_cast<size_t>(head.size() * head.head_dim()));
  head.read_values(0, head.size(), out.data());
  return out;
}

// ../shared beside the checkout, or $PROTOKV_SHARED_DIR.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("PROTOKV_SHARED_DIR")) return env;
  return std::filesystem::path(PROTOKV_SOURCE_DIR).parent_path() / "shared";
}

inline std::filesystem::path stories_dir() {
  return shared_dir() / "models" / "stories260K";
}

// True under continuous integration (CI set to anything but "" / "0" / "false"): there a missing
// shared model is a failure, because ctest counts a skipped test as passed.
inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && *ci != '\0' && std::string(ci) != "0" && std::string(ci) != "false";
}

// Skips the current test when stories260K is absent (fails instead under CI).
#define PROTOKV_REQUIRE_STORIES()                                                               \
  do {                                                                                          \
    if (!std::filesystem::exists(::protokv::testing::stories_dir() / "stories260K.bin")) {      \
      if (::protokv::testing::running_in_ci())                                                  \
        FAIL() << "stories260K not found at " << ::protokv::testing::stories_dir()              \
               << " and CI is set: the golden tests must run (put shared/ beside the checkout " \
                  "or set PROTOKV_SHARED_DIR)";                                                 \
      GTEST_SKIP() << "stories260K not found at " << ::protokv::testing::stories_dir()          \
                   << " (set PROTOKV_SHARED_DIR); skipping end-to-end test";                    \
    }                                                                                           \
  } while (0)

// Folder of the real pretrained models that tools/fetch_models.sh downloads, by the script's own
// rule: $PROTOKV_MODELS_DIR, else ${PROTOKV_CACHE:-$HOME/.cache/protokv}/models.
inline std::filesystem::path real_models_dir() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  if (!env("PROTOKV_MODELS_DIR").empty()) return env("PROTOKV_MODELS_DIR");
  if (!env("PROTOKV_CACHE").empty()) return std::filesystem::path(env("PROTOKV_CACHE")) / "models";
  return std::filesystem::path(env("HOME")) / ".cache" / "protokv" / "models";
}

// Skips the current test when the real model file `name` (e.g.
// "SmolLM2-135M-Instruct.Q4_1.gguf") has not been fetched; fails instead under CI, whose run
// fetches the models first (.ci/run), so that a failed fetch cannot pass as skipped tests.
#define PROTOKV_REQUIRE_REAL_MODEL(name)                                                        \
  do {                                                                                          \
    const std::filesystem::path protokv_real_model_ =                                           \
        ::protokv::testing::real_models_dir() / (name);                                         \
    if (!std::filesystem::exists(protokv_real_model_)) {                                        \
      if (::protokv::testing::running_in_ci())                                                  \
        FAIL() << protokv_real_model_ << " not found and CI is set: the real-model tests must " \
               << "run (tools/fetch_models.sh downloads the models; PROTOKV_MODELS_DIR)";       \
      GTEST_SKIP() << protokv_real_model_ << " not found: run tools/fetch_models.sh (or set "   \
                   << "PROTOKV_MODELS_DIR); skipping real-model test";                          \
    }                                                                                           \
  } while (0)

// A fresh temporary directory, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "protokv-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs the protokv binary with `args` (a shell-quoted string), with the shell variable
// assignments `environment` (e.g. "PROTOKV_ISA=scalar") in its environment.
CommandResult run_protokv(const std::string& args, const std::string& environment = "");

// The run failed as bad input must: exit code 1 and exactly one line on stderr,
// "protokv: error: ...", containing `contains`.
inline void expect_one_line_error(const CommandResult& r, const std::string& contains = "") {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("protokv: error: ", 0), 0u) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_NE(r.err.find(contains), std::string::npos) << r.err;
}

// Runs protokv with `args`; it must fail as bad input must (above) and print nothing on stdout.
inline void expect_run_fails_with_one_line(const std::string& args, const std::string& needle) {
  SCOPED_TRACE(args);
  const CommandResult r = run_protokv(args);
  expect_one_line_error(r, needle);
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// `n` token ids drawn uniformly from [0, vocab) by std::mt19937_64(seed).
std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed);

}  // namespace protokv::testing
