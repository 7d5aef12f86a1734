// SPDX-License-Identifier: Apache-2.0
// The test program's entry: GoogleTest's, after the relaunch the CLI makes too (OpenBLAS's
// kernels for this CPU, kernels/blas_core.h), so the tests run the prefill GEMM users get.
#include <gtest/gtest.h>

#include "kernels/blas_core.h"

int main(int argc, char** argv) {
  protokv::kernels::relaunch_with_better_blas_core(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
