#pragma once
// Vector primitives behind every kernel, one struct per instruction set with the same static
// functions: ScalarOps (portable, always compiled), Avx2Ops (AVX2 + FMA + F16C), Avx512Ops
// (AVX-512 F/BW/VL; uses AVX-512 VNNI for Q8_0 when present). Kernels are templates over these
// structs, so each kernel exists once per compiled instruction set and the tests run them all
// (kernels/isa.h). All math is F32; the Q8_0 dot is exact in int32 per block.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "protokv/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PROTOKV_HAVE_AVX2 1
#endif
#if defined(PROTOKV_HAVE_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define PROTOKV_HAVE_AVX512 1
#endif
#if defined(PROTOKV_HAVE_AVX2) || defined(PROTOKV_HAVE_AVX512)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wuninitialized flags
// once inlined (a false positive: the masks select every lane). Off for the intrinsics' own
// lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

namespace protokv::kernels {

// F16 -> F32 for every half bit pattern (256 KB, built on first use): the portable path's
// conversion, one load instead of f16_to_f32's branches.
const float* f16_table();

struct ScalarOps {
  static constexpr const char* kName = "scalar";

  static float dot(const float* a, const float* b, int64_t n) {
    // Four partial sums: same association pattern as the vector paths, and a shorter
    // dependency chain.
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      s0 += a[i] * b[i];
      s1 += a[i + 1] * b[i + 1];
      s2 += a[i + 2] * b[i + 2];
      s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; ++i) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
  }

  static float dot_f16(const uint16_t* w, const float* x, int64_t n) {
    const float* table = f16_table();
    float s0 = 0, s1 = 0;
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      s0 += table[w[i]] * x[i];
      s1 += table[w[i + 1]] * x[i + 1];
    }
    if (i < n) s0 += table[w[i]] * x[i];
    return s0 + s1;
  }

  static float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
    return s;
  }

  // Q8_0 weights against F32 activations: the same arithmetic as prefill's dequantise + GEMM,
  // so prefill and token-by-token decode agree (ggml instead quantises the activations too).
  static float dot_q8(const BlockQ8_0* w, const float* x, int64_t n_blocks) {
    const float* f16 = f16_table();
    float s = 0;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* xb = x + b * kQ8BlockSize;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int j = 0; j < kQ8BlockSize; j += 4) {
        s0 += static_cast<float>(w[b].quants[j]) * xb[j];
        s1 += static_cast<float>(w[b].quants[j + 1]) * xb[j + 1];
        s2 += static_cast<float>(w[b].quants[j + 2]) * xb[j + 2];
        s3 += static_cast<float>(w[b].quants[j + 3]) * xb[j + 3];
      }
      s += ((s0 + s1) + (s2 + s3)) * f16[w[b].scale];
    }
    return s;
  }

  // Weights of any dtype to F32 (n a multiple of the block size for Q8_0).
  static void to_f32(DType type, const void* src, float* dst, int64_t n) {
    if (type == DType::F16) {
      const float* table = f16_table();
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = table[h[i]];
      return;
    }
    dequantize_row(type, src, dst, n);
  }

  // out[k] = a · b_k for the four rows b_k = b + k * stride.
  static void dot4(const float* a, const float* b, int64_t stride, int64_t n, float* out) {
    for (int k = 0; k < 4; ++k) out[k] = dot(a, b + k * stride, n);
  }

  // out[c] += sum_j weights[j] * rows[j * stride + c], c < n, j < count.
  static void weighted_row_sum(const float* weights, const float* rows, int64_t count,
                               int64_t stride, float* out, int64_t n) {
    for (int64_t j = 0; j < count; ++j) axpy(weights[j], rows + j * stride, out, n);
  }

  static void axpy(float a, const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }

  static void scale(float* x, float a, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= a;
  }

  static float max(const float* x, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }

  static float exp(float x) { return std::exp(x); }

  // x[i] = exp(x[i] - shift); returns the sum of the new values.
  static float exp_shifted_sum(float* x, float shift, int64_t n) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - shift);
      sum += x[i];
    }
    return sum;
  }

  static float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }

  // out[i] = x[i] * s * w[i]
  static void scaled_mul(float* out, const float* x, float s, const float* w, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s * w[i];
  }
};

#if defined(PROTOKV_HAVE_AVX2)

struct Avx2Ops {
  static constexpr const char* kName = "avx2";

  static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  static float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  static __m256 load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256 load_bf16(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }

  static float dot(const float* a, const float* b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
      s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
      s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
  }

  static float dot_f16(const uint16_t* w, const float* x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      s0 = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(x + i), s0);
      s1 = _mm256_fmadd_ps(load_f16(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
      s2 = _mm256_fmadd_ps(load_f16(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
      s3 = _mm256_fmadd_ps(load_f16(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(x + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) s += _cvtsh_ss(w[i]) * x[i];
    return s;
  }

  static float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      s0 = _mm256_fmadd_ps(load_bf16(w + i), _mm256_loadu_ps(x + i), s0);
      s1 = _mm256_fmadd_ps(load_bf16(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
      s2 = _mm256_fmadd_ps(load_bf16(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
      s3 = _mm256_fmadd_ps(load_bf16(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16(w + i), _mm256_loadu_ps(x + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
    return s;
  }

  // Q8_0 weights against F32 activations (see ScalarOps::dot_q8).
  static float dot_q8(const BlockQ8_0* w, const float* x, int64_t n_blocks) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* xb = x + b * kQ8BlockSize;
      __m256 block0 = _mm256_setzero_ps(), block1 = _mm256_setzero_ps();
      for (int k = 0; k < 4; k += 2) {
        const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[b].quants + 8 * k))));
        const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[b].quants + 8 * k + 8))));
        block0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xb + 8 * k), block0);
        block1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xb + 8 * k + 8), block1);
      }
      const __m256 scale = _mm256_set1_ps(_cvtsh_ss(w[b].scale));
      acc0 = _mm256_fmadd_ps(block0, scale, acc0);
      acc1 = _mm256_fmadd_ps(block1, scale, acc1);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
  }

  static void to_f32(DType type, const void* src, float* dst, int64_t n) {
    switch (type) {
      case DType::F32:
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
      case DType::F16: {
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16(h + i));
        for (; i < n; ++i) dst[i] = _cvtsh_ss(h[i]);
        return;
      }
      case DType::BF16: {
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(h + i));
        for (; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
        return;
      }
      case DType::Q8_0: {
        const auto* blocks = static_cast<const BlockQ8_0*>(src);
        for (int64_t b = 0; b < n / kQ8BlockSize; ++b) {
          const __m256 d = _mm256_set1_ps(_cvtsh_ss(blocks[b].scale));
          for (int k = 0; k < 4; ++k) {
            const __m128i q8 =
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blocks[b].quants + 8 * k));
            const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
            _mm256_storeu_ps(dst + b * kQ8BlockSize + 8 * k, _mm256_mul_ps(q, d));
          }
        }
        return;
      }
    }
  }

  static void dot4(const float* a, const float* b, int64_t stride, int64_t n, float* out) {
    const float* b0 = b;
    const float* b1 = b + stride;
    const float* b2 = b + 2 * stride;
    const float* b3 = b + 3 * stride;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 va = _mm256_loadu_ps(a + i);
      s0 = _mm256_fmadd_ps(va, _mm256_loadu_ps(b0 + i), s0);
      s1 = _mm256_fmadd_ps(va, _mm256_loadu_ps(b1 + i), s1);
      s2 = _mm256_fmadd_ps(va, _mm256_loadu_ps(b2 + i), s2);
      s3 = _mm256_fmadd_ps(va, _mm256_loadu_ps(b3 + i), s3);
    }
    out[0] = hsum(s0);
    out[1] = hsum(s1);
    out[2] = hsum(s2);
    out[3] = hsum(s3);
    for (; i < n; ++i) {
      out[0] += a[i] * b0[i];
      out[1] += a[i] * b1[i];
      out[2] += a[i] * b2[i];
      out[3] += a[i] * b3[i];
    }
  }

  // Columns in chunks of 32 held in registers across all rows: out is loaded and stored once
  // per chunk instead of once per row.
  static void weighted_row_sum(const float* weights, const float* rows, int64_t count,
                               int64_t stride, float* out, int64_t n) {
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
      __m256 acc0 = _mm256_loadu_ps(out + c), acc1 = _mm256_loadu_ps(out + c + 8),
             acc2 = _mm256_loadu_ps(out + c + 16), acc3 = _mm256_loadu_ps(out + c + 24);
      for (int64_t j = 0; j < count; ++j) {
        const __m256 w = _mm256_set1_ps(weights[j]);
        const float* row = rows + j * stride + c;
        acc0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row), acc0);
        acc1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8), acc1);
        acc2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 16), acc2);
        acc3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 24), acc3);
      }
      _mm256_storeu_ps(out + c, acc0);
      _mm256_storeu_ps(out + c + 8, acc1);
      _mm256_storeu_ps(out + c + 16, acc2);
      _mm256_storeu_ps(out + c + 24, acc3);
    }
    if (c < n)
      for (int64_t j = 0; j < count; ++j) axpy(weights[j], rows + j * stride + c, out + c, n - c);
  }

  static void axpy(float a, const float* x, float* y, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
  }

  static void scale(float* x, float a, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), va));
    for (; i < n; ++i) x[i] *= a;
  }

  static float max(const float* x, int64_t n) {
    __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    float r = hmax(m);
    for (; i < n; ++i) r = std::max(r, x[i]);
    return r;
  }

  // e^x: x = k ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (truncation
  // error < 2e-7 relative), 2^k built in the exponent field. Inputs below -87.33 (where 2^k
  // would leave the normal range) give 0, a difference below 1.2e-38 from the true value;
  // inputs above 88.37 give inf (the true value is inf from 88.73). Softmax-style callers
  // subtract the maximum first, so they only pass x <= 0.
  static __m256 exp(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.7f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // ln 2 split in two so that k * ln2_hi is exact.
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    return _mm256_andnot_ps(underflow, result);
  }

  static float exp(float x) { return _mm256_cvtss_f32(exp(_mm256_set1_ps(x))); }

  static float exp_shifted_sum(float* x, float shift, int64_t n) {
    const __m256 vs = _mm256_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 e = exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
      _mm256_storeu_ps(x + i, e);
      sum = _mm256_add_ps(sum, e);
    }
    float s = hsum(sum);
    for (; i < n; ++i) {
      x[i] = exp(x[i] - shift);
      s += x[i];
    }
    return s;
  }

  static float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }

  static void scaled_mul(float* out, const float* x, float s, const float* w, int64_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; ++i) out[i] = x[i] * s * w[i];
  }
};

#endif  // PROTOKV_HAVE_AVX2

#if defined(PROTOKV_HAVE_AVX512)

struct Avx512Ops {
  static constexpr const char* kName = "avx512";

  static __mmask16 tail_mask(int64_t remaining) {
    return static_cast<__mmask16>((1u << remaining) - 1u);
  }
  static __m512 load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 load_f16(const uint16_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
  static __m512 widen_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load_bf16(const uint16_t* p) {
    return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 load_bf16(const uint16_t* p, __mmask16 m) {
    return widen_bf16(_mm256_maskz_loadu_epi16(m, p));
  }

  static float dot(const float* a, const float* b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
      s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
      s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
      s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  }

  static float dot_f16(const uint16_t* w, const float* x, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      s0 = _mm512_fmadd_ps(load_f16(w + i), _mm512_loadu_ps(x + i), s0);
      s1 = _mm512_fmadd_ps(load_f16(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
      s2 = _mm512_fmadd_ps(load_f16(w + i + 32), _mm512_loadu_ps(x + i + 32), s2);
      s3 = _mm512_fmadd_ps(load_f16(w + i + 48), _mm512_loadu_ps(x + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(load_f16(w + i), _mm512_loadu_ps(x + i), s0);
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      s1 = _mm512_fmadd_ps(load_f16(w + i, m), _mm512_maskz_loadu_ps(m, x + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  }

  static float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      s0 = _mm512_fmadd_ps(load_bf16(w + i), _mm512_loadu_ps(x + i), s0);
      s1 = _mm512_fmadd_ps(load_bf16(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
      s2 = _mm512_fmadd_ps(load_bf16(w + i + 32), _mm512_loadu_ps(x + i + 32), s2);
      s3 = _mm512_fmadd_ps(load_bf16(w + i + 48), _mm512_loadu_ps(x + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(load_bf16(w + i), _mm512_loadu_ps(x + i), s0);
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      s1 = _mm512_fmadd_ps(load_bf16(w + i, m), _mm512_maskz_loadu_ps(m, x + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  }

  // Q8_0 weights against F32 activations (see ScalarOps::dot_q8).
  static float dot_q8(const BlockQ8_0* w, const float* x, int64_t n_blocks) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* xb = x + b * kQ8BlockSize;
      const __m512 q0 = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].quants))));
      const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].quants + 16))));
      const __m512 scale = _mm512_set1_ps(_cvtsh_ss(w[b].scale));
      acc0 = _mm512_fmadd_ps(_mm512_mul_ps(q0, _mm512_loadu_ps(xb)), scale, acc0);
      acc1 = _mm512_fmadd_ps(_mm512_mul_ps(q1, _mm512_loadu_ps(xb + 16)), scale, acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }

  static void to_f32(DType type, const void* src, float* dst, int64_t n) {
    switch (type) {
      case DType::F32:
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
      case DType::F16: {
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_f16(h + i));
        if (i < n) {
          const __mmask16 m = tail_mask(n - i);
          _mm512_mask_storeu_ps(dst + i, m, load_f16(h + i, m));
        }
        return;
      }
      case DType::BF16: {
        const auto* h = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(h + i));
        if (i < n) {
          const __mmask16 m = tail_mask(n - i);
          _mm512_mask_storeu_ps(dst + i, m, load_bf16(h + i, m));
        }
        return;
      }
      case DType::Q8_0: {
        const auto* blocks = static_cast<const BlockQ8_0*>(src);
        for (int64_t b = 0; b < n / kQ8BlockSize; ++b) {
          const __m512 d = _mm512_set1_ps(_cvtsh_ss(blocks[b].scale));
          for (int k = 0; k < 2; ++k) {
            const __m128i q8 =
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].quants + 16 * k));
            const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8));
            _mm512_storeu_ps(dst + b * kQ8BlockSize + 16 * k, _mm512_mul_ps(q, d));
          }
        }
        return;
      }
    }
  }

  // The four sums reduced together: pairwise unpacks put partial sums of all four rows into
  // each 128-bit lane, then the lanes are added, ~13 shuffles/adds instead of 4 full reductions.
  static void dot4(const float* a, const float* b, int64_t stride, int64_t n, float* out) {
    const float* b0 = b;
    const float* b1 = b + stride;
    const float* b2 = b + 2 * stride;
    const float* b3 = b + 3 * stride;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 va = _mm512_loadu_ps(a + i);
      s0 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b0 + i), s0);
      s1 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b1 + i), s1);
      s2 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b2 + i), s2);
      s3 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b3 + i), s3);
    }
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      const __m512 va = _mm512_maskz_loadu_ps(m, a + i);
      s0 = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b0 + i), s0);
      s1 = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b1 + i), s1);
      s2 = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b2 + i), s2);
      s3 = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, b3 + i), s3);
    }
    // Per 128-bit lane: [s0 0+2, s1 0+2, s0 1+3, s1 1+3] and the same for s2, s3.
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(s0, s1), _mm512_unpackhi_ps(s0, s1));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(s2, s3), _mm512_unpackhi_ps(s2, s3));
    // Per lane: [s0, s1, s2, s3] partial sums.
    const __m512 lanes = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))));
    const __m256 halves =
        _mm256_add_ps(_mm512_castps512_ps256(lanes),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1)));
    const __m128 sums =
        _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
    _mm_storeu_ps(out, sums);
  }

  // Columns in chunks of 64 held in registers across all rows (two accumulator sets for even
  // and odd rows, so the FMA chains overlap): out is loaded and stored once per chunk.
  static void weighted_row_sum(const float* weights, const float* rows, int64_t count,
                               int64_t stride, float* out, int64_t n) {
    for (int64_t c = 0; c < n; c += 64) {
      const int64_t width = std::min<int64_t>(64, n - c);
      __mmask16 m[4];
      for (int k = 0; k < 4; ++k) m[k] = tail_mask(std::clamp<int64_t>(width - 16 * k, 0, 16));
      __m512 even[4], odd[4];
      for (int k = 0; k < 4; ++k) {
        even[k] = _mm512_maskz_loadu_ps(m[k], out + c + 16 * k);
        odd[k] = _mm512_setzero_ps();
      }
      int64_t j = 0;
      for (; j + 2 <= count; j += 2) {
        const __m512 w0 = _mm512_set1_ps(weights[j]);
        const __m512 w1 = _mm512_set1_ps(weights[j + 1]);
        const float* r0 = rows + j * stride + c;
        const float* r1 = r0 + stride;
        for (int k = 0; k < 4; ++k) {
          even[k] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m[k], r0 + 16 * k), even[k]);
          odd[k] = _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m[k], r1 + 16 * k), odd[k]);
        }
      }
      if (j < count) {
        const __m512 w0 = _mm512_set1_ps(weights[j]);
        const float* r0 = rows + j * stride + c;
        for (int k = 0; k < 4; ++k)
          even[k] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m[k], r0 + 16 * k), even[k]);
      }
      for (int k = 0; k < 4; ++k)
        _mm512_mask_storeu_ps(out + c + 16 * k, m[k], _mm512_add_ps(even[k], odd[k]));
    }
  }

  static void axpy(float a, const float* x, float* y, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      _mm512_mask_storeu_ps(
          y + i, m,
          _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
  }

  static void scale(float* x, float a, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), va));
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), va));
    }
  }

  static float max(const float* x, int64_t n) {
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 m0 = neg_inf, m1 = neg_inf;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
      m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
    }
    for (; i + 16 <= n; i += 16) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    if (i < n) m1 = _mm512_max_ps(m1, _mm512_mask_loadu_ps(neg_inf, tail_mask(n - i), x + i));
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  }

  // e^x as in Avx2Ops::exp, with scalef doing the 2^k scaling: it handles overflow to inf and
  // gradual underflow to 0 itself, so inputs are only clamped to keep k finite.
  static __m512 exp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-110.0f)), _mm512_set1_ps(89.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
  }

  static float exp(float x) { return _mm512_cvtss_f32(exp(_mm512_set1_ps(x))); }

  static float exp_shifted_sum(float* x, float shift, int64_t n) {
    const __m512 vs = _mm512_set1_ps(shift);
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512 e0 = exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vs));
      const __m512 e1 = exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vs));
      _mm512_storeu_ps(x + i, e0);
      _mm512_storeu_ps(x + i + 16, e1);
      sum0 = _mm512_add_ps(sum0, e0);
      sum1 = _mm512_add_ps(sum1, e1);
    }
    for (; i < n; i += 16) {
      const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
      const __m512 e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vs));
      _mm512_mask_storeu_ps(x + i, m, e);
      sum0 = _mm512_add_ps(sum0, _mm512_maskz_mov_ps(m, e));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
  }

  static float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }

  static void scaled_mul(float* out, const float* x, float s, const float* w, int64_t n) {
    const __m512 vs = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs),
                                              _mm512_loadu_ps(w + i)));
    if (i < n) {
      const __mmask16 m = tail_mask(n - i);
      _mm512_mask_storeu_ps(out + i, m,
                            _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs),
                                          _mm512_maskz_loadu_ps(m, w + i)));
    }
  }
};

#endif  // PROTOKV_HAVE_AVX512

// In-place softmax with the primitives of one instruction set; all -inf gives all zeros.
template <class Ops>
void softmax_with(float* x, int64_t n) {
  if (n <= 0) return;
  const float max_value = Ops::max(x, n);
  if (max_value == -std::numeric_limits<float>::infinity()) {
    std::fill(x, x + n, 0.0f);
    return;
  }
  const float sum = Ops::exp_shifted_sum(x, max_value, n);
  Ops::scale(x, 1.0f / sum, n);
}

}  // namespace protokv::kernels
