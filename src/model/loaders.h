#pragma once
// Format-specific loaders behind protokv::load_model (model/loader.cpp dispatches on magic).
#include <string>

#include "protokv/model.h"

namespace protokv {

class GgufFile;

// GGUF with general.architecture "llama" (Llama 2/3, Mistral). Weights stay in the mapping.
LoadedModel load_gguf_model(const std::string& path);
// Builds weights from an already opened GGUF file (tests, convert round trips).
ModelWeights weights_from_gguf(const GgufFile& file);
// llama2.c legacy checkpoint: 7 int32 header, then F32 weights (mapped, not copied).
ModelWeights load_llama2c_model(const std::string& path);

}  // namespace protokv
