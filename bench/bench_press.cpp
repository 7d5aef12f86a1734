// Compression time per method on the same tensors (DESIGN §7: ratio to snapkv). One layer of a
// Llama-3-8B-shaped attention (32 query heads, 8 KV heads, head_dim 128), random post-RoPE-like
// Q/K/V, budget 512. Run: protokv_microbench --benchmark_filter=Press
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "protokv/press_registry.h"

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kDim = 128;
constexpr int64_t kBudget = 512;

struct Tensors {
  int64_t n;
  std::vector<float> q, k, v;
  std::vector<int32_t> positions;

  explicit Tensors(int64_t tokens) : n(tokens) {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal;
    q.resize(static_cast<size_t>(kHeads * n * kDim));
    k.resize(static_cast<size_t>(kKvHeads * n * kDim));
    v.resize(k.size());
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    positions.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  }

  protokv::LayerView view() const {
    protokv::LayerView view;
    view.layer = 0;
    view.n_layers = 1;
    view.n_tokens = n;
    view.head_dim = kDim;
    view.n_heads = kHeads;
    view.n_kv_heads = kKvHeads;
    view.q = q.data();
    view.k = k.data();
    view.v = v.data();
    view.positions = positions.data();
    return view;
  }
};

const Tensors& tensors(int64_t n) {
  static std::unique_ptr<Tensors> cached;
  if (!cached || cached->n != n) cached = std::make_unique<Tensors>(n);
  return *cached;
}

void BM_PressCompress(benchmark::State& state, const std::string& spec, const std::string& alloc) {
  const Tensors& t = tensors(state.range(0));
  auto press = protokv::make_press(spec, alloc);
  protokv::SequenceInfo info;
  info.n_layers = 1;
  info.n_heads = kHeads;
  info.n_kv_heads = kKvHeads;
  info.head_dim = kDim;
  info.n_tokens = t.n;
  protokv::Budget budget;
  budget.entries = kBudget;
  press->begin(info, budget);
  for (auto _ : state) {
    protokv::LayerCache out;
    out.heads.assign(kKvHeads, protokv::HeadCache(kDim));
    press->compress_prefill(t.view(), out);
    benchmark::DoNotOptimize(out.heads[0].keys());
  }
  state.counters["n"] = static_cast<double>(t.n);
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

// bench/ files share one binary; its main() normally comes from the kernels benchmarks
// (BENCHMARK_MAIN there). This weak fallback keeps the binary linkable without them.
__attribute__((weak)) int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
