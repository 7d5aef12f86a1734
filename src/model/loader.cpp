// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/isa.h"
#include "model/loaders.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"

namespace protokv {

LoadedModel load_model(const std::string& path, const std::string& tokenizer_path) {
  return load_model(path, tokenizer_path, available_memory());
}

LoadedModel load_model(const std::string& path, const std::string& tokenizer_path,
                       const AvailableMemory& available) {
  kernels::active_isa();  // a bad PROTOKV_ISA fails with one clear error before any work
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail("model file not found: {}", path);
  char magic[4] = {0, 0, 0, 0};
  {
    std::ifstream in(path, std::ios::binary);
    in.read(magic, 4);
    if (in.gcount() != 4) fail("{}: file too short to be a model", path);
  }
  LoadedModel model;
  model.path = path;
  if (std::memcmp(magic, "GGUF", 4) == 0) {
    model = load_gguf_model(path, available);
  } else {
    // A llama2.c checkpoint is F32 weights after a small header, mapped as they are.
    const uintmax_t size = std::filesystem::file_size(path, ec);
    check_memory_fits(fmt::format("loading {}", path), ec ? 0 : size, available);
    model.weights = load_llama2c_model(path);
    model.format = "llama2c";
  }
  if (!tokenizer_path.empty()) {
    model.tokenizer = Tokenizer::load_llama2c(tokenizer_path, model.weights.config.vocab_size);
  }
  return model;
}

}  // namespace protokv
