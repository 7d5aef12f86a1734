// `protokv demo`: the project's trained recall model answers one needle-in-a-haystack question with
// the full cache and with every registered press at two budgets (eval/demo.h); `--synthetic`: the
// older pipeline table on a random-weight model built in memory (needs no model file).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "eval/demo.h"
#include "eval/spec_list.h"
#include "protokv/error.h"
#include "protokv/threads.h"

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
  int64_t length = 2032;
  double depth = 50.0;
  uint64_t seed = 42;
  std::vector<std::string> presses;
  std::string budgets;
};

// The shipped model, as the README runs it (from the repository root) or, from elsewhere, beside
// the binary's build folder (build/protokv -> models/ of the same checkout).
std::string default_model_path() {
  if (fs::is_regular_file(kRecallModel)) return kRecallModel;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& dir : {exe.parent_path(), exe.parent_path().parent_path()}) {
      const fs::path candidate = dir / kRecallModel;
      if (fs::is_regular_file(candidate)) return candidate.string();
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
  eval::RecallDemoOptions options;
  options.model_path = args.model_path.empty() ? default_model_path() : args.model_path;
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
      "What a compressed KV cache still remembers: the shipped recall model "
      "(models/protokv-recall.gguf) reads a 2032-token prompt with one planted fact; the full "
      "cache "
      "and every registered press at budgets 32 and 128 entries per head answer its question; "
      "prints each answer with ✓/✗, KV bytes, compression and decode time, then the command for "
      "the NIAH heat maps. --synthetic: the pipeline on a random-weight model built in memory");
  cmd->add_option("-m,--model", args->model_path,
                  "recall model (default: models/protokv-recall.gguf of this checkout)");
  cmd->add_option("-t,--threads", args->threads, "threads (0: all cores)")->capture_default_str();
  cmd->add_option("--length", args->length, "prompt tokens")->capture_default_str();
  cmd->add_option("--depth", args->depth, "needle depth in percent of the haystack")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "seed of the planted key and value")->capture_default_str();
  cmd->add_flag("--json", args->json, "JSON on stdout instead of the table");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->add_option("--press", args->presses,
                  "override the presses (comma-separated specs; default: every registered press)");
  cmd->add_option("--budget", args->budgets,
                  "budgets in KV entries per head (comma-separated; default 32,128; --synthetic: "
                  "64,256)");
  cmd->add_flag("--synthetic", args->synthetic,
                "the fidelity table (KL, top-1) on a random-weight model and workload built in "
                "memory: needs no model file");
  // Small synthetic model and prompt for the test suite (fast under sanitizers); implies
  // --synthetic.
  cmd->add_flag("--tiny", args->tiny)->group("");
  cmd->callback([args] {
    set_threads(args->threads);
    if (args->synthetic || args->tiny) {
      PROTOKV_CHECK(args->model_path.empty(), "demo: --synthetic builds its own model; drop -m");
      run_synthetic(*args);
    } else {
      run_recall(*args);
    }
  });
}

}  // namespace protokv::cli
