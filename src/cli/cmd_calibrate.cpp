// SPDX-License-Identifier: Apache-2.0
// `protokv calibrate`: runs calibration text through the full cache and writes a model's profile
// for chelsea (outlier heads) and pod (layer blocks per KV head); see eval/calibration.h.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "eval/calibration.h"
#include "eval/fidelity.h"
#include "press/calibration_profile.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/limits.h"
#include "protokv/model.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

constexpr int64_t kDefaultTokens = 1024;  // capped by the model's context
constexpr int64_t kMaxSamples = limits::kMaxCalibrationSamples;

struct CalibrateArgs {
  ModelOptions model;
  std::string text_file;
  int64_t samples = 4;
  int64_t tokens = 0;  // 0: min(kDefaultTokens, context)
  uint64_t seed = 42;
  std::string output;
  eval::CalibrationOptions options;
  bool quiet = false;
};

// The model's general.name (GGUF), else its architecture.
std::string model_name(const LoadedModel& loaded) {
  if (loaded.format == "gguf") {
    if (auto name = GgufFile::open(loaded.path).get_string("general.name"); name && !name->empty())
      return *name;
  }
  return loaded.weights.config.architecture;
}

void run_calibrate(const CalibrateArgs& a) {
  // Option errors before the (possibly slow) model load.
  PROTOKV_CHECK(a.samples >= 1 && a.samples <= kMaxSamples, "--samples must be in [1, {}], got {}",
                kMaxSamples, a.samples);
  PROTOKV_CHECK(a.tokens >= 0, "--tokens must be positive, got {}", a.tokens);
  eval::validate_calibration_options(a.options);
  const press::ChelseaLayout& layout = a.options.chelsea_layout;
  // Chelsea needs at least one A/B pair between its sinks and its recent window.
  const int64_t min_tokens = std::max(layout.sinks + layout.recent + 2, a.options.pod_rows + 1);
  PROTOKV_CHECK(a.tokens == 0 || a.tokens >= min_tokens,
                "--tokens {} is too short: chelsea matches between its {} sinks and {} recent "
                "tokens and pod compares the last --pod-rows {} queries; give at least {}",
                a.tokens, layout.sinks, layout.recent, a.options.pod_rows, min_tokens);
  const std::string text = a.text_file.empty() ? std::string() : read_text_file(a.text_file);
  PROTOKV_CHECK(a.text_file.empty() || !text.empty(), "the text file {} is empty", a.text_file);
  const std::string output =
      !a.output.empty()
          ? a.output
          : std::filesystem::path(a.model.model_path).stem().string() + ".calibration.json";
  const std::filesystem::path output_dir = std::filesystem::path(output).parent_path();
  PROTOKV_CHECK(output_dir.empty() || std::filesystem::is_directory(output_dir),
                "cannot write the calibration profile {}: no directory {}", output,
                output_dir.string());

  const LoadedModel loaded = load_model_from_options(a.model, !a.text_file.empty());
  const ModelConfig& config = loaded.weights.config;
  const int64_t tokens =
      a.tokens > 0 ? a.tokens : std::min<int64_t>(kDefaultTokens, config.context_length);
  PROTOKV_CHECK(tokens <= config.context_length,
                "--tokens {} exceeds the model's context of {} tokens", tokens,
                config.context_length);
  PROTOKV_CHECK(tokens >= min_tokens,
                "the model's context of {} tokens is too short to calibrate (at least {} needed)",
                config.context_length, min_tokens);

  std::vector<eval::FidelitySample> samples;
  press::CalibrationProfile identity;
  if (!a.text_file.empty()) {
    const auto text_tokens = static_cast<int64_t>(loaded.tokenizer->encode(text, false).size());
    PROTOKV_CHECK(text_tokens >= tokens - 1,
                  "-f {}: the text has {} tokens; samples of --tokens {} need {} (BOS is added)",
                  a.text_file, text_tokens, tokens, tokens - 1);
    samples = eval::samples_from_text(*loaded.tokenizer, text, tokens, /*continuation=*/0,
                                      static_cast<int>(a.samples));
    identity.source_kind = "file";
    identity.source_name = std::filesystem::path(a.text_file).filename().string();
  } else {
    // llama convention when the model carries no tokenizer: BOS 1, EOS 2.
    const int32_t bos = loaded.tokenizer ? loaded.tokenizer->bos_id() : 1;
    const int32_t eos = loaded.tokenizer ? loaded.tokenizer->eos_id() : 2;
    samples = eval::samples_from_model(loaded.weights, bos, eos, tokens, /*continuation=*/0,
                                       static_cast<int>(a.samples), a.seed);
    identity.source_kind = "model";
    identity.source_name = fmt::format(
        "the model's own text: sampled from BOS at temperature 1, full cache, seeds {}..{}", a.seed,
        a.seed + static_cast<uint64_t>(a.samples) - 1);
  }
  std::vector<std::vector<int32_t>> sequences;
  sequences.reserve(samples.size());
  for (auto& s : samples) sequences.push_back(std::move(s.prompt));

  if (!a.quiet) {
    fmt::print("calibrating {} ({} layers, {} KV heads) on {} sample(s) of {} tokens from {}\n",
               loaded.path, config.n_layers, config.n_kv_heads, sequences.size(), tokens,
               identity.source_kind == "file" ? a.text_file : identity.source_name);
    std::fflush(stdout);
  }
  press::CalibrationProfile profile = eval::calibrate(loaded.weights, sequences, a.options);
  profile.model_file = std::filesystem::path(loaded.path).filename().string();
  profile.model_name = model_name(loaded);
  profile.source_kind = identity.source_kind;
  profile.source_name = identity.source_name;
  press::write_calibration_profile(profile, output);
  if (!a.quiet) fmt::print("{}wrote {}\n", eval::calibration_summary(profile), output);
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto args = std::make_shared<CalibrateArgs>();
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Run calibration text through the FULL cache and write the model's profile for chelsea and "
      "pod (use it with profile=FILE). Each sample of --tokens T tokens is prefilled up to its "
      "last --pod-rows R tokens, which are decoded one at a time to capture every query head's "
      "attention rows; the keys come from the full cache. Chelsea: per (layer, KV head) the share "
      "of A tokens whose best soft-matching link (16 sinks, 64 recent, chunks of 256) has cosine "
      "< --chelsea-threshold; the top --outlier-fraction of heads are outliers (keep the full "
      "cache). PoD: per KV head, layer similarity = 1 - JS divergence (bits) of the R attention "
      "rows, the mean over the KV head's query heads and the samples; blocks by greedy "
      "bottom-up grouping at --pod-delta (PoD Algorithm 1). Text: -f FILE (samples cut at "
      "evenly spread offsets), else the model's own text sampled from BOS (temperature 1, "
      "--seed; slow on large models: prefer -f).");
  add_model_options(*cmd, args->model);
  cmd->add_option("-f,--file", args->text_file, "UTF-8 calibration text (needs a tokenizer)");
  cmd->add_option("--samples", args->samples, "calibration sequences")->capture_default_str();
  cmd->add_option(
      "--tokens", args->tokens,
      fmt::format("tokens per sequence, BOS included (default: min({}, context))", kDefaultTokens));
  cmd->add_option("--seed", args->seed, "seed of the model-sampled text (without -f)")
      ->capture_default_str();
  cmd->add_option("-o,--output", args->output,
                  "profile file (default: MODEL_STEM.calibration.json in the current directory)");
  cmd->add_option("--chelsea-threshold", args->options.chelsea_threshold,
                  "cosine similarity a link needs (Chelsea §5)")
      ->capture_default_str();
  cmd->add_option("--outlier-fraction", args->options.outlier_fraction,
                  "share of (layer, KV head) pairs kept full by chelsea")
      ->capture_default_str();
  cmd->add_option("--pod-delta", args->options.pod_delta,
                  "similarity a layer needs with every layer of a block to join it")
      ->capture_default_str();
  cmd->add_option("--pod-rows", args->options.pod_rows,
                  "last queries whose attention rows are compared across layers")
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "print nothing but errors");
  cmd->callback([args] { run_calibrate(*args); });
}

}  // namespace protokv::cli
