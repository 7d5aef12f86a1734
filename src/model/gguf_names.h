// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one table of GGUF model metadata keys and tensor names protokv reads and writes, so that
// the model loader and the exporters hold no raw strings (the container's own keys, such as the
// alignment, belong to the GGUF layer: protokv/gguf.h). Names follow llama.cpp's
// gguf-py constants so files we write load there and files it writes load here.
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace protokv::gguf_names {

// --- general.* --------------------------------------------------------------------------------
inline constexpr std::string_view kArchitecture = "general.architecture";
inline constexpr std::string_view kName = "general.name";
inline constexpr std::string_view kFileType = "general.file_type";
inline constexpr std::string_view kQuantizationVersion = "general.quantization_version";
// ggml's current quantisation format version (written with quantised files, as llama.cpp does).
inline constexpr uint32_t kQuantizationVersionValue = 2;

// general.file_type's llama_ftype values are DTypeTraits::file_type (protokv/dtype.h).

// --- architectures ----------------------------------------------------------------------------
inline constexpr std::string_view kArchLlama = "llama";
inline constexpr std::string_view kArchQwen2 = "qwen2";
inline constexpr std::string_view kArchQwen3 = "qwen3";
inline constexpr std::string_view kArchGemma3 = "gemma3";

// --- per-architecture hyper-parameters: "<arch>.<suffix>" -------------------------------------
inline constexpr std::string_view kContextLength = "context_length";
inline constexpr std::string_view kEmbeddingLength = "embedding_length";
inline constexpr std::string_view kBlockCount = "block_count";
inline constexpr std::string_view kFeedForwardLength = "feed_forward_length";
inline constexpr std::string_view kHeadCount = "attention.head_count";
inline constexpr std::string_view kHeadCountKv = "attention.head_count_kv";
inline constexpr std::string_view kRmsNormEps = "attention.layer_norm_rms_epsilon";
inline constexpr std::string_view kRopeFreqBase = "rope.freq_base";
inline constexpr std::string_view kRopeDimensionCount = "rope.dimension_count";
inline constexpr std::string_view kKeyLength = "attention.key_length";
inline constexpr std::string_view kValueLength = "attention.value_length";
inline constexpr std::string_view kRopeScalingType = "rope.scaling.type";
inline constexpr std::string_view kRopeScalingFactor = "rope.scaling.factor";
inline constexpr std::string_view kRopeScaleLinear = "rope.scale_linear";  // older files
inline constexpr std::string_view kRopeScalingAttnFactor = "rope.scaling.attn_factor";
inline constexpr std::string_view kRopeScalingOrigContext = "rope.scaling.original_context_length";
inline constexpr std::string_view kVocabSize = "vocab_size";
// Sliding-window attention (Gemma 3): window size, and the layer pattern as either a period n
// (layer l is local unless l % n == n - 1) or one bool per layer.
inline constexpr std::string_view kSlidingWindow = "attention.sliding_window";
inline constexpr std::string_view kSlidingWindowPattern = "attention.sliding_window_pattern";
inline constexpr std::string_view kRopeFreqBaseSwa = "rope.freq_base_swa";
inline constexpr std::string_view kFinalLogitSoftcapping = "final_logit_softcapping";
inline constexpr std::string_view kAttnLogitSoftcapping = "attn_logit_softcapping";

inline std::string arch_key(std::string_view arch, std::string_view suffix) {
  return fmt::format("{}.{}", arch, suffix);
}

// --- tokenizer.ggml.* -------------------------------------------------------------------------
inline constexpr std::string_view kTokenizerModel = "tokenizer.ggml.model";
inline constexpr std::string_view kTokenizerTokens = "tokenizer.ggml.tokens";
inline constexpr std::string_view kTokenizerScores = "tokenizer.ggml.scores";
inline constexpr std::string_view kTokenizerTokenType = "tokenizer.ggml.token_type";
inline constexpr std::string_view kTokenizerBosId = "tokenizer.ggml.bos_token_id";
inline constexpr std::string_view kTokenizerEosId = "tokenizer.ggml.eos_token_id";
inline constexpr std::string_view kTokenizerUnkId = "tokenizer.ggml.unknown_token_id";
inline constexpr std::string_view kTokenizerModelLlama = "llama";

// --- tensors ----------------------------------------------------------------------------------
inline constexpr std::string_view kTokenEmbd = "token_embd.weight";
inline constexpr std::string_view kOutputNorm = "output_norm.weight";
inline constexpr std::string_view kOutput = "output.weight";
// Llama 3.x RoPE frequency factors (divisors of each pair's frequency; in the tensor table).
inline constexpr std::string_view kRopeFreqs = "rope_freqs.weight";

// Per-block tensor names are in the architecture's tensor table (model/tensor_table.cpp).

}  // namespace protokv::gguf_names
