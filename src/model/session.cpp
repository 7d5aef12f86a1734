// Session lifecycle: validation of the weights it runs on, scratch allocation, accessors.
// The forward pass itself is in forward.cpp (the block), prefill.cpp and decode.cpp.
#include <algorithm>
#include <utility>

#include "model/session_impl.h"
#include "protokv/error.h"

namespace protokv {
namespace {

void check_matrix(const WeightMatrix& w, int64_t rows, int64_t cols, const char* name, int layer) {
  PROTOKV_CHECK(w.data != nullptr, "model is missing weight {} (layer {})", name, layer);
  PROTOKV_CHECK(w.rows == rows && w.cols == cols,
                "weight {} of layer {} has shape [{}, {}], expected [{}, {}]", name, layer, w.rows,
                w.cols, rows, cols);
  PROTOKV_CHECK(cols % dtype_block_size(w.type) == 0,
                "weight {} of layer {}: {} columns are not a multiple of the {} block size", name,
                layer, cols, dtype_name(w.type));
}

// Loaders validate their files; this catches inconsistent hand-built weights before any kernel
// reads out of bounds.
void check_weights(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  c.validate();
  const int64_t hd = c.head_dim();
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * hd;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * hd;
  PROTOKV_CHECK(static_cast<int>(w.layers.size()) == c.n_layers,
                "model has {} layers of weights, config says {}", w.layers.size(), c.n_layers);
  check_matrix(w.token_embd, c.vocab_size, c.dim, "token_embd", -1);
  check_matrix(w.output, c.vocab_size, c.dim, "output", -1);
  PROTOKV_CHECK(w.output_norm != nullptr, "model is missing the output norm");
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    PROTOKV_CHECK(lw.attn_norm != nullptr && lw.ffn_norm != nullptr,
                  "model is missing a norm weight in layer {}", l);
    check_matrix(lw.wq, q_dim, c.dim, "wq", l);
    check_matrix(lw.wk, kv_dim, c.dim, "wk", l);
    check_matrix(lw.wv, kv_dim, c.dim, "wv", l);
    check_matrix(lw.wo, c.dim, q_dim, "wo", l);
    check_matrix(lw.w_gate, c.hidden_dim, c.dim, "w_gate", l);
    check_matrix(lw.w_up, c.hidden_dim, c.dim, "w_up", l);
    check_matrix(lw.w_down, c.dim, c.hidden_dim, "w_down", l);
  }
}

}  // namespace

Session::Impl::Impl(const ModelWeights& w, SessionOptions opts)
    : weights(w), config(w.config), options(std::move(opts)) {
  check_weights(weights);
  PROTOKV_CHECK(options.ubatch >= 0, "ubatch must be >= 0 (0: the whole prompt), got {}",
                options.ubatch);
  rope = kernels::make_rope_table(config.head_dim(), config.rope_theta, config.rope_neox);
  cache = KvCache(config.n_layers, config.n_kv_heads, config.head_dim());
  logits.assign(static_cast<size_t>(config.vocab_size), 0.0f);
  step = RowBuffers(1, config);
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
  cache.clear();
  n_past = 0;
  press_begun = false;
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

std::span<const float> Session::append(std::span<const int32_t> tokens) {
  impl_->check_append(tokens);  // bad input leaves the session as it was
  try {
    return impl_->append(tokens);
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
void Session::set_observer(DecodeObserver* observer) {
  impl_->observer = observer;
}
void Session::reset() {
  impl_->reset();
}

}  // namespace protokv
