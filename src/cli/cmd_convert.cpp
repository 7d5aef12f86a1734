// SPDX-License-Identifier: Apache-2.0
// `protokv convert`: llama2.c checkpoint + tokenizer.bin -> GGUF, GGUF -> GGUF of another tensor
// type, or a Hugging Face checkpoint folder (config.json + safetensors + tokenizer.json) -> GGUF.
#include <fmt/format.h>

#include <filesystem>

#include "cli/commands.h"
#include "cli/human_units.h"
#include "core/units.h"
#include "model/gguf_export.h"
#include "model/hf_convert.h"
#include "model/tensor_table.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "protokv/threads.h"
#include "protokv/timer.h"

namespace protokv::cli {
namespace {

struct ConvertOptions {
  std::string input;
  std::string tokenizer;
  std::string output;
  std::string type = "f32";
  std::string name;
  int threads = 0;
};

void run_convert_hf(const ConvertOptions& o, DType type, const Timer& timer) {
  if (!o.tokenizer.empty()) {
    fail("a Hugging Face checkpoint brings its own tokenizer.json; drop the tokenizer argument");
  }
  HfConvertOptions options;
  options.type = type;
  options.name = o.name;
  const HfConvertResult r = convert_hf_checkpoint(o.input, o.output, options);
  for (const auto& note : r.notes) fmt::print(stderr, "protokv: note: {}\n", note);
  const ModelConfig& c = r.config;
  fmt::print(
      "wrote {}: {} ({}) {}, dim {}, {} layers, {} heads ({} kv), vocab {}, {}, {} in "
      "{:.2f} s\n",
      o.output, c.architecture, r.hf_architecture, human_count(r.parameters), c.dim, c.n_layers,
      c.n_heads, c.n_kv_heads, c.vocab_size, dtype_name(type),
      format_bytes(static_cast<double>(std::filesystem::file_size(o.output))), timer.ms() / 1000.0);
}

void run_convert(const ConvertOptions& o) {
  const DType type = dtype_from_name(o.type);
  set_threads(o.threads);
  Timer timer;
  if (std::filesystem::is_directory(o.input)) {
    if (!is_hf_checkpoint(o.input)) {
      fail("{} is a folder without config.json: not a Hugging Face checkpoint", o.input);
    }
    run_convert_hf(o, type, timer);
    return;
  }
  const LoadedModel model = load_model(o.input, o.tokenizer);
  if (model.format == "llama2c" && !model.tokenizer) {
    fail("converting a llama2.c checkpoint needs its tokenizer.bin as the second argument");
  }
  GgufExportOptions export_options;
  export_options.type = type;
  export_options.name = o.name.empty() ? std::filesystem::path(o.input).stem().string() : o.name;
  const auto notes = export_gguf(model.weights, model.tokenizer.get(), o.output, export_options);
  for (const auto& note : notes) fmt::print(stderr, "protokv: note: {}\n", note);

  const ModelConfig& c = model.weights.config;
  fmt::print("wrote {}: {} {}, dim {}, {} layers, {} heads ({} kv), vocab {}, {}, {} in {:.2f} s\n",
             o.output, c.architecture, human_count(model.weights.parameter_count()), c.dim,
             c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, dtype_name(type),
             format_bytes(static_cast<double>(std::filesystem::file_size(o.output))),
             timer.ms() / 1000.0);
}

}  // namespace

void register_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  auto* cmd = app.add_subcommand(
      "convert",
      fmt::format(
          "Convert a llama2.c checkpoint (with its tokenizer.bin), a GGUF model, or a Hugging "
          "Face checkpoint folder ({}: config.json, model.safetensors or "
          "model.safetensors.index.json, tokenizer.json) to a GGUF file that llama.cpp also "
          "loads. Norm vectors stay f32; with q8_0, matrices whose rows are not a multiple of 32 "
          "are stored as f16 instead (listed on stderr), as llama.cpp does.",
          hf_class_names()));
  cmd->add_option("input", o->input,
                  "llama2.c checkpoint (.bin), GGUF model, or Hugging Face checkpoint folder")
      ->required();
  cmd->add_option("tokenizer", o->tokenizer,
                  "llama2.c tokenizer.bin (required for llama2.c checkpoints; replaces a GGUF "
                  "model's own tokenizer)");
  cmd->add_option("-o,--output", o->output, "GGUF file to write")->required();
  cmd->add_option("--type", o->type,
                  fmt::format("Type of the weight matrices: {} (q4_0/q4_K: a simple reference "
                              "quantiser, not llama-quantize's)",
                              dtype_names(/*writable_only=*/true)))
      ->capture_default_str();
  cmd->add_option("--name", o->name,
                  "general.name (default: the input file's stem or folder's name)");
  cmd->add_option("-t,--threads", o->threads, "Threads (0 = all cores)")->capture_default_str();
  cmd->callback([o] { run_convert(*o); });
}

}  // namespace protokv::cli
