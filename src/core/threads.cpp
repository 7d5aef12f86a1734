// SPDX-License-Identifier: Apache-2.0
#include "protokv/threads.h"

#include "protokv/error.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <thread>

namespace protokv {

void set_threads(int n) {
  PROTOKV_CHECK(n >= 0 && n <= kMaxThreads,
                "thread count (-t) must be in [0, {}] (0: all hardware threads), got {}",
                kMaxThreads, n);
  if (n == 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

}  // namespace protokv
