// llama2.c "legacy" checkpoint loader: a header of 7 little-endian int32
// (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len) followed by F32 tensors in
// the order of llama2.c's run.c (memory_map_weights). The file is memory-mapped and every
// WeightMatrix points into the mapping; nothing is copied.

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

#include "io/mapped_file.h"
#include "model/loaders.h"
#include "protokv/error.h"

namespace protokv {
namespace {

constexpr size_t kHeaderInts = 7;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

int32_t read_le_int32(const unsigned char* p) {
  const uint32_t v = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return static_cast<int32_t>(v);
}

// Hands out consecutive F32 tensors from the mapped weight area.
class TensorCursor {
 public:
  explicit TensorCursor(const float* start) : next_(start) {}
  const float* take(int64_t n) {
    const float* p = next_;
    next_ += n;
    return p;
  }
  // llama2.c stacks one [rows, cols] matrix per layer: layer l starts at l * rows * cols.
  const float* take_stacked(int n_layers, int64_t per_layer) {
    return take(static_cast<int64_t>(n_layers) * per_layer);
  }

 private:
  const float* next_;
};

WeightMatrix f32_matrix(const float* data, int64_t rows, int64_t cols) {
  WeightMatrix w;
  w.type = DType::F32;
  w.data = data;
  w.rows = rows;
  w.cols = cols;
  return w;
}

}  // namespace

ModelWeights load_llama2c_model(const std::string& path) {
  size_t file_size = 0;
  std::shared_ptr<const void> mapping =
      map_file(path, kHeaderBytes, "a llama2.c checkpoint", &file_size);
  const auto* bytes = static_cast<const unsigned char*>(mapping.get());

  int32_t header[kHeaderInts];
  for (size_t i = 0; i < kHeaderInts; ++i) header[i] = read_le_int32(bytes + 4 * i);

  ModelConfig config;
  config.architecture = "llama";
  config.dim = header[0];
  config.hidden_dim = header[1];
  config.n_layers = header[2];
  config.n_heads = header[3];
  config.n_kv_heads = header[4];
  // A negative vocabulary size marks a separate classifier matrix (llama2.c export convention).
  config.shared_classifier = header[5] > 0;
  config.vocab_size = header[5] == INT32_MIN ? 0 : (header[5] < 0 ? -header[5] : header[5]);
  config.context_length = header[6];
  config.rope_theta = 10000.0f;
  config.norm_eps = 1e-5f;
  config.rope_neox = false;  // llama2.c checkpoints are in Meta (adjacent-pair) order
  try {
    config.validate();
  } catch (const Error& e) {
    fail("{}: not a valid llama2.c checkpoint: {}", path, e.what());
  }

  const int64_t dim = config.dim;
  const int64_t hidden = config.hidden_dim;
  const int64_t layers = config.n_layers;
  const int64_t head_dim = config.head_dim();
  const int64_t q_dim = config.n_heads * head_dim;
  const int64_t kv_dim = config.n_kv_heads * head_dim;
  const int64_t vocab = config.vocab_size;
  const int64_t context = config.context_length;

  // Every count below is bounded by validate(), so int64 arithmetic cannot overflow.
  const int64_t per_layer =
      2 * dim + dim * q_dim + 2 * dim * kv_dim + q_dim * dim + 3 * dim * hidden;
  const int64_t rope_tables = 2 * context * head_dim / 2;  // freq_cis_real + freq_cis_imag
  int64_t floats = vocab * dim + layers * per_layer + dim + rope_tables;
  if (!config.shared_classifier) floats += vocab * dim;
  const auto expected = static_cast<uint64_t>(kHeaderBytes) + static_cast<uint64_t>(floats) * 4;
  if (file_size != expected) {
    fail(
        "{}: size {} bytes does not match its llama2.c header ({} bytes expected for dim {}, "
        "{} layers, vocab {}{})",
        path, file_size, expected, dim, layers, vocab,
        config.shared_classifier ? "" : ", separate classifier");
  }

  ModelWeights weights;
  weights.config = config;
  TensorCursor cursor(reinterpret_cast<const float*>(bytes + kHeaderBytes));
  const float* token_embedding = cursor.take(vocab * dim);  // [vocab, dim]
  const float* rms_att = cursor.take_stacked(config.n_layers, dim);
  // run.c's matmul(xout, x, w, n, d) computes xout[d] = W[d, n] x[n]: rows are output features,
  // which is our WeightMatrix convention, so the tensors map without transposition.
  const float* wq = cursor.take_stacked(config.n_layers, q_dim * dim);   // [L, q_dim, dim]
  const float* wk = cursor.take_stacked(config.n_layers, kv_dim * dim);  // [L, kv_dim, dim]
  const float* wv = cursor.take_stacked(config.n_layers, kv_dim * dim);  // [L, kv_dim, dim]
  const float* wo = cursor.take_stacked(config.n_layers, dim * q_dim);   // [L, dim, q_dim]
  const float* rms_ffn = cursor.take_stacked(config.n_layers, dim);      // [L, dim]
  const float* w1 = cursor.take_stacked(config.n_layers, hidden * dim);  // [L, hidden, dim] gate
  const float* w2 = cursor.take_stacked(config.n_layers, dim * hidden);  // [L, dim, hidden] down
  const float* w3 = cursor.take_stacked(config.n_layers, hidden * dim);  // [L, hidden, dim] up
  const float* rms_final = cursor.take(dim);
  cursor.take(rope_tables);  // precomputed RoPE tables: unused, we compute RoPE ourselves
  const float* wcls = config.shared_classifier ? token_embedding : cursor.take(vocab * dim);

  weights.token_embd = f32_matrix(token_embedding, vocab, dim);
  weights.output_norm = rms_final;
  weights.output = f32_matrix(wcls, vocab, dim);
  weights.layers.resize(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) {
    LayerWeights& lw = weights.layers[static_cast<size_t>(l)];
    lw.attn_norm = rms_att + l * dim;
    lw.wq = f32_matrix(wq + l * q_dim * dim, q_dim, dim);
    lw.wk = f32_matrix(wk + l * kv_dim * dim, kv_dim, dim);
    lw.wv = f32_matrix(wv + l * kv_dim * dim, kv_dim, dim);
    lw.wo = f32_matrix(wo + l * dim * q_dim, dim, q_dim);
    lw.ffn_norm = rms_ffn + l * dim;
    lw.w_gate = f32_matrix(w1 + l * hidden * dim, hidden, dim);
    lw.w_down = f32_matrix(w2 + l * dim * hidden, dim, hidden);
    lw.w_up = f32_matrix(w3 + l * hidden * dim, hidden, dim);
  }
  weights.storage.push_back(std::move(mapping));
  return weights;
}

}  // namespace protokv
