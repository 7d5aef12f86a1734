// SPDX-License-Identifier: Apache-2.0
#pragma once
// Format-specific loaders behind protokv::load_model (model/loader.cpp dispatches on magic).
#include <string>

#include "protokv/memory.h"
#include "protokv/model.h"

namespace protokv {

class GgufFile;

// GGUF with general.architecture "llama" (Llama 2/3, Mistral). Weights stay in the mapping.
// Refuses (Error) a model whose gguf_model_memory_bytes() is more than `available` (default: no
// limit; load_model() passes available_memory()).
LoadedModel load_gguf_model(const std::string& path, const AvailableMemory& available = {});
// Memory the model in `file` takes once loaded: its mapped tensors and the copies
// weights_from_gguf() makes of them.
uint64_t gguf_model_memory_bytes(const GgufFile& file);
// Builds weights from an already opened GGUF file (tests, convert round trips).
ModelWeights weights_from_gguf(const GgufFile& file);
// Gemma 3's hyper-parameters beyond the Llama block (its Architecture::read_gguf_config).
void read_gemma3_gguf_config(const GgufFile& file, ModelConfig& config);
// llama2.c legacy checkpoint: 7 int32 header, then F32 weights (mapped, not copied).
ModelWeights load_llama2c_model(const std::string& path);

}  // namespace protokv
