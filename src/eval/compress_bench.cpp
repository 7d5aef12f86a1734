// SPDX-License-Identifier: Apache-2.0
#include "eval/compress_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "eval/engine_bench.h"
#include "eval/metrics.h"
#include "eval/progress.h"
#include "eval/report/table.h"
#include "eval/synthetic.h"
#include "protokv/error.h"
#include "protokv/json_keys.h"
#include "protokv/press_spec.h"
#include "protokv/threads.h"
#include "protokv/timer.h"

namespace protokv::eval {
namespace {

constexpr const char* kReference = "snapkv";

}  // namespace

CompressBenchReport run_compress_bench(const CompressBenchOptions& options) {
  PROTOKV_CHECK(options.n_layers >= 1 && options.n_layers <= 256,
                "layer count must be in [1, 256]");
  PROTOKV_CHECK(options.reps >= 1 && options.reps <= 1000, "repetitions must be in [1, 1000]");
  PROTOKV_CHECK(!options.lengths.empty(), "give at least one prompt length");
  options.budget.validate();
  for (int64_t n : options.lengths) {
    PROTOKV_CHECK(n >= 16 && n <= (int64_t{1} << 22), "prompt length {} must be in [16, 4194304]",
                  n);
    PROTOKV_CHECK(options.budget.resolve(n) < n,
                  "budget {} keeps every entry of a {}-token prompt: nothing to compress",
                  options.budget.to_string(), n);
  }
  const int64_t n_heads = int64_t{options.n_kv_heads} * options.group_size;
  for (int64_t n : options.lengths) {
    // q, k, v in F32; refuse absurd sizes before allocating.
    const double gib =
        static_cast<double>((n_heads + 2 * options.n_kv_heads) * n * options.head_dim * 4) /
        (1u << 30);
    PROTOKV_CHECK(gib <= 16.0, "-n {} needs {:.1f} GiB of synthetic tensors (limit 16 GiB)", n,
                  gib);
  }

  // The reference first, then the requested presses in order (snapkv once).
  std::vector<std::string> specs = {kReference};
  for (const auto& spec : options.presses) {
    if (spec != kReference) specs.push_back(spec);
  }
  // compress_prefill is timed without a session: one state per spec, driven by hand, begun
  // afresh for every repetition.
  std::vector<std::unique_ptr<Press>> presses;
  for (const auto& spec : specs) {
    PROTOKV_CHECK(spec != "full", "press 'full' does not compress: nothing to time");
    presses.push_back(PressSpec::parse(spec, options.alloc)->instantiate());
  }

  CompressBenchReport report;
  nlohmann::json press_configs = nlohmann::json::array();
  for (size_t i = 0; i < specs.size(); ++i) {
    press_configs.push_back({{"spec", specs[i]}, {"config", presses[i]->config()}});
  }
  report.config = {
      {"tensors", "SYNTHETIC post-RoPE Q/K/V (local drift, sink, clusters, outlier channels)"},
      {"layers", options.n_layers},
      {"kv_heads", options.n_kv_heads},
      {"group", options.group_size},
      {"heads", n_heads},
      {"head_dim", options.head_dim},
      {"lengths", options.lengths},
      {"budget", options.budget.to_string()},
      {"alloc", options.alloc.empty() ? "default" : options.alloc},
      {"reps", options.reps},
      {"seed", options.seed},
      {"reference", kReference},
      {"presses", press_configs},
      {"threads", num_threads()},
      {"version", PROTOKV_VERSION},
      {"timing",
       "compress_prefill only, summed over layers; the same tensors for every layer; one warm-up "
       "run per press, then repetitions alternating between the presses; wall time and the "
       "process's CPU time (all threads)"}};

  Progress progress("bench compress",
                    static_cast<int64_t>(options.lengths.size() * specs.size()) * options.reps,
                    options.progress);
  for (int64_t n : options.lengths) {
    progress.set_detail(fmt::format("n={}: generating tensors", n));
    SyntheticLayerSpec layer_spec;
    layer_spec.n_tokens = n;
    layer_spec.n_kv_heads = options.n_kv_heads;
    layer_spec.group_size = options.group_size;
    layer_spec.head_dim = options.head_dim;
    layer_spec.seed = options.seed;
    const SyntheticLayer tensors = make_synthetic_layer(layer_spec);

    SequenceInfo info;
    info.n_layers = options.n_layers;
    info.n_heads = static_cast<int>(n_heads);
    info.n_kv_heads = options.n_kv_heads;
    info.head_dim = options.head_dim;
    info.n_tokens = n;

    // One compression of all layers by press p: total wall ms (and CPU ms), kept entries, bytes.
    const auto time_once = [&](size_t p, int64_t& kept, size_t& bytes, double& cpu_ms) {
      presses[p]->begin(info, options.budget);
      double total_ms = 0.0;
      cpu_ms = 0.0;
      kept = 0;
      bytes = 0;
      for (int layer = 0; layer < options.n_layers; ++layer) {
        LayerCache out;
        out.heads.assign(static_cast<size_t>(options.n_kv_heads), HeadCache(options.head_dim));
        const LayerView view = tensors.view(layer, options.n_layers);
        const double cpu_start = process_cpu_ms();
        Timer timer;
        presses[p]->compress_prefill(view, out);
        total_ms += timer.ms();
        cpu_ms += process_cpu_ms() - cpu_start;
        for (const auto& head : out.heads) kept += head.size();
        bytes += out.kv_bytes();
      }
      return total_ms;
    };
    std::vector<CompressBenchResult> results(specs.size());
    for (size_t p = 0; p < specs.size(); ++p) {
      results[p].press = specs[p];
      results[p].press_config = presses[p]->config();
      results[p].n = n;
      int64_t kept = 0;
      size_t bytes = 0;
      double cpu_ms = 0.0;
      time_once(p, kept, bytes, cpu_ms);  // warm-up: page faults, thread pool, caches
    }
    // Repetitions alternate between the presses, so that a change of machine load (other jobs)
    // hits every press alike and the ratios within one run stay meaningful.
    for (int rep = 0; rep < options.reps; ++rep) {
      for (size_t p = 0; p < specs.size(); ++p) {
        CompressBenchResult& result = results[p];
        double cpu_ms = 0.0;
        result.times_ms.push_back(time_once(p, result.kept_entries, result.kv_bytes, cpu_ms));
        result.cpu_times_ms.push_back(cpu_ms);
        progress.advance(1, fmt::format("n={} rep {} {}", n, rep + 1, specs[p]));
      }
    }
    for (auto& result : results) {
      result.min_ms = *std::min_element(result.times_ms.begin(), result.times_ms.end());
      result.median_ms = median(result.times_ms);
      result.cpu_min_ms = *std::min_element(result.cpu_times_ms.begin(), result.cpu_times_ms.end());
      result.cpu_median_ms = median(result.cpu_times_ms);
    }
    for (auto& result : results) {
      result.ratio_to_snapkv =
          results[0].median_ms > 0.0 ? result.median_ms / results[0].median_ms : 0.0;
      result.min_ratio_to_snapkv =
          results[0].min_ms > 0.0 ? result.min_ms / results[0].min_ms : 0.0;
      result.cpu_ratio_to_snapkv =
          results[0].cpu_median_ms > 0.0 ? result.cpu_median_ms / results[0].cpu_median_ms : 0.0;
      result.cpu_min_ratio_to_snapkv =
          results[0].cpu_min_ms > 0.0 ? result.cpu_min_ms / results[0].cpu_min_ms : 0.0;
      report.results.push_back(std::move(result));
    }
  }
  progress.finish();
  return report;
}

nlohmann::json to_json(const CompressBenchReport& report) {
  nlohmann::json results = nlohmann::json::array();
  for (const auto& r : report.results) {
    results.push_back({{"press", r.press},
                       {"press_config", r.press_config},
                       {"n", r.n},
                       {"min_ms", r.min_ms},
                       {"median_ms", r.median_ms},
                       {"ratio_to_snapkv", r.ratio_to_snapkv},
                       {"min_ratio_to_snapkv", r.min_ratio_to_snapkv},
                       {"kept_entries", r.kept_entries},
                       {json_keys::kKvBytes, r.kv_bytes},
                       {"times_ms", r.times_ms},
                       {"cpu_min_ms", r.cpu_min_ms},
                       {"cpu_median_ms", r.cpu_median_ms},
                       {"cpu_ratio_to_snapkv", r.cpu_ratio_to_snapkv},
                       {"cpu_min_ratio_to_snapkv", r.cpu_min_ratio_to_snapkv},
                       {"cpu_times_ms", r.cpu_times_ms}});
  }
  return {{"config", report.config}, {"results", results}};
}

std::string render_table(const CompressBenchReport& report) {
  Table table;
  table.add_column("press", Table::Align::kLeft);
  table.add_column("n");
  table.add_column("min ms");
  table.add_column("median ms");
  table.add_column("x snapkv (median)");
  table.add_column("x snapkv (min)");
  table.add_column("CPU x snapkv (median)");
  table.add_column("CPU x snapkv (min)");
  table.add_column("kept/head");
  for (const auto& r : report.results) {
    const int64_t per_head =
        r.kept_entries / std::max<int64_t>(1, report.config.value("kv_heads", int64_t{1}) *
                                                  report.config.value("layers", int64_t{1}));
    table.add_row({r.press, fmt::format("{}", r.n), fmt::format("{:.2f}", r.min_ms),
                   fmt::format("{:.2f}", r.median_ms), fmt::format("{:.2f}", r.ratio_to_snapkv),
                   fmt::format("{:.2f}", r.min_ratio_to_snapkv),
                   fmt::format("{:.2f}", r.cpu_ratio_to_snapkv),
                   fmt::format("{:.2f}", r.cpu_min_ratio_to_snapkv), fmt::format("{}", per_head)});
  }
  return table.render();
}

}  // namespace protokv::eval
