// SPDX-License-Identifier: Apache-2.0
#pragma once
// Model description and weights. Weights are immutable and shared by every Session; per-sequence
// state (KV cache, scratch) lives in Session.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/kv_cache.h"
#include "protokv/tensor.h"

namespace protokv {

enum class FfnActivation : uint8_t {
  kSilu,      // SwiGLU: silu(gate) * up
  kGeluTanh,  // GeGLU: gelu_tanh(gate) * up, rounded through F16 as ggml's CPU backend does
};

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
  bool rope_neox = false;  // false: Meta order, rotate pairs (2i, 2i+1); true: (i, i + n_rot/2)
  bool shared_classifier = false;
  // Per-head width of q, k and v (GGUF "<arch>.attention.key_length"); 0: dim / n_heads. Qwen3
  // models have heads wider or narrower than dim / n_heads.
  int explicit_head_dim = 0;
  // Dimensions of each head that RoPE rotates (GGUF "<arch>.rope.dimension_count"), the first
  // n_rot; the rest pass through. 0: the whole head.
  int n_rot = 0;
  // Linear RoPE scaling (GGUF rope.scaling.type "linear"): positions are divided by this factor
  // (ggml's freq_scale = 1 / factor). 1: none.
  float rope_linear_factor = 1.0f;
  // The model carries rope_freqs.weight ([n_rot / 2] divisors of the pair frequencies, as
  // llama.cpp's converter writes them for Llama 3.x "llama3" RoPE scaling).
  bool rope_freq_factors = false;

  // --- Gemma 3 (llama.cpp src/models/gemma3.cpp) ---
  // Token embeddings are multiplied by this (Gemma: sqrt(dim)).
  float embedding_scale = 1.0f;
  // The gated FFN's activation: SwiGLU (Llama, Qwen) or GeGLU with tanh-approximated GELU (Gemma).
  FfnActivation ffn_activation = FfnActivation::kSilu;
  // Sliding-window (local) attention: local_layers[l] != 0 marks a layer whose queries attend to
  // the last `sliding_window` positions only (their own included); such a layer's cache keeps
  // only those (DESIGN §3.4). Empty: every layer is global.
  int sliding_window = 0;
  std::vector<uint8_t> local_layers;  // [n_layers] or empty
  float rope_theta_local = 10000.0f;  // RoPE base of the local layers (GGUF rope.freq_base_swa)
  // > 0: logits = c * tanh(logits / c) (GGUF final_logit_softcapping).
  float final_logit_softcap = 0.0f;
  // Query scale before attention; 0: 1 / sqrt(head_dim). Gemma 3 27B uses 1 / sqrt(dim / n_heads).
  float attention_scale = 0.0f;

  bool is_local_layer(int layer) const {
    return !local_layers.empty() && local_layers[static_cast<size_t>(layer)] != 0;
  }
  bool has_local_layers() const;

  int head_dim() const {
    if (explicit_head_dim > 0) return explicit_head_dim;
    return n_heads > 0 ? dim / n_heads : 0;
  }
  int rope_dims() const { return n_rot > 0 ? n_rot : head_dim(); }
  int group_size() const { return n_kv_heads > 0 ? n_heads / n_kv_heads : 0; }
  // Throws Error when shapes are absurd or inconsistent.
  void validate() const;
};

// Bytes of keys + values a full (uncompressed) cache holds for `tokens` positions, as
// KvCache::kv_bytes() counts them (no positions or log-weights): what a memory share is a share
// of (--kv-memory-share) and what a server response reports as kv_bytes_full. In `type`'s rows.
size_t full_kv_bytes(const ModelConfig& config, int64_t tokens, KvCacheType type = {});
// Bytes of KV cache for `tokens` tokens in every layer (a sliding-window layer holds at most its
// window): full_kv_bytes plus each entry's position and log-weight, per KV head.
uint64_t kv_cache_bytes(const ModelConfig& config, int64_t tokens, KvCacheType type = {});

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  WeightMatrix wq;                   // [n_heads * head_dim, dim]
  WeightMatrix wk;                   // [n_kv_heads * head_dim, dim]
  WeightMatrix wv;                   // [n_kv_heads * head_dim, dim]
  WeightMatrix wo;                   // [dim, n_heads * head_dim]
  const float* bq = nullptr;         // optional biases (Qwen2)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* attn_q_norm = nullptr;  // optional per-head RMSNorm weights [head_dim] (Qwen3)
  const float* attn_k_norm = nullptr;
  const float* attn_post_norm = nullptr;  // optional RMSNorm of the attention output (Gemma 3)
  const float* ffn_norm = nullptr;        // [dim]
  const float* ffn_post_norm = nullptr;   // optional RMSNorm of the FFN output (Gemma 3)
  WeightMatrix w_gate;                    // [hidden_dim, dim]  (llama2.c w1)
  WeightMatrix w_up;                      // [hidden_dim, dim]  (llama2.c w3)
  WeightMatrix w_down;                    // [dim, hidden_dim]  (llama2.c w2)
};

struct ModelWeights {
  ModelConfig config;
  WeightMatrix token_embd;             // [vocab, dim]
  const float* output_norm = nullptr;  // [dim]
  WeightMatrix output;                 // [vocab, dim]; same data as token_embd when shared
  const float* rope_freqs = nullptr;   // [n_rot / 2] when config.rope_freq_factors (Llama 3.x)
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
// The same, refusing (one Error line) a model whose estimated memory is more than `available`:
// its weights (memory-mapped, but read in full for every token, so a model larger than memory
// would page from disk at every step) and the copies loading makes (norm vectors stored in a
// type other than F32, tensors the file does not align for their type). load_model() passes
// available_memory() (protokv/memory.h).
struct AvailableMemory;
LoadedModel load_model(const std::string& path, const std::string& tokenizer_path,
                       const AvailableMemory& available);

}  // namespace protokv
