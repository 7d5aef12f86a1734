#include "protokv/threads.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <thread>

namespace protokv {

void set_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

}  // namespace protokv
