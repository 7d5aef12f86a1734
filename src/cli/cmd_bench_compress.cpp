// SPDX-License-Identifier: Apache-2.0
// `protokv bench compress`: each press's compress_prefill alone on the same SYNTHETIC post-RoPE
// tensors, as a ratio to snapkv (DESIGN §7).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "eval/compress_bench.h"
#include "eval/spec_list.h"
#include "protokv/threads.h"

namespace protokv::cli {
namespace {

struct BenchCompressArgs {
  eval::CompressBenchOptions options;
  std::string lengths = "4096,16384";
  std::vector<std::string> presses;
  int64_t budget = 0;
  double ratio = 0.0;
  int threads = 0;
  bool json = false;
  bool quiet = false;
};

}  // namespace

void register_bench_compress(CLI::App& bench) {
  auto args = std::make_shared<BenchCompressArgs>();
  auto* cmd = bench.add_subcommand(
      "compress",
      "Time each press's compress_prefill alone on the same SYNTHETIC post-RoPE Q/K/V (keys with "
      "local drift, a large-norm sink token, far-apart clustered tokens, two outlier channels): "
      "one warm-up run per press, then repetitions alternating between the presses; min and "
      "median, and the ratios of medians and of minimums to snapkv (always measured as the "
      "reference). "
      "For the share of a whole prefill that compression takes on a real model, use "
      "`bench e2e --press X --budget B` (compress ms / prefill ms).");
  auto& o = args->options;
  cmd->add_option("--layers", o.n_layers, "layers compressed per repetition (same tensors)")
      ->capture_default_str();
  cmd->add_option("--kv-heads", o.n_kv_heads, "KV heads")->capture_default_str();
  cmd->add_option("--group", o.group_size, "query heads per KV head")->capture_default_str();
  cmd->add_option("--head-dim", o.head_dim, "head dimension")->capture_default_str();
  cmd->add_option("-n,--tokens", args->lengths, "comma-separated prompt lengths")
      ->capture_default_str();
  cmd->add_option("--press", args->presses, "comma-separated press specs")->required();
  cmd->add_option("--alloc", o.alloc, "budget allocator: uniform|pyramid|adakv");
  cmd->add_option("--budget", args->budget, "entries kept per KV head (default 256)");
  cmd->add_option("--ratio", args->ratio, "or a ratio of the prompt in (0, 1]");
  cmd->add_option("--reps", o.reps, "repetitions per (press, n)")->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the synthetic tensors")->capture_default_str();
  cmd->add_option("-t,--threads", args->threads, "threads (0: all cores)")->capture_default_str();
  cmd->add_flag("--json", args->json,
                "JSON on stdout: {config, results: [{press, n, min_ms, median_ms, "
                "ratio_to_snapkv, min_ratio_to_snapkv, times_ms, ...}]}");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->callback([args] {
    set_threads(args->threads);
    auto options = args->options;
    options.lengths = eval::parse_positive_list(args->lengths, "-n");
    options.presses = eval::split_press_specs(args->presses);
    options.budget.entries = args->budget;
    options.budget.ratio = args->ratio;
    if (args->budget == 0 && args->ratio == 0.0) options.budget.entries = 256;
    options.progress = !args->quiet;
    const eval::CompressBenchReport report = eval::run_compress_bench(options);
    if (args->json) {
      std::printf("%s\n", eval::to_json(report).dump(2).c_str());
    } else {
      std::printf(
          "bench compress: SYNTHETIC tensors, %d layer(s), %d KV heads x %d, head dim %d, "
          "budget %s, %d reps, %d threads\n",
          options.n_layers, options.n_kv_heads, options.group_size, options.head_dim,
          options.budget.to_string().c_str(), options.reps, num_threads());
      std::printf("%s", eval::render_table(report).c_str());
    }
  });
}

}  // namespace protokv::cli
