// Placeholder registration until the subcommand lands (skeleton commit only).
#include "cli/commands.h"
#include "protokv/error.h"

namespace protokv::cli {

void register_make_model(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-model", "(not yet available)");
  cmd->callback([] { fail("'make-model' is not available in this build yet"); });
}

}  // namespace protokv::cli
