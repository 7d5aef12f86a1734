// SPDX-License-Identifier: Apache-2.0
#pragma once
// One level of threading at a time: OpenMP for our loops, and OpenBLAS (OpenMP build) shares the
// same pool. set_threads() sets both.
#include "protokv/limits.h"

namespace protokv {

using limits::kMaxThreads;

// n == 0: all hardware threads. Throws Error unless 0 <= n <= kMaxThreads.
void set_threads(int n);
int num_threads();

}  // namespace protokv
