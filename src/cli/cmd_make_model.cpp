// `protokv make-model`: a random-weight Llama model of any shape, as a standard GGUF file.
#include <fmt/format.h>

#include <filesystem>

#include "cli/commands.h"
#include "cli/human_units.h"
#include "model/random_model.h"
#include "protokv/error.h"
#include "protokv/threads.h"
#include "protokv/timer.h"

namespace protokv::cli {
namespace {

struct MakeModelOptions {
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
  c.architecture = "llama";
  c.dim = o.dim;
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
      "wrote {}: random llama, dim {}, ffn {}, {} layers, {} heads ({} kv), vocab {}, "
      "context {}, {}, seed {}, {} in {:.2f} s\n",
      o.output, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
      c.context_length, o.type, o.seed, human_bytes(std::filesystem::file_size(o.output)),
      timer.ms() / 1000.0);
}

}  // namespace

void register_make_model(CLI::App& app) {
  auto o = std::make_shared<MakeModelOptions>();
  auto* cmd = app.add_subcommand(
      "make-model",
      "Write a random-weight Llama model of any shape as a standard GGUF file (also loadable "
      "by llama.cpp), with a synthetic byte-fallback vocabulary: <unk> <s> </s>, 256 byte "
      "tokens, then pieces such as \"\u2581the\". Weights are approximately normal with standard "
      "deviation 1/sqrt(fan_in) (deterministic for a seed, whatever the thread count); norms are "
      "1. Synthetic: for tests and benchmarks, its text is meaningless.");
  cmd->add_option("--dim", o->dim, "Embedding width")->required();
  cmd->add_option("--layers", o->layers, "Transformer blocks")->required();
  cmd->add_option("--heads", o->heads, "Query heads")->required();
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads (default: --heads)");
  cmd->add_option("--ffn", o->ffn, "FFN width (default: 8/3 dim rounded up to 32)");
  cmd->add_option("--vocab", o->vocab, "Vocabulary size (at least 259)")->required();
  cmd->add_option("--ctx", o->ctx, "Context length")->capture_default_str();
  cmd->add_option("--rope-theta", o->rope_theta, "RoPE base")->capture_default_str();
  cmd->add_option("--norm-eps", o->norm_eps, "RMSNorm epsilon")->capture_default_str();
  cmd->add_option("--type", o->type,
                  "Type of the weight matrices: f32, f16, bf16, q8_0, q4_0 or q4_K (rows not a "
                  "multiple of the block size, 32 or 256 for q4_K, fall back to f16; q4_0/q4_K "
                  "use a simple reference quantiser, not llama-quantize's)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--name", o->name, "general.name")->capture_default_str();
  cmd->add_option("-o,--output", o->output, "GGUF file to write")->required();
  cmd->add_option("-t,--threads", o->threads, "Threads (0 = all cores)")->capture_default_str();
  cmd->callback([o] { run_make_model(*o); });
}

}  // namespace protokv::cli
