// SPDX-License-Identifier: Apache-2.0
#pragma once
// An exception must not leave an OpenMP parallel region: GCC's runtime calls std::terminate
// (even for a region that runs on one thread). A loop whose body can throw (a check of the
// library, a press's or a Python callback's error, an allocation) runs each iteration through
// ParallelErrors::run, which keeps the first exception and skips the remaining iterations, and
// rethrows it after the loop:
//
//   ParallelErrors errors;
//   #pragma omp parallel for
//   for (int h = 0; h < n; ++h)
//     errors.run([&] { ...body...; });
//   errors.rethrow();
//
// Only for `parallel for` loops (and `omp for` loops whose iterations carry no barrier): a body
// must not contain a worksharing construct that other threads would wait for.
#include <atomic>
#include <exception>
#include <mutex>

namespace protokv {

class ParallelErrors {
 public:
  template <class Body>
  void run(Body&& body) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;  // the loop is failing: skip the rest
    try {
      body();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  // After the loop: rethrows the first exception an iteration threw, if any.
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace protokv
