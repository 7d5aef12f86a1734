// SPDX-License-Identifier: Apache-2.0
// `protokv bench e2e`: prefill and decode speed against the machine's own reference numbers
// (OpenBLAS sgemm GFLOP/s and memory copy bandwidth), measured in the same run.
//
// Formulas (documented in --help too):
//   prefill FLOPs = 2 * n * P_proj + 2 * L * H * d * n * (n + 1) + 2 * V * D
//     P_proj: parameters of the per-layer projections (q, k, v, o, gate, up, down) over all
//     layers; the second term is causal attention (q·k and p·v, n(n+1)/2 pairs per head, d each);
//     the last the classifier of the last token (norms, RoPE and softmax are not counted).
//   decode bytes per token = weights streamed + KV bytes in the cache at that step
//     weights streamed: every matrix but the token embedding (one row is read), which is counted
//     when it doubles as the classifier; KV: keys + values of every layer and KV head, read once.
//   copy GB/s counts bytes read + written (the STREAM convention); read GB/s bytes read.
//   decode CPU ms/token: process CPU time (all threads, CLOCK_PROCESS_CPUTIME_ID) per decode
//     step; at -t 1 the decoding thread's own time, which waiting for a core on a loaded machine
//     does not inflate as it does the wall-clock ms/token.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "eval/engine_bench.h"
#include "eval/metrics.h"
#include "kernels/blas_core.h"
#include "kernels/isa.h"
#include "model/tensor_table.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/json_keys.h"
#include "protokv/sampler.h"
#include "protokv/threads.h"
#include "protokv/timer.h"

namespace protokv::cli {
namespace {

using eval::MachineReference;
using eval::measure_bandwidth;
using eval::measure_sgemm_gflops;
using eval::median;
using eval::prefill_flops;
using eval::process_cpu_ms;
using eval::streamed_weight_bytes;

struct E2eOptions {
  ModelOptions model;
  PressOptions press;
  std::vector<int64_t> contexts = {512, 2048, 8192};
  int decode_steps = 32;
  int reps = 1;
  uint64_t seed = 42;
  bool json = false;
  int64_t gemm_size = 1024;
  int64_t copy_mib = 256;
  int64_t ubatch = 0;
};

struct ContextResult {
  int64_t context = 0;
  double prefill_ms = 0.0;
  double compress_ms = 0.0;
  size_t kv_bytes_after_prefill = 0;
  size_t kv_bytes_peak_prefill = 0;
  int decode_steps = 0;
  double decode_ms_per_token = 0.0;
  double decode_cpu_ms_per_token = 0.0;  // process CPU time per step (median over reps)
  double decode_bytes_per_token = 0.0;   // weights + mean KV bytes attended
  double kv_bytes_attended = 0.0;        // mean KV bytes a decode step's attention read
  size_t kv_bytes_stored_end = 0;        // KV bytes stored after the last decode step
};

ContextResult bench_context(const LoadedModel& model, const PressSetup& setup, int64_t context,
                            const E2eOptions& o) {
  const ModelConfig& config = model.weights.config;
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(context));
  std::uniform_int_distribution<int32_t> dist(0, config.vocab_size - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(context));
  for (auto& t : tokens) t = dist(rng);

  ContextResult r;
  r.context = context;
  r.decode_steps =
      static_cast<int>(std::min<int64_t>(o.decode_steps, config.context_length - context));
  std::vector<double> prefill_ms, compress_ms, step_ms, step_cpu_ms;
  double kv_read = 0.0;
  for (int rep = 0; rep < o.reps; ++rep) {
    SessionOptions session_options = setup.session_options();
    session_options.ubatch = o.ubatch;
    Session session(model.weights, session_options);
    std::span<const float> logits = session.prefill(tokens);
    prefill_ms.push_back(session.prefill_stats().prefill_ms);
    compress_ms.push_back(session.prefill_stats().compress_ms);
    r.kv_bytes_after_prefill = session.prefill_stats().kv_bytes;
    r.kv_bytes_peak_prefill = session.prefill_stats().peak_kv_bytes;
    double decode_total = 0.0, decode_cpu_total = 0.0, kv_total = 0.0;
    for (int i = 0; i < r.decode_steps; ++i) {
      const int32_t next = argmax(logits);
      const double cpu_start = process_cpu_ms();
      const Timer t;
      logits = session.decode(next);
      decode_total += t.ms();
      decode_cpu_total += process_cpu_ms() - cpu_start;
      // Bytes attended, not stored: a recall press (clusterkv) reads a subset.
      kv_total += static_cast<double>(session.prefill_stats().decode_attended_kv_bytes);
    }
    r.kv_bytes_stored_end = session.cache().kv_bytes();
    if (r.decode_steps > 0) {
      step_ms.push_back(decode_total / r.decode_steps);
      step_cpu_ms.push_back(decode_cpu_total / r.decode_steps);
      kv_read = kv_total / r.decode_steps;
    }
  }
  r.prefill_ms = median(prefill_ms);
  r.compress_ms = median(compress_ms);
  if (!step_ms.empty()) {
    r.decode_ms_per_token = median(step_ms);
    r.decode_cpu_ms_per_token = median(step_cpu_ms);
  }
  r.kv_bytes_attended = kv_read;
  r.decode_bytes_per_token = static_cast<double>(streamed_weight_bytes(model.weights)) + kv_read;
  return r;
}

void run_e2e(const E2eOptions& o) {
  PROTOKV_CHECK(!o.contexts.empty(), "-c needs at least one context length");
  PROTOKV_CHECK(o.decode_steps >= 0, "-n must be >= 0, got {}", o.decode_steps);
  PROTOKV_CHECK(o.reps >= 1, "--reps must be >= 1, got {}", o.reps);
  check_ubatch(o.ubatch);
  PressSetup setup = make_press_setup(o.press);
  const LoadedModel model = load_model_from_options(o.model, /*require_tokenizer=*/false);
  const ModelConfig& config = model.weights.config;
  for (int64_t c : o.contexts) {
    PROTOKV_CHECK(c >= 1, "context lengths must be >= 1, got {}", c);
    PROTOKV_CHECK(c <= config.context_length,
                  "context length {} is longer than the model's context ({} tokens)", c,
                  config.context_length);
  }

  PROTOKV_CHECK(o.gemm_size >= 16 && o.gemm_size <= 8192, "--gemm-size must be in [16, 8192]");
  PROTOKV_CHECK(o.copy_mib >= 1 && o.copy_mib <= 16384, "--copy-mib must be in [1, 16384]");
  MachineReference ref;
  ref.sgemm_size = o.gemm_size;
  ref.copy_bytes = static_cast<size_t>(o.copy_mib) << 20;
  ref.sgemm_gflops = measure_sgemm_gflops(ref.sgemm_size);
  measure_bandwidth(ref);

  // Warm-up outside the timings: pages the mapped weights in and lets OpenBLAS and the OpenMP
  // pool initialise, one-time costs that would otherwise land on the first context measured.
  {
    Session warm(model.weights);
    std::vector<int32_t> tokens(static_cast<size_t>(std::min(config.context_length - 1, 16)), 0);
    warm.decode(argmax(warm.prefill(tokens)));
  }

  std::vector<ContextResult> results;
  for (int64_t c : o.contexts) results.push_back(bench_context(model, setup, c, o));

  auto prefill_gflops = [&](const ContextResult& r) {
    return prefill_flops(model.weights, r.context) / (r.prefill_ms * 1e6);
  };
  auto decode_gbs = [](const ContextResult& r) {
    return r.decode_ms_per_token > 0 ? r.decode_bytes_per_token / (r.decode_ms_per_token * 1e6)
                                     : 0.0;
  };

  if (o.json) {
    nlohmann::json out;
    out["config"]["model"] = model_json(model);
    const nlohmann::json press_json = setup.to_json();
    for (const auto& [key, value] : press_json.items()) out["config"][key] = value;
    out["config"]["threads"] = num_threads();
    out["config"]["kernels"] = kernels::isa_name(kernels::active_isa());
    out["config"]["blas_core"] = kernels::blas_core().name;
    out["config"]["decode_steps"] = o.decode_steps;
    out["config"]["reps"] = o.reps;
    out["config"]["seed"] = o.seed;
    if (o.ubatch > 0) out["config"]["ubatch"] = o.ubatch;
    out["machine"] = {{"sgemm_size", ref.sgemm_size},
                      {"sgemm_gflops", ref.sgemm_gflops},
                      {"copy_bytes", ref.copy_bytes},
                      {"copy_gbs_read_plus_write", ref.copy_gbs},
                      {"read_gbs", ref.read_gbs}};
    for (const ContextResult& r : results) {
      nlohmann::json j;
      j["context"] = r.context;
      j["prefill_ms"] = r.prefill_ms;
      j["prefill_tokens_per_s"] = 1000.0 * static_cast<double>(r.context) / r.prefill_ms;
      j["prefill_gflops"] = prefill_gflops(r);
      j["prefill_fraction_of_sgemm"] = prefill_gflops(r) / ref.sgemm_gflops;
      j["compress_ms"] = r.compress_ms;
      j["compress_share_of_prefill"] = r.compress_ms / r.prefill_ms;
      j[json_keys::kKvBytesAfterPrefill] = r.kv_bytes_after_prefill;
      j[json_keys::kKvBytesPeakPrefill] = r.kv_bytes_peak_prefill;
      j["decode_steps"] = r.decode_steps;
      j["decode_ms_per_token"] =
          r.decode_steps > 0 ? nlohmann::json(r.decode_ms_per_token) : nlohmann::json(nullptr);
      j["decode_cpu_ms_per_token"] =
          r.decode_steps > 0 ? nlohmann::json(r.decode_cpu_ms_per_token) : nlohmann::json(nullptr);
      j["decode_bytes_per_token"] = r.decode_bytes_per_token;
      j["kv_bytes_stored_end"] = r.kv_bytes_stored_end;
      j["kv_bytes_attended_per_step"] = r.kv_bytes_attended;
      j["decode_gbs"] = decode_gbs(r);
      j["decode_fraction_of_copy"] = decode_gbs(r) / ref.copy_gbs;
      out["results"].push_back(j);
    }
    fmt::print("{}\n", out.dump(2));
    return;
  }

  fmt::print("model: {} ({}, dim {}, {} layers, {} heads / {} KV heads, {:.2f} M parameters, {})\n",
             model.path, model.format, config.dim, config.n_layers, config.n_heads,
             config.n_kv_heads, static_cast<double>(model.weights.parameter_count()) / 1e6,
             format_bytes(static_cast<double>(model.weights.weight_bytes()), 2));
  fmt::print(
      "press: {} | threads {} | kernels {} | OpenBLAS core {} | decode steps {} | reps {} "
      "(median)\n",
      setup.to_json()["press"].dump(), num_threads(), kernels::isa_name(kernels::active_isa()),
      kernels::blas_core().name, o.decode_steps, o.reps);
  fmt::print(
      "machine: sgemm {}^3 {:.1f} GFLOP/s | copy {} {:.1f} GB/s (read+write), read {:.1f} GB/s\n",
      ref.sgemm_size, ref.sgemm_gflops, format_bytes(static_cast<double>(ref.copy_bytes), 2),
      ref.copy_gbs, ref.read_gbs);
  fmt::print(
      "{:>8} {:>11} {:>10} {:>9} {:>7} {:>11} {:>7} {:>11} {:>11} {:>11} {:>11} {:>10} {:>7}\n",
      "context", "prefill ms", "tok/s", "GFLOP/s", "%sgemm", "compress ms", "%pref", "KV prefill",
      "KV attended", "decode ms/t", "dec CPU ms/t", "dec GB/s", "%copy");
  for (const ContextResult& r : results) {
    fmt::print(
        "{:>8} {:>11.1f} {:>10.1f} {:>9.2f} {:>6.1f}% {:>11.2f} {:>6.1f}% {:>11} {:>11} {:>11.3f} "
        "{:>11.3f} {:>10.2f} {:>6.1f}%\n",
        r.context, r.prefill_ms, 1000.0 * static_cast<double>(r.context) / r.prefill_ms,
        prefill_gflops(r), 100.0 * prefill_gflops(r) / ref.sgemm_gflops, r.compress_ms,
        100.0 * r.compress_ms / r.prefill_ms,
        format_bytes(static_cast<double>(r.kv_bytes_after_prefill), 2),
        format_bytes(r.kv_bytes_attended, 2), r.decode_ms_per_token, r.decode_cpu_ms_per_token,
        decode_gbs(r), 100.0 * decode_gbs(r) / ref.copy_gbs);
  }
}

void register_e2e(CLI::App& bench) {
  auto options = std::make_shared<E2eOptions>();
  auto* cmd = bench.add_subcommand(
      "e2e",
      "Prefill tokens/s and decode ms/token per context length (random token ids), against "
      "sgemm GFLOP/s and copy bandwidth measured in the same run. Prefill FLOPs = 2 n P_proj + "
      "2 L H d n(n+1) + 2 V D; decode bytes/token = weights (without the embedding table unless "
      "shared with the classifier) + KV bytes held; copy GB/s counts read + write; decode CPU "
      "ms/token is the process's CPU time (all threads) per step, robust to a loaded machine.");
  add_model_options(*cmd, options->model);
  cmd->add_option("-c,--context", options->contexts, "Context lengths, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-n,--decode-steps", options->decode_steps, "Decode steps per context")
      ->capture_default_str();
  cmd->add_option("--reps", options->reps, "Repetitions per context (median reported)")
      ->capture_default_str();
  cmd->add_option("--gemm-size", options->gemm_size, "Reference sgemm: M = N = K = this size")
      ->capture_default_str();
  cmd->add_option("--copy-mib", options->copy_mib,
                  "Reference copy/read bandwidth buffer size in MiB (far larger than the caches)")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed of the random prompt tokens")
      ->capture_default_str();
  add_press_options(*cmd, options->press);
  add_ubatch_option(*cmd, options->ubatch);
  cmd->add_flag("--json", options->json, "Print JSON instead of a table");
  cmd->callback([options] { run_e2e(*options); });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand(
      "bench", "Measure cost: end-to-end speed (e2e) and compression time alone (compress)");
  bench->require_subcommand(1);
  register_e2e(*bench);
  register_bench_compress(*bench);
}

}  // namespace protokv::cli
