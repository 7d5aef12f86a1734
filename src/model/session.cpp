// SPDX-License-Identifier: Apache-2.0
// Session lifecycle: validation of the weights it runs on, scratch allocation, accessors.
// The forward pass itself is in forward.cpp (the block), prefill.cpp and decode.cpp.
#include <algorithm>
#include <utility>

#include "kernels/isa.h"
#include "model/session_impl.h"
#include "model/tensor_table.h"
#include "protokv/error.h"

namespace protokv {

Session::Impl::Impl(const ModelWeights& w, SessionOptions opts)
    : weights(w), config(w.config), options(std::move(opts)) {
  check_tensors(weights);  // loaders validate files; this catches inconsistent hand-built weights
  PROTOKV_CHECK(options.ubatch >= 0, "ubatch must be >= 0 (0: the whole prompt), got {}",
                options.ubatch);
  // ggml's freq_scale is the inverse of the linear scaling factor (llama-model.cpp load_hparams).
  rope = kernels::make_rope_table(config.head_dim(), config.rope_dims(), config.rope_theta,
                                  config.rope_neox, 1.0f / config.rope_linear_factor,
                                  config.rope_freq_factors ? weights.rope_freqs : nullptr,
                                  options.llama_cpp_arithmetic);
  // Gemma 3's local layers: their own base, no scaling (llama.cpp rope_freq_scale_train_swa = 1).
  if (config.has_local_layers())
    rope_local =
        kernels::make_rope_table(config.head_dim(), config.rope_dims(), config.rope_theta_local,
                                 config.rope_neox, 1.0f, nullptr, options.llama_cpp_arithmetic);
  cache = KvCache(config.n_layers, config.n_kv_heads, config.head_dim(), options.cache_type);
  press_index.assign(static_cast<size_t>(config.n_layers), -1);
  for (int l = 0; l < config.n_layers; ++l) {
    if (config.is_local_layer(l) && !options.compress_local_layers) continue;
    press_index[static_cast<size_t>(l)] = static_cast<int>(press_layers.size());
    press_layers.push_back(l);
  }
  logits.assign(static_cast<size_t>(config.vocab_size), 0.0f);
  step = RowBuffers(1, config);
  step.llama_cpp_arithmetic = options.llama_cpp_arithmetic;
  PROTOKV_CHECK(options.llama_cpp_arithmetic || !options.llama_cpp_flash_attention,
                "llama_cpp_flash_attention needs llama_cpp_arithmetic");
  PROTOKV_CHECK(options.llama_cpp_threads >= 1 && options.llama_cpp_threads <= 1024,
                "llama_cpp_threads must be in [1, 1024], got {}", options.llama_cpp_threads);
  flash_decode.threads = options.llama_cpp_threads;
  // Flash attention reads F16 caches too (llama.cpp's default); the other path F32 only.
  const auto readable = [&](DType type) {
    return type == DType::F32 || (options.llama_cpp_flash_attention && type == DType::F16);
  };
  llama_cpp_attention = options.llama_cpp_arithmetic &&
                        architecture(config.architecture).llama_cpp_order &&
                        config.attention_scale <= 0.0f && readable(options.cache_type.key) &&
                        readable(options.cache_type.value);

  kernels::active_isa();  // a bad PROTOKV_ISA fails here, not inside a kernel's parallel loop
}

void Session::Impl::check_token(int32_t token) const {
  PROTOKV_CHECK(token >= 0 && token < config.vocab_size,
                "token id {} is outside the vocabulary (size {})", token, config.vocab_size);
}

int64_t Session::Impl::decode_headroom(int64_t n_past_after_prefill) const {
  constexpr int64_t kDecodeReserve = 256;
  return std::clamp<int64_t>(config.context_length - n_past_after_prefill, 0, kDecodeReserve);
}

void Session::Impl::ensure_probs_capacity(int64_t n) {
  if (n <= probs_stride) return;
  // Grow geometrically (bounded by the context) so that decode reallocates O(log n) times.
  const int64_t stride = std::min<int64_t>(std::max<int64_t>({n, 2 * probs_stride, 256}),
                                           std::max<int64_t>(n, config.context_length));
  probs.assign(static_cast<size_t>(stride * config.n_heads), 0.0f);
  probs_stride = stride;
}

void Session::Impl::reset() {
  pending.reset();
  cache.clear();
  n_past = 0;
  press.reset();
  stats = PrefillStats{};
}

Session::Session(const ModelWeights& weights, SessionOptions options)
    : impl_(std::make_unique<Impl>(weights, std::move(options))) {}

Session::~Session() = default;

std::span<const float> Session::prefill(std::span<const int32_t> tokens) {
  try {
    return impl_->prefill(tokens);
  } catch (...) {
    impl_->reset();  // a press or allocation failure must not leave a half-filled cache behind
    throw;
  }
}

void Session::begin_prefill(std::span<const int32_t> tokens) {
  try {
    impl_->begin_prefill(tokens);
  } catch (...) {
    impl_->reset();
    throw;
  }
}

bool Session::prefill_chunk() {
  try {
    return impl_->prefill_chunk();
  } catch (...) {
    impl_->reset();
    throw;
  }
}

std::span<const float> Session::logits() const {
  return impl_->logits;
}

std::span<const float> Session::prefill(const PrefilledPrompt& prompt) {
  try {
    return impl_->prefill(prompt);
  } catch (...) {
    impl_->reset();
    throw;
  }
}

std::span<const float> Session::append(std::span<const int32_t> tokens) {
  return append(tokens, nullptr);
}

std::span<const float> Session::append(std::span<const int32_t> tokens,
                                       const RowLogits& on_logits) {
  impl_->check_append(tokens);  // bad input leaves the session as it was
  try {
    return impl_->append(tokens, on_logits);
  } catch (...) {
    impl_->reset();  // a failure part-way through the layers leaves the cache inconsistent
    throw;
  }
}

std::span<const float> Session::decode(int32_t token) {
  return impl_->decode(token);
}

int64_t Session::n_past() const {
  return impl_->n_past;
}
const KvCache& Session::cache() const {
  return impl_->cache;
}
const PrefillStats& Session::prefill_stats() const {
  return impl_->stats;
}
const ModelConfig& Session::config() const {
  return impl_->config;
}
const Press* Session::press() const {
  return impl_->press.get();
}
void Session::set_observer(DecodeObserver* observer) {
  impl_->observer = observer;
}
void Session::set_budget(const Budget& budget) {
  budget.validate();
  impl_->options.budget = budget;
}
void Session::reset() {
  impl_->reset();
}

}  // namespace protokv
