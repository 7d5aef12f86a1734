// SPDX-License-Identifier: Apache-2.0
#include "kernels/blas_core.h"

#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace protokv::kernels {
namespace {

// OpenBLAS 0.3.21's x86-64 cores whose sgemm kernels use AVX-512, and those using AVX2 + FMA.
constexpr std::string_view kAvx512Cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
constexpr std::string_view kAvx2Cores[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                           "SapphireRapids"};

template <size_t N>
bool is_one_of(std::string_view name, const std::string_view (&cores)[N]) {
  for (std::string_view core : cores)
    if (name.size() == core.size() && strncasecmp(name.data(), core.data(), core.size()) == 0)
      return true;
  return false;
}

}  // namespace

std::string better_blas_core(std::string_view chosen, bool dynamic_arch, Isa widest) {
  if (!dynamic_arch) return "";
  switch (widest) {
    case Isa::kAvx512:
      return is_one_of(chosen, kAvx512Cores) ? "" : "SkylakeX";
    case Isa::kAvx2:
      return is_one_of(chosen, kAvx2Cores) ? "" : "Haswell";
    case Isa::kScalar:
      return "";
  }
  return "";
}

BlasCore blas_core() {
  BlasCore core;
  const char* name = openblas_get_corename();
  const char* config = openblas_get_config();
  core.name = name != nullptr ? name : "";
  core.dynamic_arch =
      config != nullptr && std::string_view(config).find("DYNAMIC_ARCH") != std::string_view::npos;
  core.better = better_blas_core(core.name, core.dynamic_arch, available_isas().back());
  return core;
}

void relaunch_with_better_blas_core(char** argv) {
#if defined(__linux__)
  const char* requested = std::getenv("OPENBLAS_CORETYPE");
  if (requested != nullptr && *requested != '\0') return;
  const BlasCore core = blas_core();
  if (core.better.empty()) return;
  if (setenv("OPENBLAS_CORETYPE", core.better.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the relaunch failed. The variable stays set (harmless: this OpenBLAS has loaded).
#else
  (void)argv;
#endif
}

}  // namespace protokv::kernels
