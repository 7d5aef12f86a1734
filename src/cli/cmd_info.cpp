// Placeholder registration until the subcommand lands (skeleton commit only).
#include "cli/commands.h"
#include "protokv/error.h"

namespace protokv::cli {

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "(not yet available)");
  cmd->callback([] { fail("'info' is not available in this build yet"); });
}

}  // namespace protokv::cli
