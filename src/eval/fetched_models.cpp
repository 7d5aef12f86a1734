// SPDX-License-Identifier: Apache-2.0
#include "eval/fetched_models.h"

#include <cstdlib>
#include <string>

namespace protokv::eval {
namespace {

// The variable's value, or nullptr when it is unset or empty.
const char* env_or_null(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

}  // namespace

std::filesystem::path fetched_models_dir() {
  if (const char* dir = env_or_null("PROTOKV_MODELS_DIR")) return dir;
  if (const char* cache = env_or_null("PROTOKV_CACHE"))
    return std::filesystem::path(cache) / "models";
  const char* home = env_or_null("HOME");
  return std::filesystem::path(home != nullptr ? home : ".") / ".cache" / "protokv" / "models";
}

std::filesystem::path find_fetched_model(std::string_view file) {
  std::filesystem::path path = fetched_models_dir() / std::string(file);
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) ? path : std::filesystem::path();
}

}  // namespace protokv::eval
