// SPDX-License-Identifier: Apache-2.0
#include "io/text_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "protokv/error.h"
#include "protokv/limits.h"

namespace protokv {

uintmax_t checked_text_file_size(const std::string& path) {
  std::error_code ec;
  PROTOKV_CHECK(std::filesystem::is_regular_file(path, ec), "file not found: {}", path);
  const uintmax_t size = std::filesystem::file_size(path, ec);
  PROTOKV_CHECK(!ec, "cannot read {}: {}", path, ec.message());
  PROTOKV_CHECK(size <= limits::kMaxTextFileBytes, "text file {} is {} bytes; the limit is {} MiB",
                path, size, limits::kMaxTextFileBytes >> 20);
  return size;
}

std::string read_text_file(const std::string& path) {
  checked_text_file_size(path);
  std::ifstream in(path, std::ios::binary);
  PROTOKV_CHECK(in.good(), "cannot read {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace protokv
