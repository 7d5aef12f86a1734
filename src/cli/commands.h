// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <CLI/CLI.hpp>

namespace protokv::cli {

// Each subcommand lives in its own cmd_*.cpp and registers itself here.
void register_generate(CLI::App& app);
void register_info(CLI::App& app);
void register_convert(CLI::App& app);
void register_make_model(CLI::App& app);
void register_bench(CLI::App& app);
// `bench compress`, added to the `bench` subcommand by register_bench.
void register_bench_compress(CLI::App& bench);
void register_eval(CLI::App& app);
// `eval niah|ruler|longbench`, added to the `eval` subcommand by register_eval.
void register_eval_longctx(CLI::App& eval);
void register_demo(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_calibrate(CLI::App& app);
void register_serve(CLI::App& app);

inline void register_all(CLI::App& app) {
  register_generate(app);
  register_info(app);
  register_convert(app);
  register_make_model(app);
  register_bench(app);
  register_eval(app);
  register_demo(app);
  register_tokenize(app);
  register_perplexity(app);
  register_calibrate(app);
  register_serve(app);
}

}  // namespace protokv::cli
