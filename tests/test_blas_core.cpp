// SPDX-License-Identifier: Apache-2.0
// OpenBLAS's core choice (kernels/blas_core.h): which core is better on which CPU, and the CLI's
// relaunch with it through the real binary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kernels/blas_core.h"
#include "kernels/isa.h"
#include "test_util.h"

namespace protokv::kernels {
namespace {

using testing::CommandResult;
using testing::run_protokv;
using testing::TempDir;

TEST(BlasCore, AskForTheWidestKernelsTheCpuRuns) {
  // The fallback of an OpenBLAS that does not know the CPU model: SSE3 kernels.
  EXPECT_EQ(better_blas_core("Prescott", true, Isa::kAvx512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Prescott", true, Isa::kAvx2), "Haswell");
  EXPECT_EQ(better_blas_core("Sandybridge", true, Isa::kAvx2), "Haswell");
  // AVX2 kernels on an AVX-512 CPU.
  EXPECT_EQ(better_blas_core("Haswell", true, Isa::kAvx512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Zen", true, Isa::kAvx512), "SkylakeX");
}

TEST(BlasCore, KeepAChoiceAsWideAsTheCpu) {
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids", "skylakex"})
    EXPECT_EQ(better_blas_core(core, true, Isa::kAvx512), "") << core;
  for (const char* core : {"Haswell", "Zen", "SkylakeX"})
    EXPECT_EQ(better_blas_core(core, true, Isa::kAvx2), "") << core;
  // Nothing wider than SSE3 to ask for, or an OpenBLAS built for one CPU (no OPENBLAS_CORETYPE).
  EXPECT_EQ(better_blas_core("Prescott", true, Isa::kScalar), "");
  EXPECT_EQ(better_blas_core("Prescott", false, Isa::kAvx512), "");
}

TEST(BlasCore, ThisTestProgramRunsTheBetterCoreUnlessOneWasNamed) {
  // tests/main.cpp relaunched this program as the CLI relaunches itself.
  const BlasCore core = blas_core();
  EXPECT_FALSE(core.name.empty());
  const char* named = std::getenv("OPENBLAS_CORETYPE");
  if (named == nullptr || *named == '\0') {
    EXPECT_EQ(core.better, "") << core.name;
  }
}

nlohmann::json info_of_a_small_model(const std::string& environment) {
  TempDir dir;
  const auto model = dir / "m.gguf";
  const CommandResult made = run_protokv(
      "make-model --dim 64 --layers 1 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 -o '" +
      model.string() + "'");
  EXPECT_EQ(made.exit_code, 0) << made.err;
  const CommandResult r = run_protokv("info --json -m '" + model.string() + "'", environment);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(BlasCore, TheCliRelaunchesItselfWithTheBetterCore) {
  // Started without OPENBLAS_CORETYPE, the CLI ends up running a core nothing beats on this CPU
  // (on a CPU OpenBLAS does not know, only through the relaunch).
  const BlasCore here = blas_core();
  const nlohmann::json j = info_of_a_small_model("env -u OPENBLAS_CORETYPE");
  EXPECT_EQ(j["kernels"], std::string(isa_name(active_isa())));
  const std::string core = j["openblas_core"];
  EXPECT_EQ(better_blas_core(core, here.dynamic_arch, available_isas().back()), "") << core;
}

#if defined(__x86_64__)
TEST(BlasCore, TheCliKeepsTheCoreTheUserNamed) {
  const BlasCore here = blas_core();
  if (!here.dynamic_arch) GTEST_SKIP() << "this OpenBLAS is built for one CPU only";
  const nlohmann::json j = info_of_a_small_model("OPENBLAS_CORETYPE=Prescott");
  EXPECT_EQ(j["openblas_core"], "Prescott");
}
#endif

}  // namespace
}  // namespace protokv::kernels
