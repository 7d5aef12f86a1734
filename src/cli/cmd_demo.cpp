// SPDX-License-Identifier: Apache-2.0
// `protokv demo`: a model answers one planted-fact question with the full cache and with presses at
// small budgets (eval/demo.h): SmolLM2-135M-Instruct through its chat template when
// tools/fetch_models.sh has fetched it, else the project's trained recall model in `eval niah`'s
// layout; `--synthetic`: the older pipeline table on a random-weight model built in memory (needs
// no model file).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "eval/demo.h"
#include "eval/spec_list.h"
#include "protokv/error.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRecallModel = "models/protokv-recall.gguf";

struct DemoArgs {
  int threads = 0;
  bool json = false;
  bool quiet = false;
  bool synthetic = false;
  bool tiny = false;
  std::string model_path;
  std::string chat_template;
  int64_t length = 0;
  double depth = 50.0;
  uint64_t seed = 42;
  std::vector<std::string> presses;
  std::string budgets;
};

// The shipped model, as the README runs it (from the repository root) or, from any other folder,
// found from the binary: beside its build folder (build/protokv -> models/ of the same checkout),
// or where `cmake --install` put it (PREFIX/bin/protokv -> PREFIX/share/protokv/models/).
std::string default_model_path() {
  if (fs::is_regular_file(kRecallModel)) return kRecallModel;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bin = exe.parent_path();
    for (const fs::path& candidate :
         {bin / kRecallModel, bin.parent_path() / kRecallModel,
          bin.parent_path() / PROTOKV_INSTALL_DATADIR / "protokv" / kRecallModel}) {
      if (fs::is_regular_file(candidate)) return candidate.lexically_normal().string();
    }
  }
  return kRecallModel;  // not found: run_recall_demo reports it
}

void run_synthetic(const DemoArgs& args) {
  eval::DemoOptions options;
  options.tiny = args.tiny;
  options.progress = !args.quiet;
  if (!args.presses.empty()) options.presses = eval::split_press_specs(args.presses);
  if (!args.budgets.empty()) options.budgets = eval::parse_positive_list(args.budgets, "--budget");
  const eval::DemoReport report = eval::run_demo(options);
  if (args.json) {
    std::printf("%s\n", eval::demo_json(report).dump(2).c_str());
  } else {
    std::printf("%s", eval::render_demo(report).c_str());
  }
}

void run_recall(const DemoArgs& args) {
  if (!args.chat_template.empty() && args.chat_template != "none") {
    try {  // checked before the model loads; the library's error names the known families
      chat_template_from_name(args.chat_template);
    } catch (const Error& e) {
      fail("--chat-template: {}", e.what());
    }
  }
  eval::RecallDemoOptions options;
  const eval::DemoModelChoice choice =
      eval::choose_demo_model(args.model_path, default_model_path());
  options.model_path = choice.path;
  options.model_choice = choice.reason;
  options.chat_template = args.chat_template;
  options.length = args.length;
  options.depth = args.depth;
  options.seed = args.seed;
  options.progress = !args.quiet;
  if (!args.presses.empty()) options.presses = eval::split_press_specs(args.presses);
  if (!args.budgets.empty()) options.budgets = eval::parse_positive_list(args.budgets, "--budget");
  const eval::RecallDemoReport report = eval::run_recall_demo(options);
  if (args.json) {
    std::printf("%s\n", eval::recall_demo_json(report).dump(2).c_str());
  } else {
    std::printf("%s", eval::render_recall_demo(report).c_str());
  }
}

}  // namespace

void register_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  auto* cmd = app.add_subcommand(
      "demo",
      "What a compressed KV cache still remembers: a model reads a long prompt with one planted "
      "fact, and the full cache and presses at small budgets answer its question; prints each "
      "answer with ✓/✗, KV bytes, compression and decode time, then the command for the NIAH heat "
      "maps. The model: SmolLM2-135M-Instruct when tools/fetch_models.sh has fetched it (a "
      "1024-token chat prompt, a story with the fact inside; full, streaming_llm, h2o, snapkv, "
      "protokv at 128 entries per head), else the shipped recall model models/protokv-recall.gguf "
      "(2032 tokens in `eval niah`'s layout; every registered press at 32 and 128); the first "
      "lines say which and why. --synthetic: the pipeline on a random-weight model built in "
      "memory");
  cmd->add_option("-m,--model", args->model_path,
                  "model (default: SmolLM2-135M-Instruct from tools/fetch_models.sh's folder, "
                  "$PROTOKV_MODELS_DIR or ${PROTOKV_CACHE:-~/.cache/protokv}/models, when "
                  "present; else models/protokv-recall.gguf of this checkout)");
  cmd->add_option("--chat-template", args->chat_template,
                  "ask through this chat template family (chatml, llama3, ...), or 'none' for "
                  "`eval niah`'s plain layout (default: the model's own template when it has "
                  "one, else the plain layout)");
  cmd->add_option("-t,--threads", args->threads, "threads (0: all cores)")->capture_default_str();
  cmd->add_option("--length", args->length,
                  "prompt tokens (0: 1024 with a chat template, 2032 in the plain layout)")
      ->capture_default_str();
  cmd->add_option("--depth", args->depth, "needle depth in percent of the haystack")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "seed of the planted key and value")->capture_default_str();
  cmd->add_flag("--json", args->json, "JSON on stdout instead of the table");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->add_option("--press", args->presses,
                  "override the presses (comma-separated specs; default: every registered press "
                  "in the plain layout, streaming_llm,h2o,snapkv,protokv with a chat template)");
  cmd->add_option("--budget", args->budgets,
                  "budgets in KV entries per head (comma-separated; default 32,128 in the plain "
                  "layout, 128 with a chat template; --synthetic: 64,256)");
  cmd->add_flag("--synthetic", args->synthetic,
                "the fidelity table (KL, top-1) on a random-weight model and workload built in "
                "memory: needs no model file");
  // Small synthetic model and prompt for the test suite (fast under sanitizers); implies
  // --synthetic.
  cmd->add_flag("--tiny", args->tiny)->group("");
  cmd->callback([args] {
    set_threads(args->threads);
    if (args->synthetic || args->tiny) {
      PROTOKV_CHECK(args->model_path.empty() && args->chat_template.empty(),
                    "demo: --synthetic builds its own model; drop -m and --chat-template");
      run_synthetic(*args);
    } else {
      run_recall(*args);
    }
  });
}

}  // namespace protokv::cli
