// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where tools/fetch_models.sh puts the pretrained models it fetches (issue 21), found by the same
// rule as the script, so the binary and the script agree without configuration:
//   $PROTOKV_MODELS_DIR, else ${PROTOKV_CACHE:-$HOME/.cache/protokv}/models
// (a variable set to the empty string counts as unset, as bash's ${VAR:-default} does).
#include <filesystem>
#include <string_view>

namespace protokv::eval {

// The file names the script writes (tools/fetch_models.sh: SMOLLM2_FILE, GEMMA3_FILE).
inline constexpr std::string_view kSmollm2File = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr std::string_view kGemma3File = "gemma-3-270m-q4_k_m.gguf";

// The folder (it may not exist). Relative when HOME is unset and no variable names one.
std::filesystem::path fetched_models_dir();

// fetched_models_dir() / file, when that is a regular file; empty otherwise.
std::filesystem::path find_fetched_model(std::string_view file);

}  // namespace protokv::eval
