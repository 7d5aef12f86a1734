#pragma once
// Writing Llama-family models as GGUF files that protokv and llama.cpp both load: the tensor
// list of a config, the llama.* / general.* metadata, and ModelWeights + Tokenizer -> file.
#include <cstdint>
#include <string>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/model.h"

namespace protokv {

class GgufWriter;
class Tokenizer;

enum class LlamaTensor {
  kTokenEmbd,
  kOutputNorm,
  kOutput,
  kAttnNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kFfnNorm,
  kFfnGate,
  kFfnUp,
  kFfnDown,
};

// One tensor of a Llama model: `rows` x `cols` (GGUF dims {cols, rows}); vectors have rows == 1
// and are stored with dims {cols}.
struct LlamaTensorSpec {
  LlamaTensor kind;
  int layer = -1;  // -1 for the tensors outside the blocks
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  bool is_vector() const {
    return kind == LlamaTensor::kOutputNorm || kind == LlamaTensor::kAttnNorm ||
           kind == LlamaTensor::kFfnNorm;
  }
};

// Every tensor of `config` in file order (output.weight omitted when the classifier is shared).
std::vector<LlamaTensorSpec> llama_tensor_specs(const ModelConfig& config);

// The tensor `spec` names inside `weights` (vectors as one F32 row).
WeightMatrix llama_tensor_view(const ModelWeights& weights, const LlamaTensorSpec& spec);

// The type a tensor is stored as when `requested` is asked for. Norm vectors stay F32 (as in
// llama.cpp's converters); a matrix whose rows are not a multiple of the requested block size
// falls back to F16, as llama.cpp's quantizer does for incompatible tensors.
DType storage_type(const LlamaTensorSpec& spec, DType requested);

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
// `path`. Returns one human-readable note per tensor that fell back to another type.
std::vector<std::string> export_gguf(const ModelWeights& weights, const Tokenizer* tokenizer,
                                     const std::string& path, const GgufExportOptions& options);

}  // namespace protokv
