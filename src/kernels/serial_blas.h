// SPDX-License-Identifier: Apache-2.0
#pragma once
// Keeps the BLAS calls made during its lifetime on the calling thread. OpenBLAS's OpenMP build
// already runs single-threaded inside an active parallel region; outside one it forks
// omp_get_max_threads() threads per call, which for attention's small tile GEMMs costs more
// than it saves (and is ruinous on a loaded machine: measured 100x slower than one thread).
// omp_set_num_threads changes only the calling task's ICV, so other threads are unaffected;
// the previous value is restored on exit.
#include <omp.h>

namespace protokv::kernels {

class SerialBlasScope {
 public:
  SerialBlasScope() : saved_threads_(omp_in_parallel() ? 1 : omp_get_max_threads()) {
    if (saved_threads_ > 1) omp_set_num_threads(1);
  }
  ~SerialBlasScope() {
    if (saved_threads_ > 1) omp_set_num_threads(saved_threads_);
  }
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  int saved_threads_;
};

}  // namespace protokv::kernels
