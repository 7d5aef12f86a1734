// SPDX-License-Identifier: Apache-2.0
// `protokv make-model`: a random-weight model of any architecture protokv runs (the registry of
// model/tensor_table.h) and any shape, as a standard GGUF file in llama.cpp's conventions.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "cli/commands.h"
#include "core/units.h"
#include "model/random_model.h"
#include "model/tensor_table.h"
#include "protokv/error.h"
#include "protokv/threads.h"
#include "protokv/timer.h"

namespace protokv::cli {
namespace {

struct MakeModelOptions {
  std::string arch = "llama";
  std::string rope_scaling = "none";
  float rope_scaling_factor = 0.0f;  // 0: the scaling's default (linear needs one)
  bool tied = false;
  int head_dim = 0;        // 0: dim / heads
  int sliding_window = 0;  // gemma3: > 0 makes the local layers of the pattern below
  int swa_period = 6;
  int dim = 0;
  int layers = 0;
  int heads = 0;
  int kv_heads = 0;  // 0: same as heads
  int ffn = 0;       // 0: Llama's rule, see default_ffn()
  int vocab = 0;
  int ctx = 2048;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  std::string type = "f32";
  uint64_t seed = 0;
  std::string name = "protokv-random";
  std::string output;
  int threads = 0;
};

// Llama's FFN width rule: 2/3 of 4 * dim, rounded up to a multiple of 32 (Llama uses 256,
// which would dominate small test models).
int default_ffn(int dim) {
  const int64_t hidden = int64_t{4} * dim * 2 / 3;
  return static_cast<int>((hidden + 31) / 32 * 32);
}

void run_make_model(const MakeModelOptions& o) {
  RandomModelOptions options;
  ModelConfig& c = options.config;
  c.architecture = o.arch;
  c.dim = o.dim;
  const Architecture& arch = set_architecture_constants(c);  // rejects an unknown one
  c.shared_classifier = o.tied;
  c.explicit_head_dim = o.head_dim;
  PROTOKV_CHECK(o.head_dim == 0 || arch.free_head_dim || o.dim == o.heads * o.head_dim,
                "--head-dim {} x --heads {} must equal --dim {} for {} (llama.cpp's shapes); "
                "only {} have wider or narrower heads",
                o.head_dim, o.heads, o.dim, o.arch,
                architecture_names(&Architecture::free_head_dim));
  PROTOKV_CHECK(o.sliding_window == 0 || arch.sliding_window,
                "--sliding-window is for --arch {}, not {}",
                architecture_names(&Architecture::sliding_window), o.arch);
  PROTOKV_CHECK(o.sliding_window >= 0 && o.swa_period >= 0,
                "--sliding-window and --swa-period must be >= 0");
  if (o.sliding_window > 0) {
    c.sliding_window = o.sliding_window;
    c.local_layers = sliding_window_pattern(o.layers, o.swa_period);
  }
  if (o.rope_scaling == "llama3") {
    PROTOKV_CHECK(arch.rope_freq_factors, "--rope-scaling llama3 is for --arch {}, not {}",
                  architecture_names(&Architecture::rope_freq_factors), o.arch);
    PROTOKV_CHECK(o.rope_scaling_factor == 0.0f,
                  "--rope-scaling llama3 writes Llama 3.1's factors (factor 8); "
                  "--rope-scaling-factor does not apply");
    c.rope_freq_factors = true;
  } else if (o.rope_scaling == "linear") {
    PROTOKV_CHECK(o.rope_scaling_factor > 0.0f,
                  "--rope-scaling linear needs --rope-scaling-factor (> 0)");
    c.rope_linear_factor = o.rope_scaling_factor;
  } else {
    PROTOKV_CHECK(o.rope_scaling == "none", "unknown --rope-scaling '{}' (none, linear, llama3)",
                  o.rope_scaling);
    PROTOKV_CHECK(o.rope_scaling_factor == 0.0f,
                  "--rope-scaling-factor needs --rope-scaling linear");
  }
  c.n_layers = o.layers;
  c.n_heads = o.heads;
  c.n_kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  c.hidden_dim = o.ffn == 0 && o.dim > 0 ? default_ffn(o.dim) : o.ffn;
  c.vocab_size = o.vocab;
  c.context_length = o.ctx;
  c.rope_theta = o.rope_theta;
  c.norm_eps = o.norm_eps;
  options.type = dtype_from_name(o.type);
  options.seed = o.seed;
  options.name = o.name;
  validate_random_model(options);

  set_threads(o.threads);
  Timer timer;
  const auto notes = write_random_model(options, o.output);
  for (const auto& note : notes) fmt::print(stderr, "protokv: note: {}\n", note);
  fmt::print(
      "wrote {}: random {}, dim {}, ffn {}, {} layers, {} heads ({} kv), vocab {}, "
      "context {}, {}, seed {}, {} in {:.2f} s\n",
      o.output, c.architecture, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
      c.vocab_size, c.context_length, o.type, o.seed,
      format_bytes(static_cast<double>(std::filesystem::file_size(o.output))), timer.ms() / 1000.0);
}

}  // namespace

void register_make_model(CLI::App& app) {
  auto o = std::make_shared<MakeModelOptions>();
  auto* cmd = app.add_subcommand(
      "make-model",
      "Write a random-weight model of any shape as a standard GGUF file (also loadable by "
      "llama.cpp), with a synthetic byte-fallback vocabulary: <unk> <s> </s>, "
      "256 byte "
      "tokens, then pieces such as \"\u2581the\". Weights are approximately normal with standard "
      "deviation 1/sqrt(fan_in) (deterministic for a seed, whatever the thread count); norms are "
      "1. Synthetic: for tests and benchmarks, its text is meaningless.");
  std::vector<std::string> arch_help;
  for (const Architecture& a : architectures())
    arch_help.push_back(fmt::format("{} ({})", a.name, a.summary));
  cmd->add_option(
         "--arch", o->arch,
         fmt::format("Architecture, in llama.cpp's GGUF conventions: {} (the "
                     "sliding-window layers of {} with --sliding-window)",
                     fmt::join(arch_help, ", "), architecture_names(&Architecture::sliding_window)))
      ->capture_default_str();
  cmd->add_option("--dim", o->dim, "Embedding width")->required();
  cmd->add_option("--layers", o->layers, "Transformer blocks")->required();
  cmd->add_option("--heads", o->heads, "Query heads")->required();
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads (default: --heads)");
  cmd->add_option("--ffn", o->ffn, "FFN width (default: 8/3 dim rounded up to 32)");
  cmd->add_option("--vocab", o->vocab, "Vocabulary size (at least 259)")->required();
  cmd->add_option("--ctx", o->ctx, "Context length")->capture_default_str();
  cmd->add_option("--head-dim", o->head_dim,
                  fmt::format("Per-head width written as attention.key_length (default: dim / "
                              "heads; other values for {} only)",
                              architecture_names(&Architecture::free_head_dim)));
  cmd->add_option("--sliding-window", o->sliding_window,
                  "gemma3: tokens a local layer attends to (0: every layer global)");
  cmd->add_option("--swa-period", o->swa_period,
                  "gemma3: layer l is local unless l % P == P - 1 (llama.cpp's pattern)")
      ->capture_default_str();
  cmd->add_option("--rope-theta", o->rope_theta, "RoPE base")->capture_default_str();
  cmd->add_option("--rope-scaling", o->rope_scaling,
                  "RoPE scaling: none, linear (needs --rope-scaling-factor) or llama3 (writes "
                  "rope_freqs.weight with Llama 3.1's factors: factor 8, low/high frequency "
                  "factors 1/4, original context 8192; use a large --rope-theta such as 500000)")
      ->capture_default_str();
  cmd->add_option("--rope-scaling-factor", o->rope_scaling_factor,
                  "Linear RoPE scaling factor (positions are divided by it)");
  cmd->add_flag("--tied", o->tied,
                "Tie the output layer to the token embedding (no output.weight)");
  cmd->add_option("--norm-eps", o->norm_eps, "RMSNorm epsilon")->capture_default_str();
  cmd->add_option("--type", o->type,
                  fmt::format("Type of the weight matrices: {} (rows not a multiple of the "
                              "block size, 32 or 256 for q4_K, fall back to f16; q4_0/q4_K use a "
                              "simple reference quantiser, not llama-quantize's)",
                              dtype_names(/*writable_only=*/true)))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--name", o->name, "general.name")->capture_default_str();
  cmd->add_option("-o,--output", o->output, "GGUF file to write")->required();
  cmd->add_option("-t,--threads", o->threads, "Threads (0 = all cores)")->capture_default_str();
  cmd->callback([o] { run_make_model(*o); });
}

}  // namespace protokv::cli
