// SPDX-License-Identifier: Apache-2.0
#pragma once
// Hugging Face checkpoint folder (config.json, model.safetensors or a sharded
// model.safetensors.index.json, tokenizer.json, tokenizer_config.json) -> GGUF, written the way
// llama.cpp's convert_hf_to_gguf.py writes it so that llama.cpp loads the file too: its tensor
// names and keys, Llama's Q/K rows permuted back to the interleaved RoPE order, Llama 3's
// rope_freqs, the byte-level BPE vocabulary padded to the model's vocab_size.
#include <string>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/model.h"

namespace protokv {

struct HfConvertOptions {
  DType type = DType::F32;  // requested type of the weight matrices (see storage_type())
  std::string name;         // general.name; empty: the folder's name
};

struct HfConvertResult {
  std::string hf_architecture;     // config.json architectures[0]
  ModelConfig config;              // as written (architecture = the GGUF one)
  int64_t parameters = 0;          // elements of the tensors written
  std::vector<std::string> notes;  // tensors stored in another type than requested
};

// True when `path` is a folder holding config.json.
bool is_hf_checkpoint(const std::string& path);

// Converts the checkpoint in folder `dir` to the GGUF file `output`. Supports LlamaForCausalLM,
// MistralForCausalLM (GGUF arch llama), Qwen2ForCausalLM (qwen2) and Qwen3ForCausalLM (qwen3)
// with F32/F16/BF16 weights. Throws Error (one line) on anything missing, malformed or
// unsupported; every check runs before `output` is created.
HfConvertResult convert_hf_checkpoint(const std::string& dir, const std::string& output,
                                      const HfConvertOptions& options);

}  // namespace protokv
