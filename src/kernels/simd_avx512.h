// SPDX-License-Identifier: Apache-2.0
#pragma once
// The AVX-512 F/BW/VL/DQ vector primitives (see kernels/simd.h); empty unless compiled for them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/simd_avx2.h"
#include "kernels/simd_features.h"
#include "protokv/dtype.h"

#if defined(PROTOKV_HAVE_AVX512)

namespace protokv::kernels {

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

  // As Avx2Ops::dot_f16 in the order of ggml's AVX-512 ggml_vec_dot_f16 (GGML_F16_STEP 64: four
  // 16-lane accumulators, GGML_F32Cx16_REDUCE, leftovers after the last whole 64 in double). A
  // llama.cpp built for AVX512-FP16 (-march=native on Sapphire Rapids and later) accumulates in
  // FP16 instead; tools/llama_cpp/build.sh builds without it.
  static float dot_f16(const uint16_t* w, const float* x, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    const int64_t whole = n & ~int64_t{63};
    for (int64_t i = 0; i < whole; i += 64) {
      Avx2Ops::prefetch_ahead(w + i, 128);
      s0 = _mm512_fmadd_ps(load_f16(w + i), _mm512_loadu_ps(x + i), s0);
      s1 = _mm512_fmadd_ps(load_f16(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
      s2 = _mm512_fmadd_ps(load_f16(w + i + 32), _mm512_loadu_ps(x + i + 32), s2);
      s3 = _mm512_fmadd_ps(load_f16(w + i + 48), _mm512_loadu_ps(x + i + 48), s3);
    }
    auto sum = static_cast<double>(
        reduce_add_as_gcc(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3))));
    for (int64_t i = whole; i < n; ++i) sum += static_cast<double>(_cvtsh_ss(w[i]) * x[i]);
    return static_cast<float>(sum);
  }

  // One F16 row against an F16-rounded activation (or an F32 row against an F32 one) as
  // llama.cpp's prompt mat-muls take it: llamafile's tinyBLAS (ggml-cpu/llamafile/sgemm.cpp,
  // tinyBLAS<16, __m512, ...>) keeps one 16-lane FMA accumulator over the row (n a multiple of
  // 16) and ends with hsum, GCC's _mm512_reduce_add_ps.
  static constexpr int kTinyBlasLanes = 16;
  static float tinyblas_dot_f16(const uint16_t* w, const float* x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16)
      acc = _mm512_fmadd_ps(load_f16(w + i), _mm512_loadu_ps(x + i), acc);
    return reduce_add_as_gcc(acc);
  }
  static float tinyblas_dot_f32(const float* w, const float* x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), acc);
    return reduce_add_as_gcc(acc);
  }

  // _mm512_reduce_add_ps in GCC's order (its avx512fintrin.h, which the llama.cpp that
  // tools/llama_cpp/build.sh compiles uses): upper + lower 256 bits, then 128, then lanes 2,3 onto
  // 0,1, then lane 0 + lane 1. Spelled out so that another compiler's reduction order cannot
  // change a result.
  static float reduce_add_as_gcc(__m512 v) {
    const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 half = _mm256_add_ps(upper, _mm512_castps512_ps256(v));
    const __m128 quarter = _mm_add_ps(_mm256_extractf128_ps(half, 1), _mm256_castps256_ps128(half));
    const __m128 pairs =
        _mm_add_ps(quarter, _mm_shuffle_ps(quarter, quarter, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
  }

  static void round_to_f16(const float* x, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
    Avx2Ops::round_to_f16(x + i, out + i, n - i);
  }

  static float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      Avx2Ops::prefetch_ahead(w + i, 128);
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

  // sum_g scale[g] * (q_g . x_g) over groups of 16 (see ScalarOps::dot_q_groups): the AVX2
  // kernel (exact int32 either way). A 64-values-per-step AVX-512 version (maddubs, vpermw to
  // spread the scales, VNNI vpdpwssd, one 512-bit reduction per block) ran the Q4_K mat-vec at
  // less than half the AVX2 one's speed on an AVX-512 Xeon (BM_Matvec 11008 x 4096, one thread:
  // 3.9 / 3.6 against 8.1 / 7.8 GB/s with this; docs/python.md), so it was removed.
  static int32_t dot_q_groups(const uint8_t* q, const int8_t* x, const int16_t* scale, int n) {
    return Avx2Ops::dot_q_groups(q, x, scale, n);
  }

  // The K-quants against the K-quant activation: the AVX2 kernels (see dot_q_groups for why not
  // a 512-bit one).
  template <class Block>
  static float dot_kquant_q8_K(const Block* w, const int8_t* x, const float* x_scale,
                               const int16_t* x_sums, int64_t n_blocks) {
    return Avx2Ops::dot_kquant_q8_K(w, x, x_scale, x_sums, n_blocks);
  }

  // Q8_0 weights against int8 activations (see Avx2Ops::dot_q8_0_int8); with VNNI one
  // vpdpbusd replaces maddubs + madd.
  static float dot_q8_0_int8(const BlockQ8_0* w, const int8_t* x, const float* x_scale,
                             int64_t n_blocks) {
#if defined(__AVX512VNNI__)
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      Avx2Ops::prefetch_ahead(w + b);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].quants));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * b));
      const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q, q),
                                              _mm256_sign_epi8(xb, q));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                            _mm256_set1_ps(_cvtsh_ss(w[b].scale) * x_scale[b]), acc);
    }
    return Avx2Ops::hsum(acc);
#else
    return Avx2Ops::dot_q8_0_int8(w, x, x_scale, n_blocks);
#endif
  }

  // Legacy weights against ggml's Q8_0 / Q8_1 blocks: the AVX2 kernels. ggml's AVX-512 builds
  // run the same 256-bit vec_dot (their VNNI dpbusd gives the same int32 lanes), so the F32
  // rounding stays llama.cpp's.
  static void dot8_q4_0_q8_0(const BlockQ4_0* rows, int64_t row_stride, const int8_t* x,
                             const float* xd, const int16_t* x_sums, int64_t n_blocks, float* out) {
    Avx2Ops::dot8_q4_0_q8_0(rows, row_stride, x, xd, x_sums, n_blocks, out);
  }
  // Avx2Ops::legacy_lanes_tile's arithmetic with two tokens per 512-bit register (lanes 0-7 the
  // first token's 8 lanes, 8-15 the second's: each lane still accumulates its own (row, token)
  // block after block), the rows' unsigned values broadcast to both halves and VNNI dpbusd
  // starting from the lane inits (Q8_0's int8 values become unsigned by +128, its inits being
  // -128 * the lane sums). An odd token count runs the last token through the AVX2 tile.
  template <int R, int T, bool kSigned, bool kMins>
  static void legacy_lanes_tile(const uint8_t* w, int64_t w_stride, const float* dw,
                                const float* wm, const int8_t* x, int64_t x_stride, const float* xd,
                                const float* xs, const int32_t* x_init, int64_t n_blocks,
                                float* out) {
#if defined(__AVX512VNNI__)
    if constexpr (T % 2 == 0) {
      constexpr int P = T / 2;
      __m512 acc[R][P];
      float mins[R][T];
      for (int r = 0; r < R; ++r) {
        for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
        for (int t = 0; t < T; ++t) mins[r][t] = 0.0f;
      }
      for (int64_t b = 0; b < n_blocks; ++b) {
        __m512i values[R];
        for (int r = 0; r < R; ++r) {
          values[r] = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * w_stride + 32 * b)));
          if constexpr (kSigned) values[r] = _mm512_xor_si512(values[r], _mm512_set1_epi8(-128));
        }
        for (int p = 0; p < P; ++p) {
          const int t0 = 2 * p, t1 = 2 * p + 1;
          auto both = [&](const void* a, const void* c) {
            return _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(a))),
                _mm256_loadu_si256(static_cast<const __m256i*>(c)), 1);
          };
          const __m512i xb = both(x + t0 * x_stride + 32 * b, x + t1 * x_stride + 32 * b);
          const __m512i init =
              both(x_init + (t0 * n_blocks + b) * 8, x_init + (t1 * n_blocks + b) * 8);
          const __m512 d_x =
              _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(xd[t0 * n_blocks + b])),
                                 _mm256_set1_ps(xd[t1 * n_blocks + b]), 1);
          for (int r = 0; r < R; ++r) {
            const __m512 d = _mm512_mul_ps(_mm512_set1_ps(dw[r * n_blocks + b]), d_x);
            acc[r][p] = _mm512_fmadd_ps(
                d, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, values[r], xb)), acc[r][p]);
          }
        }
        if constexpr (kMins)
          for (int r = 0; r < R; ++r)
            for (int t = 0; t < T; ++t)
              mins[r][t] = std::fma(wm[r * n_blocks + b], xs[t * n_blocks + b], mins[r][t]);
      }
      for (int r = 0; r < R; ++r)
        for (int p = 0; p < P; ++p) {
          const float low = Avx2Ops::hsum(_mm512_castps512_ps256(acc[r][p]));
          const float high = Avx2Ops::hsum(_mm512_extractf32x8_ps(acc[r][p], 1));
          out[r * T + 2 * p] = kMins ? low + mins[r][2 * p] : low;
          out[r * T + 2 * p + 1] = kMins ? high + mins[r][2 * p + 1] : high;
        }
      return;
    }
#endif
    Avx2Ops::legacy_lanes_tile<R, T, kSigned, kMins>(w, w_stride, dw, wm, x, x_stride, xd, xs,
                                                     x_init, n_blocks, out);
  }
  // 32 vector registers: 12 accumulators of 4 rows x 6 tokens (3 pairs).
  static constexpr int kLegacyPrefillRows = 4;
  static constexpr int kLegacyPrefillTokens = 6;
  template <int T>
  static void q4_0_rows8_tokens(const uint8_t* panel, const float* dw, const int8_t* x,
                                int64_t x_stride, const float* xd, const int32_t* x_neg8,
                                int64_t n_blocks, float* out) {
    Avx2Ops::q4_0_rows8_tokens<T>(panel, dw, x, x_stride, xd, x_neg8, n_blocks, out);
  }
  // 32 vector registers (AVX-512VL): 8 tokens' isums and accumulators, 256-bit VNNI dpbusd.
  static constexpr int kQ4_0PrefillTokens = 8;
  static float dot_q4_0_q8_0(const BlockQ4_0* w, const int8_t* x, const float* xd,
                             int64_t n_blocks) {
    return Avx2Ops::dot_q4_0_q8_0(w, x, xd, n_blocks);
  }
  static float dot_q5_0_q8_0(const BlockQ5_0* w, const int8_t* x, const float* xd,
                             int64_t n_blocks) {
    return Avx2Ops::dot_q5_0_q8_0(w, x, xd, n_blocks);
  }
  static float dot_q4_1_q8_1(const BlockQ4_1* w, const int8_t* x, const float* xd, const float* xs,
                             int64_t n_blocks) {
    return Avx2Ops::dot_q4_1_q8_1(w, x, xd, xs, n_blocks);
  }
  static float dot_q5_1_q8_1(const BlockQ5_1* w, const int8_t* x, const float* xd, const float* xs,
                             int64_t n_blocks) {
    return Avx2Ops::dot_q5_1_q8_1(w, x, xd, xs, n_blocks);
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
      case DType::Q4_0:
      case DType::Q4_1:
      case DType::Q5_0:
      case DType::Q5_1:
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K:
        Avx2Ops::to_f32(type, src, dst, n);
        return;
      default:  // the other quantised types: the portable unpacking
        dequantize_row(type, src, dst, n);
        return;
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

  static float exp(float x) {
    return _mm512_cvtss_f32(exp(_mm512_set1_ps(x)));
  }

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

  // llama.cpp's arithmetic (kernels/llama_cpp_order.h, whose portable functions these equal for
  // Isa::kAvx512, to the bit): ggml_vec_dot_f32, ggml_v_expf and the softmax sums of ggml-cpu
  // built for AVX-512.
  static constexpr int kGgmlLanes = 16;
  static constexpr bool kGgmlHaddReduce = false;
  static float dot_f32_as_ggml(const float* x, const float* y, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    const int64_t whole = n & ~int64_t{63};
    for (int64_t i = 0; i < whole; i += 64) {
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), s0);
      s1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), s1);
      s2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), s2);
      s3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), s3);
    }
    float sum = reduce_add_as_gcc(_mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3)));
    return Avx2Ops::dot_f32_leftovers_as_gcc(x, y, whole, n, 8, sum);
  }
  // ggml_v_expf (AVX-512 form): see exp_avx512_lane in kernels/llama_cpp_order.cpp.
  static __m512 exp_as_ggml(__m512 x) {
    const __m512 shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
    const __m512 n = _mm512_sub_ps(z, shift);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 special =
        _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
            _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 result = _mm512_scalef_ps(j, n);
    if (special == 0) return result;
    const __m512 zero = _mm512_setzero_ps();
    const __m512 saturated = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ),
                                                  _mm512_set1_ps(INFINITY), zero);
    return _mm512_mask_blend_ps(special, result, saturated);
  }
  // x[i] = exp(x[i] - max) as ggml_vec_soft_max_f32, returning its sum: each vector of 16 (the
  // last padded with zeros, as llama.cpp's masked cells) summed by _mm512_reduce_add_ps into a
  // double.
  static double exp_sum_as_ggml(float* x, float max, int64_t n) {
    double sum = 0.0;
    const __m512 vmax = _mm512_set1_ps(max);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
      const __m512 e =
          _mm512_maskz_mov_ps(m, exp_as_ggml(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax)));
      _mm512_mask_storeu_ps(x + i, m, e);
      sum += static_cast<double>(reduce_add_as_gcc(e));
    }
    return sum;
  }
  // ggml_vec_swiglu_f32: x / (1 + ggml_v_expf(-x)) * g on whole vectors, expf on the rest.
  static void swiglu_as_ggml(float* gate, const float* up, int64_t n) {
    int64_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
      const __m512 x = _mm512_loadu_ps(gate + i);
      const __m512 e = exp_as_ggml(_mm512_sub_ps(_mm512_setzero_ps(), x));
      _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)),
                                               _mm512_loadu_ps(up + i)));
    }
    ScalarOps::swiglu_as_ggml(gate + i, up + i, n - i);
  }
};

}  // namespace protokv::kernels

#endif  // PROTOKV_HAVE_AVX512
