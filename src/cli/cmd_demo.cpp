// `protokv demo`: prefill, compression by several presses, decode and one comparison table on a
// SYNTHETIC model and workload built in memory (works on a fresh machine, nothing downloaded).
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "eval/demo.h"
#include "eval/spec_list.h"
#include "protokv/threads.h"

namespace protokv::cli {
namespace {

struct DemoArgs {
  int threads = 0;
  bool json = false;
  bool quiet = false;
  bool tiny = false;
  std::vector<std::string> presses;
  std::string budgets;
};

}  // namespace

void register_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  auto* cmd = app.add_subcommand(
      "demo",
      "Run the whole pipeline on a built-in SYNTHETIC model and workload (random weights, "
      "generated in memory): prefill a ~1024-token prompt, compress it with full, streaming_llm, "
      "h2o, snapkv, pyramidkv and protokv at budgets 64 and 256, decode a teacher-forced "
      "continuation of 32 tokens, and print one comparison table");
  cmd->add_option("-t,--threads", args->threads, "threads (0: all cores)")->capture_default_str();
  cmd->add_flag("--json", args->json, "JSON on stdout instead of the table");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->add_option("--press", args->presses, "override the presses (comma-separated specs)");
  cmd->add_option("--budget", args->budgets, "override the budgets (comma-separated)");
  // Small model and prompt for the test suite (fast under sanitizers).
  cmd->add_flag("--tiny", args->tiny)->group("");
  cmd->callback([args] {
    set_threads(args->threads);
    eval::DemoOptions options;
    options.tiny = args->tiny;
    options.progress = !args->quiet;
    if (!args->presses.empty()) options.presses = eval::split_press_specs(args->presses);
    if (!args->budgets.empty())
      options.budgets = eval::parse_positive_list(args->budgets, "--budget");
    const eval::DemoReport report = eval::run_demo(options);
    if (args->json) {
      std::printf("%s\n", eval::demo_json(report).dump(2).c_str());
    } else {
      std::printf("%s", eval::render_demo(report).c_str());
    }
  });
}

}  // namespace protokv::cli
