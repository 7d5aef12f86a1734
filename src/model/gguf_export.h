// SPDX-License-Identifier: Apache-2.0
#pragma once
// Writing Llama-family models as GGUF files that protokv and llama.cpp both load: storage types,
// the llama.* / general.* metadata, and ModelWeights + Tokenizer -> file. The tensors come from
// the architecture's table (model/tensor_table.h).
#include <cstdint>
#include <string>
#include <vector>

#include "model/tensor_table.h"
#include "protokv/dtype.h"
#include "protokv/model.h"

namespace protokv {

class GgufWriter;
class Tokenizer;

// The type a tensor is stored as when `requested` is asked for. Norm vectors stay F32 (as in
// llama.cpp's converters); a matrix whose rows are not a multiple of the requested block size
// falls back to F16, as llama.cpp's quantizer does for incompatible tensors.
DType storage_type(const TensorSpec& spec, DType requested);

// One line per tensor of `config` that storage_type() stores other than `requested`.
std::vector<std::string> storage_notes(const ModelConfig& config, DType requested);

// The llama.* and general.* keys (architecture, name, alignment, file type, shapes, RoPE, eps).
void set_llama_metadata(GgufWriter& writer, const ModelConfig& config, DType requested,
                        const std::string& name);

// Bytes `config` takes when stored as `requested` (with the fallbacks of storage_type).
uint64_t llama_file_bytes(const ModelConfig& config, DType requested);

struct GgufExportOptions {
  DType type = DType::F32;  // requested type of the weight matrices
  std::string name = "protokv";
};

// Writes `weights` (any stored types; converted row by row) and `tokenizer` (may be null) to
// `path`: every tensor of the architecture's table that the model has, optional ones (biases)
// included, so nothing is lost on the way. Returns one human-readable note per tensor that fell
// back to another type.
std::vector<std::string> export_gguf(const ModelWeights& weights, const Tokenizer* tokenizer,
                                     const std::string& path, const GgufExportOptions& options);

}  // namespace protokv
