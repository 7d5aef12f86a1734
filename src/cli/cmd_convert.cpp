// Placeholder registration until the subcommand lands (skeleton commit only).
#include "cli/commands.h"
#include "protokv/error.h"

namespace protokv::cli {

void register_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "(not yet available)");
  cmd->callback([] { fail("'convert' is not available in this build yet"); });
}

}  // namespace protokv::cli
