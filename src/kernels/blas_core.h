// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which GEMM kernels OpenBLAS runs. A DYNAMIC_ARCH OpenBLAS (Debian's) picks them once, when the
// library loads, from a table of CPU model numbers; a CPU newer than its table gets the SSE3
// "Prescott" kernels. Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids Xeon (family 6, model 207)
// does so: sgemm 1024^3 at 35 GFLOP/s instead of 145-195 with OPENBLAS_CORETYPE=SkylakeX, and the
// real models' prefill 2.9-3.7x slower (`protokv bench e2e`, docs/results/openblas_core.md).
// OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so a program fixes the choice by starting
// again with it set: relaunch_with_better_blas_core().
#include <string>
#include <string_view>

#include "kernels/isa.h"

namespace protokv::kernels {

struct BlasCore {
  std::string name;           // openblas_get_corename(): "Prescott", "Haswell", "SkylakeX", ...
  bool dynamic_arch = false;  // whether OPENBLAS_CORETYPE can change it
  std::string better;         // the core to ask for on this CPU, or empty when `name` is as good
};

// The OpenBLAS core type (OPENBLAS_CORETYPE's spelling) that runs the widest sgemm kernels this
// CPU can run, when `chosen` runs narrower ones; empty when `chosen` is as wide, when the CPU
// has nothing wider than SSE3 kernels use, or when OpenBLAS was built for one CPU only
// (!dynamic_arch). `widest` is the widest of available_isas(): kAvx512 asks for SkylakeX,
// kAvx2 for Haswell (both need no more than what our variants of the same name need).
std::string better_blas_core(std::string_view chosen, bool dynamic_arch, Isa widest);

// This process's OpenBLAS core and, for this CPU, the better one (if any).
BlasCore blas_core();

// For a program's main(), before anything else: when OpenBLAS picked narrower kernels than this
// CPU runs and the environment does not name a core already (OPENBLAS_CORETYPE, the user's
// choice, is always kept), starts this same program again (/proc/self/exe, same arguments) with
// OPENBLAS_CORETYPE set to the better core. Returns only when nothing needed doing or the
// relaunch failed (the program then goes on with the kernels it has).
void relaunch_with_better_blas_core(char** argv);

}  // namespace protokv::kernels
