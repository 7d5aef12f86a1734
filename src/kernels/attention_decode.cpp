// Decode attention: one new query per head over that head's cached entries.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/isa.h"
#include "kernels/kernels.h"

namespace protokv::kernels {
namespace {

template <class Ops>
void decode_group_impl(const float* q, int group, const float* keys, const float* values,
                       const float* log_weights, int64_t n, int d, float* out, float* probs) {
  std::fill(out, out + static_cast<int64_t>(group) * d, 0.0f);
  if (n <= 0) return;
  // Reused across calls (decode runs this per head, layer and token).
  thread_local std::vector<float> scratch;
  const size_t score_floats = probs ? 0 : static_cast<size_t>(group) * n;
  scratch.resize(static_cast<size_t>(group) * d + score_floats);
  float* scaled_q = scratch.data();                                            // [group, d]
  float* scores = probs ? probs : scaled_q + static_cast<int64_t>(group) * d;  // [group, n]

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t i = 0; i < static_cast<int64_t>(group) * d; ++i) scaled_q[i] = q[i] * scale;

  // Keys once: each key row is used by every head of the group while it is in L1.
  for (int64_t j = 0; j < n; ++j) {
    const float* key = keys + j * d;
    const float bias = log_weights ? log_weights[j] : 0.0f;  // Chelsea Eq. 2
    for (int h = 0; h < group; ++h) scores[h * n + j] = Ops::dot(scaled_q + h * d, key, d) + bias;
  }
  for (int h = 0; h < group; ++h) softmax_with<Ops>(scores + h * n, n);
  // Values once, likewise.
  for (int64_t j = 0; j < n; ++j) {
    const float* value = values + j * d;
    for (int h = 0; h < group; ++h) Ops::axpy(scores[h * n + j], value, out + h * d, d);
  }
}

}  // namespace

void attention_decode_group(Isa isa, const float* q, int group, const float* keys,
                            const float* values, const float* log_weights, int64_t n, int d,
                            float* out, float* probs) {
  with_isa(isa, [&](auto ops) {
    decode_group_impl<decltype(ops)>(q, group, keys, values, log_weights, n, d, out, probs);
  });
}

void attention_decode_group(const float* q, int group, const float* keys, const float* values,
                            const float* log_weights, int64_t n, int d, float* out, float* probs) {
  decode_group_impl<BestOps>(q, group, keys, values, log_weights, n, d, out, probs);
}

void attention_decode(const float* q, const float* keys, const float* values,
                      const float* log_weights, int64_t n, int d, float* out, float* probs) {
  decode_group_impl<BestOps>(q, 1, keys, values, log_weights, n, d, out, probs);
}

}  // namespace protokv::kernels
