// SPDX-License-Identifier: Apache-2.0
#pragma once
// Random-weight llama / qwen2 / qwen3 models of any shape, for tests, demos and benchmarks: written
// as standard GGUF files (loadable by llama.cpp too) or built in memory. The same (config, seed)
// gives the same values either way, whatever the thread count.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf_export.h"
#include "protokv/dtype.h"
#include "protokv/limits.h"
#include "protokv/model.h"

namespace protokv {

class Tokenizer;

struct RandomModelOptions {
  ModelConfig config;  // any registered architecture; shared_classifier, rope_freq_factors honoured
  DType type = DType::F32;
  uint64_t seed = 0;
  std::string name = "protokv-random";
};

// The smallest vocabulary with the control and byte tokens: <unk>, <s>, </s>, <0x00>..<0xFF>.
inline constexpr int kMinSyntheticVocab = 3 + 256;
using limits::kMaxRandomModelBytes;

// Throws Error (one line) on any bad shape, a vocabulary below kMinSyntheticVocab, or a model
// larger than kMaxRandomModelBytes.
void validate_random_model(const RandomModelOptions& options);

// A SentencePiece-style vocabulary that encodes any text: ids 0..2 = <unk>, <s>, </s> (types
// unknown, control, control), then the 256 byte tokens (type byte), then normal pieces
// ("▁", printable ASCII, "▁"+character, letter bigrams, "▁"+bigram, "▁"+common English word, ...)
// with decreasing scores. bos = 1, eos = 2, unk = 0.
struct SyntheticVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
};
SyntheticVocab synthetic_vocab(int vocab_size);
std::shared_ptr<Tokenizer> synthetic_tokenizer(int vocab_size);

// Llama 3.x "llama3" RoPE scaling parameters (HF rope_scaling). GGUF files carry only the
// per-pair factors they produce (rope_freqs.weight).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_context = 8192.0;
};
inline constexpr Llama3RopeScaling kLlama31Rope{};  // Llama 3.1's values
// The rope_dims / 2 divisors of the pair frequencies that llama.cpp's converter writes as
// rope_freqs.weight.
std::vector<float> llama3_rope_freq_factors(int rope_dims, float theta,
                                            const Llama3RopeScaling& scaling);

// Values of rows [row_begin, row_end) of `spec` as F32 into `out` ([rows, spec.cols]).
// Matrices ~ zero-mean, approximately normal (Irwin-Hall sum of 4 uniforms) with standard
// deviation 1/sqrt(cols); the residual-branch outputs (attn_output, ffn_down) are further scaled
// by 1/sqrt(2 n_layers) as in GPT-2 so the residual stream stays O(1); token embeddings have
// standard deviation 1; norm weights are 1 (q/k norms 1 + 0.25 normal); biases have standard
// deviation 0.5; rope_freqs.weight holds Llama 3.1's llama3 factors (make-model's only llama3
// setting).
void random_tensor_rows(const TensorSpec& spec, const ModelConfig& config, uint64_t seed,
                        int64_t row_begin, int64_t row_end, float* out);

// Writes the model (with the synthetic tokenizer) as GGUF, streaming one tensor at a time.
// Returns notes about tensors stored in another type (see storage_type()).
std::vector<std::string> write_random_model(const RandomModelOptions& options,
                                            const std::string& path);

// The same model in memory, every tensor F32 (owned by ModelWeights::storage): the one builder of
// random and synthetic models (tests and eval::make_synthetic_model start from it). Needs no
// tokenizer, so any vocabulary size the config allows.
struct RandomWeightsOptions {
  bool with_optional = false;  // also the optional tensors (q/k/v biases), as TensorInit says
  // Norm weights 1 + norm_jitter * N(0, 1) instead of ones, so that a norm weight applied to the
  // wrong place changes the output (tests).
  float norm_jitter = 0.0f;
};
ModelWeights random_model_weights(const ModelConfig& config, uint64_t seed,
                                  const RandomWeightsOptions& options = {});

}  // namespace protokv
