// SPDX-License-Identifier: Apache-2.0
// protokv command-line entry: registers the subcommands and turns every error into one line on
// stderr and exit code 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <vector>

#include "cli/commands.h"
#include "kernels/blas_core.h"
#include "protokv/error.h"

int main(int argc, char** argv) {
  protokv::kernels::relaunch_with_better_blas_core(argv);  // OpenBLAS's kernels for this CPU
  CLI::App app{"protokv: long-context LLM inference with KV-cache compression"};
  app.require_subcommand(1);
  app.set_version_flag("--version", PROTOKV_VERSION);
  protokv::cli::register_all(app);
  // llama.cpp's multi-letter single-dash flags, which CLI11 cannot declare, as their long names.
  static constexpr const char* kLlamaCppAliases[][2] = {{"-ctk", "--cache-type-k"},
                                                        {"-ctv", "--cache-type-v"}};
  std::vector<char*> args(argv, argv + argc);
  for (char*& arg : args)
    for (const auto& [alias, name] : kLlamaCppAliases)
      if (std::strcmp(arg, alias) == 0) arg = const_cast<char*>(name);
  try {
    app.parse(argc, args.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version are ParseErrors with exit code 0: CLI11 prints them. A real parse
    // error (unknown flag, a value that does not convert or overflows) is one line, as ours.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "protokv: error: %s (see --help)\n", e.what());
    return 1;
  } catch (const protokv::Error& e) {
    std::fprintf(stderr, "protokv: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "protokv: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "protokv: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
