#pragma once
// CPU kernels. Each has a naive reference in tests/. Shapes are in the comments; all math is F32.
#include <cstdint>

#include "protokv/model.h"

namespace protokv::kernels {

float dot(const float* a, const float* b, int64_t n);

// out[i] = x[i] / rms(x) * weight[i], rms over n values. out may alias x.
void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps);
// Same for `rows` rows of n values each.
void rmsnorm_rows(float* out, const float* x, const float* weight, int64_t rows, int64_t n,
                  float eps);

// In-place softmax over n values (max-subtracted, F32).
void softmax(float* x, int64_t n);

// Rotary embedding in place for one token: x [n_heads, head_dim] at token position `pos`.
// neox=false rotates pairs (2i, 2i+1) (Meta/llama order); neox=true rotates (i, i + d/2).
void rope(float* x, int n_heads, int head_dim, int32_t pos, float theta, bool neox);

// y[rows] = W[rows, cols] · x[cols], W in any supported dtype.
void matvec(const WeightMatrix& w, const float* x, float* y);

// Y[n, rows] = X[n, cols] · W^T (prefill projections), W in any supported dtype, through BLAS.
void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y);

// Causal attention of one query head over its KV head, all n tokens of a prefill:
// q, k, v [n, d]; out [n, d]; query i sees keys 0..i. Tiled with online softmax: never
// materialises an n×n matrix. Logits scaled by 1/sqrt(d).
void attention_prefill(const float* q, const float* k, const float* v, int64_t n, int d,
                       float* out);

// One query q [d] over n cached entries keys/values [n, d]; log_weights [n] (nullable) added to
// the scaled logits (Chelsea Eq. 2). out [d]. If probs is non-null, the softmax weights [n] are
// written there.
void attention_decode(const float* q, const float* keys, const float* values,
                      const float* log_weights, int64_t n, int d, float* out, float* probs);

}  // namespace protokv::kernels
