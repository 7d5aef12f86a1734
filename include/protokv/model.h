#pragma once
// Model description and weights. Weights are immutable and shared by every Session; per-sequence
// state (KV cache, scratch) lives in Session.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/tensor.h"

namespace protokv {

struct ModelConfig {
  std::string architecture = "llama";
  int dim = 0;         // embedding width
  int hidden_dim = 0;  // FFN width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int vocab_size = 0;
  int context_length = 0;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool rope_neox = false;  // false: Meta order, rotate pairs (2i, 2i+1); true: (i, i + d/2)
  bool shared_classifier = false;

  int head_dim() const { return n_heads > 0 ? dim / n_heads : 0; }
  int group_size() const { return n_kv_heads > 0 ? n_heads / n_kv_heads : 0; }
  // Throws Error when shapes are absurd or inconsistent.
  void validate() const;
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  WeightMatrix wq;                   // [n_heads * head_dim, dim]
  WeightMatrix wk;                   // [n_kv_heads * head_dim, dim]
  WeightMatrix wv;                   // [n_kv_heads * head_dim, dim]
  WeightMatrix wo;                   // [dim, n_heads * head_dim]
  const float* bq = nullptr;         // optional biases (Qwen2)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* ffn_norm = nullptr;  // [dim]
  WeightMatrix w_gate;              // [hidden_dim, dim]  (llama2.c w1)
  WeightMatrix w_up;                // [hidden_dim, dim]  (llama2.c w3)
  WeightMatrix w_down;              // [dim, hidden_dim]  (llama2.c w2)
};

struct ModelWeights {
  ModelConfig config;
  WeightMatrix token_embd;             // [vocab, dim]
  const float* output_norm = nullptr;  // [dim]
  WeightMatrix output;                 // [vocab, dim]; same data as token_embd when shared
  std::vector<LayerWeights> layers;
  // Keeps the memory behind every pointer above alive (a mapped file and/or owned buffers).
  std::vector<std::shared_ptr<const void>> storage;

  size_t weight_bytes() const;
  int64_t parameter_count() const;
};

class Tokenizer;

struct LoadedModel {
  ModelWeights weights;
  std::shared_ptr<Tokenizer> tokenizer;  // may be null when the file carries none
  std::string format;                    // "gguf" or "llama2c"
  std::string path;
};

// Loads a GGUF file or a llama2.c checkpoint (detected by magic). `tokenizer_path` (optional)
// names a llama2.c tokenizer.bin; a GGUF file uses its own tokenizer unless one is given.
LoadedModel load_model(const std::string& path, const std::string& tokenizer_path = "");

}  // namespace protokv
