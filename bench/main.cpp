// SPDX-License-Identifier: Apache-2.0
// The microbenchmarks' entry (one binary for every bench/ file): Google Benchmark's, after the
// relaunch the CLI makes too (OpenBLAS's kernels for this CPU, kernels/blas_core.h).
#include <benchmark/benchmark.h>

#include "kernels/blas_core.h"

int main(int argc, char** argv) {
  protokv::kernels::relaunch_with_better_blas_core(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
