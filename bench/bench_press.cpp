// SPDX-License-Identifier: Apache-2.0
// Compression time per method on the same tensors (DESIGN §7: ratio to snapkv). One layer of a
// Llama-3-8B-shaped attention (32 query heads, 8 KV heads, head_dim 128) with the SYNTHETIC
// post-RoPE Q/K/V of `protokv bench compress`, budget 512. That command gives the medians and
// ratios; this Google Benchmark twin is for profiling one method under perf.
// Run: protokv_microbench --benchmark_filter=Press
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "eval/compress_bench.h"
#include "eval/synthetic.h"
#include "protokv/press_registry.h"

namespace {

constexpr int64_t kBudget = 512;

// The tensors of `protokv bench compress` (eval/compress_bench: its default shape and seed), so
// the two benchmarks time the same input.
const protokv::eval::SyntheticLayer& tensors(int64_t n) {
  static std::unique_ptr<protokv::eval::SyntheticLayer> cached;
  if (!cached || cached->spec.n_tokens != n) {
    const protokv::eval::CompressBenchOptions defaults;
    protokv::eval::SyntheticLayerSpec spec;
    spec.n_tokens = n;
    spec.n_kv_heads = defaults.n_kv_heads;
    spec.group_size = defaults.group_size;
    spec.head_dim = defaults.head_dim;
    spec.seed = defaults.seed;
    cached =
        std::make_unique<protokv::eval::SyntheticLayer>(protokv::eval::make_synthetic_layer(spec));
  }
  return *cached;
}

void BM_PressCompress(benchmark::State& state, const std::string& spec, const std::string& alloc) {
  const protokv::eval::SyntheticLayer& t = tensors(state.range(0));
  const protokv::eval::SyntheticLayerSpec& shape = t.spec;
  auto press = protokv::make_press(spec, alloc);
  protokv::SequenceInfo info;
  info.n_layers = 1;
  info.n_heads = shape.n_kv_heads * shape.group_size;
  info.n_kv_heads = shape.n_kv_heads;
  info.head_dim = shape.head_dim;
  info.n_tokens = shape.n_tokens;
  protokv::Budget budget;
  budget.entries = kBudget;
  press->begin(info, budget);
  for (auto _ : state) {
    protokv::LayerCache out;
    out.heads.assign(static_cast<size_t>(shape.n_kv_heads), protokv::HeadCache(shape.head_dim));
    press->compress_prefill(t.view(/*layer=*/0, /*n_layers=*/1), out);
    benchmark::DoNotOptimize(out.heads[0].key_rows());
  }
  state.counters["n"] = static_cast<double>(shape.n_tokens);
}

void register_all() {
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"snapkv", ""},
      {"protokv", ""},
      // Fewer prototypes: the assignment GEMM costs n * d * (k + u), SnapKV's window GEMM
      // n * d * group * w, so the prototype count sets the ratio to snapkv.
      {"protokv:max_chunks=64", ""},
      {"protokv:max_chunks=16", ""},
      {"protokv:deviation=neighbourhood", ""},
      {"protokv:score=sum_logits,select=clusters", ""},
      {"protokv:prototypes=chunk", ""},
      {"protokv:prototypes=lsh", ""},
      {"protokv", "adakv"},
      {"pyramidkv", ""},
      {"adakv", ""},
      {"streaming_llm", ""},
  };
  for (const auto& [spec, alloc] : methods) {
    const std::string name = "Press/" + spec + (alloc.empty() ? "" : "+" + alloc);
    benchmark::RegisterBenchmark(name.c_str(), BM_PressCompress, spec, alloc)
        ->Arg(4096)
        ->Arg(16384)
        ->ArgName("n")
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  // O(n^2 d) per query head: only the shorter prompt.
  benchmark::RegisterBenchmark("Press/h2o", BM_PressCompress, std::string("h2o"), std::string())
      ->Arg(4096)
      ->ArgName("n")
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->Iterations(1);
}

const bool registered = (register_all(), true);

}  // namespace
