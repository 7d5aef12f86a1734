// SPDX-License-Identifier: Apache-2.0
// `protokv info`: what a model file holds (shapes, types, sizes, tokenizer), as text or JSON.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/human_units.h"
#include "core/units.h"
#include "kernels/blas_core.h"
#include "kernels/isa.h"
#include "model/tensor_table.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/model.h"
#include "protokv/press_registry.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

struct InfoOptions {
  std::string model_path;
  std::string tokenizer_path;
  bool json = false;
  bool metadata = false;
};

// Tensor count per stored type: from the file's tensor list for GGUF (what is on disk), from
// the loaded weights otherwise.
std::map<std::string, int> tensor_type_counts(const LoadedModel& model, const GgufFile* gguf) {
  std::map<std::string, int> counts;
  if (gguf) {
    for (const auto& t : gguf->tensors()) ++counts[std::string(dtype_name(t.type))];
    return counts;
  }
  const ModelWeights& w = model.weights;
  for_each_tensor(w.config, w, [&](const TensorSlot<const ModelWeights>& t) {
    if (t.present()) ++counts[std::string(dtype_name(t.view().type))];
  });
  return counts;
}

// RoPE scaling in words: what the file carries, as llama.cpp applies it.
std::string rope_scaling_text(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  std::string text;
  if (c.rope_linear_factor != 1.0f) text = fmt::format("linear (factor {})", c.rope_linear_factor);
  if (c.rope_freq_factors && w.rope_freqs != nullptr) {
    const int pairs = c.rope_dims() / 2;
    float lo = w.rope_freqs[0], hi = w.rope_freqs[0];
    for (int i = 1; i < pairs; ++i) {
      lo = std::min(lo, w.rope_freqs[i]);
      hi = std::max(hi, w.rope_freqs[i]);
    }
    if (!text.empty()) text += " + ";
    text += fmt::format("llama3 frequency factors (rope_freqs.weight, {} pairs, {} to {})", pairs,
                        lo, hi);
  }
  return text.empty() ? "none" : text;
}

nlohmann::json describe(const InfoOptions& options) {
  const LoadedModel model = load_model(options.model_path, options.tokenizer_path);
  std::optional<GgufFile> gguf;
  if (model.format == "gguf") gguf = GgufFile::open(options.model_path);
  const ModelConfig& c = model.weights.config;

  // The shapes every command reports (cli_common), plus what only `info` shows.
  nlohmann::json j = model_json(model);
  j["path"] = options.model_path;
  j["file_bytes"] = std::filesystem::file_size(options.model_path);
  // Floats through their shortest decimal form, so 1e-5f prints as 1e-05.
  j["rope_theta"] = std::stod(fmt::format("{}", c.rope_theta));
  j["norm_eps"] = std::stod(fmt::format("{}", c.norm_eps));
  j["rope_neox"] = c.rope_neox;
  j["rope_type"] = c.rope_neox ? "neox" : "norm";  // llama.cpp's names
  j["n_rot"] = c.rope_dims();
  j["rope_scaling"] = rope_scaling_text(model.weights);
  j["shared_classifier"] = c.shared_classifier;
  j["ffn_activation"] = c.ffn_activation == FfnActivation::kGeluTanh ? "geglu" : "swiglu";
  if (c.has_local_layers()) {
    std::vector<int> local;
    for (int l = 0; l < c.n_layers; ++l)
      if (c.is_local_layer(l)) local.push_back(l);
    j["sliding_window"] = {{"window", c.sliding_window},
                           {"local_layers", local},
                           {"rope_theta_local", std::stod(fmt::format("{}", c.rope_theta_local))}};
  }
  if (c.final_logit_softcap > 0.0f) j["final_logit_softcap"] = c.final_logit_softcap;
  j["tensor_types"] = tensor_type_counts(model, gguf ? &*gguf : nullptr);
  if (model.tokenizer) {
    j["tokenizer"] = {{"vocab_size", model.tokenizer->vocab_size()},
                      {"bos_id", model.tokenizer->bos_id()},
                      {"eos_id", model.tokenizer->eos_id()},
                      {"unk_id", model.tokenizer->unk_id()}};
  } else {
    j["tokenizer"] = nullptr;
  }
  if (gguf) {
    j["gguf"] = {{"version", gguf->version()},
                 {"alignment", gguf->alignment()},
                 {"tensor_count", gguf->tensors().size()},
                 {"metadata_count", gguf->metadata().size()}};
    if (options.metadata) j["gguf"]["metadata"] = gguf->metadata_json();
  }
  // What this machine runs the model with, as llama.cpp's system_info line.
  j["kernels"] = kernels::isa_name(kernels::active_isa());
  j["openblas_core"] = kernels::blas_core().name;
  return j;
}

void print_text(const nlohmann::json& j) {
  auto row = [](std::string_view label, const std::string& value) {
    fmt::print("{:<14}{}\n", label, value);
  };
  auto str = [](const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_float()) return fmt::format("{}", v.get<double>());
    return v.dump();
  };
  row("path", str(j["path"]));
  std::string format = str(j["format"]);
  if (j.contains("gguf")) format += fmt::format(" v{}", j["gguf"]["version"].get<int>());
  row("format", fmt::format("{} ({})", format, format_bytes(j["file_bytes"].get<double>())));
  row("architecture", str(j["architecture"]));
  row("dim", str(j["dim"]));
  row("ffn dim", str(j["hidden_dim"]));
  row("layers", str(j["n_layers"]));
  row("heads", str(j["n_heads"]));
  row("kv heads", str(j["n_kv_heads"]));
  row("head dim", str(j["head_dim"]));
  row("vocab", str(j["vocab_size"]));
  row("context", str(j["context_length"]));
  row("rope theta", str(j["rope_theta"]));
  row("rope type",
      j["rope_neox"].get<bool>() ? "neox: pairs (i, i + n_rot/2)" : "norm: pairs (2i, 2i+1)");
  row("rope dims", fmt::format("{} of {}", j["n_rot"].get<int>(), j["head_dim"].get<int>()));
  row("rope scaling", str(j["rope_scaling"]));
  row("rms eps", str(j["norm_eps"]));
  row("classifier", j["shared_classifier"].get<bool>() ? "shared with token embedding" : "own");
  row("ffn", str(j["ffn_activation"]));
  if (j.contains("sliding_window")) {
    const auto& sw = j["sliding_window"];
    row("swa", fmt::format("{} tokens on {} of {} layers (local rope theta {})",
                           sw["window"].get<int>(), sw["local_layers"].size(),
                           j["n_layers"].get<int>(), str(sw["rope_theta_local"])));
  }
  if (j.contains("final_logit_softcap")) row("logit softcap", str(j["final_logit_softcap"]));
  std::string types;
  for (const auto& [name, count] : j["tensor_types"].items()) {
    types += fmt::format("{}{}: {}", types.empty() ? "" : ", ", name, count.get<int>());
  }
  row("tensor types", types);
  const auto params = j["parameters"].get<int64_t>();
  row("parameters", fmt::format("{} ({})", human_count(params), params));
  const auto bytes = j["weight_bytes"].get<uint64_t>();
  row("weight bytes", fmt::format("{} ({})", format_bytes(static_cast<double>(bytes)), bytes));
  const auto& tok = j["tokenizer"];
  row("tokenizer", tok.is_null()
                       ? "none"
                       : fmt::format("{} tokens (bos {}, eos {}, unk {})",
                                     tok["vocab_size"].get<int>(), tok["bos_id"].get<int>(),
                                     tok["eos_id"].get<int>(), tok["unk_id"].get<int>()));
  row("kernels", fmt::format("{} | OpenBLAS core {}", str(j["kernels"]), str(j["openblas_core"])));
  if (j.contains("gguf") && j["gguf"].contains("metadata")) {
    fmt::print("metadata:\n");
    for (const auto& [key, value] : j["gguf"]["metadata"].items()) {
      fmt::print("  {} = {}\n", key, value.dump());
    }
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  auto* cmd = app.add_subcommand(
      "info", "Show a model's architecture, shapes, tensor types, size and tokenizer");
  add_model_path_option(*cmd, options->model_path)->required();
  cmd->add_option("--tokenizer", options->tokenizer_path,
                  "llama2.c tokenizer.bin (llama2.c checkpoints carry none)");
  cmd->add_flag("--json", options->json, "Print one JSON object instead of text");
  cmd->add_flag("--metadata", options->metadata,
                "Also list the GGUF metadata (long arrays summarised)");
  cmd->callback([options] {
    const nlohmann::json j = describe(*options);
    if (options->json) {
      fmt::print("{}\n", j.dump(2));
    } else {
      print_text(j);
    }
  });

  // Hidden (no group): regenerates the press table of docs/methods.md, e.g.
  // protokv help-presses --markdown (tools/update_press_docs.sh splices it in).
  auto markdown = std::make_shared<bool>(false);
  auto* presses = app.add_subcommand("help-presses", "Print the press help")->group("");
  presses->add_flag("--markdown", *markdown, "as the Markdown table of docs/methods.md");
  presses->callback(
      [markdown] { fmt::print("{}", *markdown ? press_markdown_table() : press_help()); });
}

}  // namespace protokv::cli
