// SPDX-License-Identifier: Apache-2.0
// Micro-benchmarks of the kernels against the machine's own limits: OpenBLAS sgemm GFLOP/s (the
// prefill target: matmul >= half of it) and copy/read bandwidth (the decode target: F16 matvec
// within 2x of it). Run: ./build/protokv_microbench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "protokv/dtype.h"

namespace protokv::kernels {
namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

struct BenchWeight {
  std::vector<uint8_t> bytes;
  WeightMatrix matrix;
};

BenchWeight make_weight(DType type, int64_t rows, int64_t cols) {
  BenchWeight w;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  w.bytes.resize(row_bytes * static_cast<size_t>(rows));
  const std::vector<float> row = random_floats(cols);
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, row.data(), &w.bytes[r * row_bytes], cols);
  w.matrix = WeightMatrix{type, w.bytes.data(), rows, cols};
  return w;
}

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0};
// BM_Matvec also streams the 4-bit types the real models use (make_weight's quantisers).
const DType kMatvecTypes[] = {DType::F32,  DType::F16,  DType::BF16,
                              DType::Q8_0, DType::Q4_0, DType::Q4_K};

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- machine limits ----

// Buffers of 256 MB each, far beyond the caches. Bytes processed = bytes copied (each is read
// once and written once).
void BM_Copy(benchmark::State& state) {
  const size_t size = size_t{256} << 20;
  const int threads = static_cast<int>(state.range(0));
  std::vector<char> src(size, 1), dst(size, 2);
  for (auto _ : state) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; ++t) {
      const size_t chunk = size / threads;
      std::memcpy(dst.data() + t * chunk, src.data() + t * chunk, chunk);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
}
BENCHMARK(BM_Copy)->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime();

// Read-only stream, the access pattern of matvec: dot(x, x) loads each cache line once.
void BM_Read(benchmark::State& state) {
  const int64_t n = int64_t{64} << 20;  // 256 MB of floats
  const int threads = static_cast<int>(state.range(0));
  const std::vector<float> data(static_cast<size_t>(n), 1.0f);
  for (auto _ : state) {
    float total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (int t = 0; t < threads; ++t) {
      const float* chunk = data.data() + t * (n / threads);
      total += dot(chunk, chunk, n / threads);
    }
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 4);
}
BENCHMARK(BM_Read)->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime();

void BM_SgemmBlas(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0)), nk = static_cast<int>(state.range(1));
  const auto a = random_floats(int64_t{m} * nk), b = random_floats(int64_t{nk} * nk, 2);
  std::vector<float> c(static_cast<size_t>(m) * nk);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, nk, 1.0f, a.data(), nk, b.data(),
                nk, 0.0f, c.data(), nk);
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * m * nk * nk);
}
BENCHMARK(BM_SgemmBlas)
    ->ArgsProduct({{512}, {1024, 2048, 4096}})
    ->ArgNames({"M", "N=K"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- prefill ----

// Y[n, rows] = X[n, cols] W^T, square W.
void BM_Matmul(benchmark::State& state) {
  const DType type = kTypes[state.range(0)];
  const int64_t n = state.range(1), dim = state.range(2);
  state.SetLabel(std::string(dtype_name(type)));
  const BenchWeight w = make_weight(type, dim, dim);
  const auto x = random_floats(n * dim);
  std::vector<float> y(static_cast<size_t>(n * dim));
  for (auto _ : state) {
    matmul(w.matrix, x.data(), n, y.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * n * dim * dim);
}
BENCHMARK(BM_Matmul)
    ->ArgsProduct({{0, 1, 2, 3}, {512}, {1024, 2048, 4096}})
    ->ArgNames({"dtype", "n", "dim"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// One head, causal, single-threaded (the engine's per-head call). FLOPs: QK^T and PV over the
// n(n+1)/2 visible pairs, 2d each.
void BM_AttentionPrefill(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int d = static_cast<int>(state.range(1));
  const auto q = random_floats(n * d, 1), k = random_floats(n * d, 2), v = random_floats(n * d, 3);
  std::vector<float> out(static_cast<size_t>(n * d));
  for (auto _ : state) {
    attention_prefill(q.data(), k.data(), v.data(), n, d, out.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 4.0 * d * static_cast<double>(n) * (n + 1) / 2);
}
BENCHMARK(BM_AttentionPrefill)
    ->ArgsProduct({{512, 2048}, {64, 128}})
    ->ArgNames({"n", "d"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// A whole layer, GQA 32 query heads over 8 KV heads (Llama-3-8B shape), parallel inside.
void BM_AttentionPrefillLayer(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int d = 128, n_heads = 32, n_kv = 8;
  const auto q = random_floats(n * n_heads * d, 1);
  const auto k = random_floats(n * n_kv * d, 2), v = random_floats(n * n_kv * d, 3);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    attention_prefill_heads({q.data(), n_heads * d, d}, {k.data(), n_kv * d, d},
                            {v.data(), n_kv * d, d}, {out.data(), n_heads * d, d}, n, 0, n_heads,
                            n_kv, d);
    benchmark::ClobberMemory();
  }
  set_flops(state, n_heads * 4.0 * d * static_cast<double>(n) * (n + 1) / 2);
}
BENCHMARK(BM_AttentionPrefillLayer)
    ->Arg(512)
    ->Arg(2048)
    ->ArgName("n")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- decode ----

// 11008 x 4096 (a Llama-7B FFN matrix): every dtype is larger than the 32 MB L3, so this
// streams from memory as decode does. Bytes processed = weight bytes.
void BM_Matvec(benchmark::State& state) {
  const DType type = kMatvecTypes[state.range(0)];
  const Isa isa = static_cast<Isa>(state.range(1));
  state.SetLabel(std::string(dtype_name(type)) + "/" + std::string(isa_name(isa)));
  const BenchWeight w = make_weight(type, 11008, 4096);
  const auto x = random_floats(4096);
  std::vector<float> y(11008);
  for (auto _ : state) {
    matvec(isa, w.matrix, x.data(), y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.matrix.bytes()));
}

void matvec_args(benchmark::internal::Benchmark* b) {
  for (int type = 0; type < static_cast<int>(std::size(kMatvecTypes)); ++type)
    for (Isa isa : available_isas()) b->Args({type, static_cast<int>(isa)});
}
BENCHMARK(BM_Matvec)->Apply(matvec_args)->ArgNames({"dtype", "isa"})->UseRealTime();

// The legacy 4/5-bit types on one thread at 2816 x 1024 (a 1.5-2 MB matrix, in L3 as a small
// model's layers are between tokens): matvec's int8 path (quantised activation, ggml's vec_dot
// arithmetic) against dequantising each row to F32 and dotting it with x, matvec's method before
// (variant 1). Random bytes are valid blocks; the FP16 scales are set to small values.
const DType kLegacyTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1};

void BM_MatvecLegacy(benchmark::State& state) {
  const DType type = kLegacyTypes[state.range(0)];
  const bool dequantised = state.range(1) == 1;
  state.SetLabel(std::string(dtype_name(type)) + (dequantised ? "/dequantise+dot" : "/int8"));
  const int64_t rows = 2816, cols = 1024;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  const size_t block_bytes = dtype_row_bytes(type, 32);
  std::vector<uint8_t> bytes(row_bytes * rows);
  std::mt19937 rng(5);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < bytes.size(); b += block_bytes) {
    const uint16_t d = f32_to_f16(0.01f), m = f32_to_f16(-0.05f);
    std::memcpy(&bytes[b], &d, 2);
    if (type == DType::Q4_1 || type == DType::Q5_1) std::memcpy(&bytes[b + 2], &m, 2);
  }
  const WeightMatrix w{type, bytes.data(), rows, cols};
  const auto x = random_floats(cols);
  std::vector<float> y(rows), dense(cols);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (auto _ : state) {
    if (dequantised) {
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(type, w.row(r), dense.data(), cols);
        y[r] = dot(dense.data(), x.data(), cols);
      }
    } else {
      matvec(w, x.data(), y.data());
    }
    benchmark::ClobberMemory();
  }
  omp_set_num_threads(threads);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.bytes()));
}
BENCHMARK(BM_MatvecLegacy)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->ArgNames({"dtype", "dequantised"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// One KV head with n entries of d = 128: K and V bytes processed. group = query heads sharing
// the KV head (attention_decode_group reads K/V once for all of them).
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int group = static_cast<int>(state.range(1));
  const int d = 128;
  const auto q = random_floats(group * d, 1);
  const auto keys = random_floats(n * d, 2), values = random_floats(n * d, 3);
  std::vector<float> out(static_cast<size_t>(group * d));
  for (auto _ : state) {
    attention_decode_group(q.data(), group, keys.data(), values.data(), nullptr, n, d, out.data(),
                           nullptr);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * n * d * 4);
}
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{4096, 32768}, {1, 4}})
    ->ArgNames({"n", "group"})
    ->UseRealTime();

// The same as separate per-head calls (group x K/V reads), for comparison.
void BM_AttentionDecodePerHead(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int group = 4, d = 128;
  const auto q = random_floats(group * d, 1);
  const auto keys = random_floats(n * d, 2), values = random_floats(n * d, 3);
  std::vector<float> out(static_cast<size_t>(group * d));
  for (auto _ : state) {
    for (int h = 0; h < group; ++h)
      attention_decode(q.data() + h * d, keys.data(), values.data(), nullptr, n, d,
                       out.data() + h * d, nullptr);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * n * d * 4);
}
BENCHMARK(BM_AttentionDecodePerHead)->Arg(4096)->Arg(32768)->ArgName("n")->UseRealTime();

}  // namespace
}  // namespace protokv::kernels
