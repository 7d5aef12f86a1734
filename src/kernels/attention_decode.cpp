// Decode attention: one new query per head over that head's cached entries.
#include <algorithm>
#include <cmath>
#include <span>
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

  // Keys and values are walked in blocks of ~32 KB that stay in L1 while every head of the
  // group uses them: each is read from memory once per group.
  const int64_t block = std::max<int64_t>(8, (int64_t{32} << 10) / (4 * std::max(d, 1)));
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t count = std::min(block, n - j0);
    const float* key_block = keys + j0 * d;
    for (int h = 0; h < group; ++h) {
      float* s = scores + h * n + j0;
      int64_t j = 0;
      for (; j + 4 <= count; j += 4) Ops::dot4(scaled_q + h * d, key_block + j * d, d, d, s + j);
      for (; j < count; ++j) s[j] = Ops::dot(scaled_q + h * d, key_block + j * d, d);
      if (log_weights)  // Chelsea Eq. 2
        for (j = 0; j < count; ++j) s[j] += log_weights[j0 + j];
    }
  }
  for (int h = 0; h < group; ++h) softmax_with<Ops>(scores + h * n, n);
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t count = std::min(block, n - j0);
    for (int h = 0; h < group; ++h)
      Ops::weighted_row_sum(scores + h * n + j0, values + j0 * d, count, d, out + h * d, d);
  }
}

// One query over the cached entries `indices` (cache rows, any order, repeats allowed): the dense
// kernel's arithmetic on the gathered subset. Scores use the same SIMD dot and softmax; values are
// accumulated row by row with the SIMD axpy (the rows are not contiguous).
template <class Ops>
void decode_gathered_impl(const float* q, const float* keys, const float* values,
                          const float* log_weights, std::span<const int32_t> indices, int d,
                          float* out, float* probs) {
  std::fill(out, out + d, 0.0f);
  const auto n = static_cast<int64_t>(indices.size());
  if (n <= 0) return;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(d) + (probs ? 0 : static_cast<size_t>(n)));
  float* scaled_q = scratch.data();
  float* scores = probs ? probs : scaled_q + d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int i = 0; i < d; ++i) scaled_q[i] = q[i] * scale;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = indices[static_cast<size_t>(j)];
    scores[j] = Ops::dot(scaled_q, keys + row * d, d);
    if (log_weights) scores[j] += log_weights[row];  // Chelsea Eq. 2
  }
  softmax_with<Ops>(scores, n);
  for (int64_t j = 0; j < n; ++j)
    Ops::axpy(scores[j], values + static_cast<int64_t>(indices[static_cast<size_t>(j)]) * d, out,
              d);
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

void attention_decode_gathered(Isa isa, const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs) {
  with_isa(isa, [&](auto ops) {
    decode_gathered_impl<decltype(ops)>(q, keys, values, log_weights, indices, d, out, probs);
  });
}

void attention_decode_gathered(const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs) {
  decode_gathered_impl<BestOps>(q, keys, values, log_weights, indices, d, out, probs);
}

}  // namespace protokv::kernels
