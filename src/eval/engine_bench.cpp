// SPDX-License-Identifier: Apache-2.0
// Machine reference probes and the prefill / decode cost model of `bench e2e`.
#include "eval/engine_bench.h"

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <vector>

#include "model/tensor_table.h"
#include "protokv/threads.h"
#include "protokv/timer.h"

namespace protokv::eval {

// Best of repeated square sgemms (at least 3 runs and 0.3 s), after one warm-up.
double measure_sgemm_gflops(int64_t size) {
  const auto n = static_cast<size_t>(size * size);
  std::vector<float> a(n), b(n), c(n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) a[i] = dist(rng), b[i] = dist(rng);
  const int s = static_cast<int>(size);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, s, 1.0f, a.data(), s, b.data(), s,
                0.0f, c.data(), s);
  };
  run();
  double best = 1e300, total = 0.0;
  for (int i = 0; i < 3 || total < 300.0; ++i) {
    const Timer t;
    run();
    const double ms = t.ms();
    best = std::min(best, ms);
    total += ms;
  }
  return 2.0 * static_cast<double>(size) * size * size / (best * 1e6);
}

// Best of 5 parallel copies / reads of a buffer far larger than any cache.
void measure_bandwidth(MachineReference& ref) {
  const size_t count = ref.copy_bytes / sizeof(float);
  std::unique_ptr<float[]> src(new float[count]), dst(new float[count]);
  // First touch from the same threads that will copy (page placement), and no lazy zero pages.
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < count; ++i) src[i] = static_cast<float>(i & 1023), dst[i] = 0.0f;
  const int chunks = std::max(1, num_threads()) * 4;
  const size_t per_chunk = (count + static_cast<size_t>(chunks) - 1) / static_cast<size_t>(chunks);
  double best_copy = 1e300, best_read = 1e300;
  float sink = 0.0f;
  for (int rep = 0; rep < 5; ++rep) {
    Timer t;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(c) * per_chunk;
      const size_t end = std::min(count, begin + per_chunk);
      if (begin < end)
        std::memcpy(dst.get() + begin, src.get() + begin, (end - begin) * sizeof(float));
    }
    best_copy = std::min(best_copy, t.ms());
    t.reset();
    float total = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(c) * per_chunk;
      const size_t end = std::min(count, begin + per_chunk);
      const float* p = dst.get() + begin;
      const size_t length = end > begin ? end - begin : 0;
      float partial = 0.0f;
      // simd reduction: lets the compiler reassociate, so the loop is bound by memory, not adds.
#pragma omp simd reduction(+ : partial)
      for (size_t i = 0; i < length; ++i) partial += p[i];
      total += partial;
    }
    best_read = std::min(best_read, t.ms());
    sink += total;
  }
  if (sink == -1.0f) std::fputc(' ', stderr);  // keeps the reads from being optimised away
  ref.copy_gbs = 2.0 * static_cast<double>(ref.copy_bytes) / (best_copy * 1e6);
  ref.read_gbs = static_cast<double>(ref.copy_bytes) / (best_read * 1e6);
}

double prefill_flops(const ModelWeights& w, int64_t n) {
  const ModelConfig& c = w.config;
  double proj = 0.0;  // parameters of the blocks' per-token matrix products
  for_each_tensor(c, w, [&](const TensorSlot<const ModelWeights>& t) {
    if (t.present() && t.spec.entry->projection) proj += static_cast<double>(t.spec.elements());
  });
  const double nn = static_cast<double>(n);
  const double attention = 2.0 * c.n_layers * c.n_heads * c.head_dim() * nn * (nn + 1.0);
  const double classifier = 2.0 * static_cast<double>(c.vocab_size) * c.dim;
  return 2.0 * nn * proj + attention + classifier;
}

size_t streamed_weight_bytes(const ModelWeights& w) {
  size_t bytes = w.weight_bytes();
  if (!w.config.shared_classifier) bytes -= w.token_embd.bytes();
  return bytes;
}

double process_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) * 1e-6;
}

}  // namespace protokv::eval
