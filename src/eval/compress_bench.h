// SPDX-License-Identifier: Apache-2.0
#pragma once
// `bench compress`: times each press's compress_prefill alone on the same SYNTHETIC post-RoPE
// tensors (DESIGN §7: compression time per method, as a ratio to snapkv).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "protokv/press.h"

namespace protokv::eval {

struct CompressBenchOptions {
  int n_layers = 1;
  int n_kv_heads = 8;
  int group_size = 4;
  int head_dim = 128;
  std::vector<int64_t> lengths = {4096, 16384};
  std::vector<std::string> presses;  // specs as for --press; snapkv is added as the reference
  std::string alloc;                 // empty: each method's default
  Budget budget;
  int reps = 5;
  uint64_t seed = 7;
  bool progress = true;
};

struct CompressBenchResult {
  std::string press;  // spec as given
  nlohmann::json press_config;
  int64_t n = 0;
  double min_ms = 0.0;
  double median_ms = 0.0;
  double ratio_to_snapkv = 0.0;      // median / snapkv's median at the same n
  double min_ratio_to_snapkv = 0.0;  // min / snapkv's min at the same n (least load-sensitive)
  int64_t kept_entries = 0;          // all layers and heads after compression
  size_t kv_bytes = 0;
  std::vector<double> times_ms;  // one per repetition: all layers of one compression
  // The same for the process's CPU time (all threads): the work done, which other jobs on a
  // loaded machine disturb much less than the wall time (they take turns on the cores).
  double cpu_min_ms = 0.0;
  double cpu_median_ms = 0.0;
  double cpu_ratio_to_snapkv = 0.0;      // CPU median / snapkv's CPU median
  double cpu_min_ratio_to_snapkv = 0.0;  // CPU min / snapkv's CPU min
  std::vector<double> cpu_times_ms;
};

struct CompressBenchReport {
  nlohmann::json config;
  std::vector<CompressBenchResult> results;
};

// Throws Error for bad options (unknown press, budget >= n, absurd shapes).
CompressBenchReport run_compress_bench(const CompressBenchOptions& options);

nlohmann::json to_json(const CompressBenchReport& report);
std::string render_table(const CompressBenchReport& report);

}  // namespace protokv::eval
