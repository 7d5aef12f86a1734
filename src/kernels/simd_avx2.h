// SPDX-License-Identifier: Apache-2.0
#pragma once
// The AVX2 + FMA + F16C vector primitives (see kernels/simd.h); empty unless compiled for them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/quant_blocks.h"
#include "kernels/simd_features.h"
#include "kernels/simd_scalar.h"
#include "protokv/dtype.h"

#if defined(PROTOKV_HAVE_AVX2)

namespace protokv::kernels {

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

  // Weight streams ask for the bytes kPrefetchBytes ahead of the ones being multiplied: with the
  // hardware prefetchers alone a one-thread F16 mat-vec read 15 GB/s, with this 21-22 (BM_Matvec,
  // 11008 x 4096 F16 on a Xeon with a 260 MB L3), and the 2-thread random F16 model decoded 79 ->
  // 103 tokens/s. One call per 64 bytes consumed (a block shorter than that: one per block).
  static constexpr int64_t kPrefetchBytes = 4096;
  // The address is computed as an integer: it may lie past the end of the stream (a prefetch
  // never faults), where a pointer may not point.
  static void prefetch_ahead(const void* p, int64_t bytes = 1) {
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(p) + kPrefetchBytes;
    for (int64_t offset = 0; offset < bytes; offset += 64)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + static_cast<uintptr_t>(offset)),
                   _MM_HINT_T0);
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

  // F16 weights against an F16 activation (see ScalarOps::dot_f16) in the order of ggml's AVX2
  // ggml_vec_dot_f16 (GGML_F16_STEP 32: four 8-lane F32 accumulators, GGML_F32x8_REDUCE, the
  // leftovers after the last whole 32 added in double), so that a row rounds as llama.cpp's.
  static float dot_f16(const uint16_t* w, const float* x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    const int64_t whole = n & ~int64_t{31};
    for (int64_t i = 0; i < whole; i += 32) {
      prefetch_ahead(w + i);
      s0 = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(x + i), s0);
      s1 = _mm256_fmadd_ps(load_f16(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
      s2 = _mm256_fmadd_ps(load_f16(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
      s3 = _mm256_fmadd_ps(load_f16(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    const __m256 r = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    auto sum = static_cast<double>(_mm_cvtss_f32(_mm_hadd_ps(t1, t1)));
    for (int64_t i = whole; i < n; ++i) sum += static_cast<double>(_cvtsh_ss(w[i]) * x[i]);
    return static_cast<float>(sum);
  }

  // As Avx512Ops::tinyblas_dot_f16 / _f32 for tinyBLAS<8, __m256, ...> (n a multiple of 8): its
  // hsum adds the upper 128 bits to the lower, then (l0 + l2) + (l1 + l3).
  static constexpr int kTinyBlasLanes = 8;
  static float tinyblas_dot_f16(const uint16_t* w, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
      acc = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(x + i), acc);
    return tinyblas_hsum(acc);
  }
  static float tinyblas_dot_f32(const float* w, const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc);
    return tinyblas_hsum(acc);
  }
  static float tinyblas_hsum(__m256 acc) {
    __m128 t = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }

  static void round_to_f16(const float* x, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; ++i) out[i] = f16_to_f32(f32_to_f16(x[i]));
  }

  static float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      prefetch_ahead(w + i);
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

  static int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
  }

  // sum_g scale[g] * (q_g . x_g) over the n / 16 groups of 16 (see ScalarOps::dot_q_groups);
  // q <= 63, so maddubs's int16 pair sums (<= 2 * 63 * 127) cannot saturate.
  static int32_t dot_q_groups(const uint8_t* q, const int8_t* x, const int16_t* scale, int n) {
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < n; i += 32) {
      const __m256i pairs =
          _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
      const __m256i scales =
          _mm256_set_m128i(_mm_set1_epi16(scale[i / 16 + 1]), _mm_set1_epi16(scale[i / 16]));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scales));
    }
    return hsum_epi32(acc);
  }

  // K-quant weights (Q2_K ... Q6_K) against the K-quant int8 activation (quant_matvec.h's
  // quantize_activation: a scale per 256 values, the int16 sum of each group of 16), unpacking the
  // 2- to 6-bit values in registers as ggml's vec_dot_q*_K_q8_K do, instead of through
  // UnpackedBlock in memory (dot_quantized_row). Per block the integer sums are exactly
  // dot_quantized_row's (scaled_dot = sum_g scale[g] * (q_g . x_g), min_dot = sum_g min[g] *
  // sum(x_g)); their F32 combination runs in 8 lanes summed once per row, so the result differs
  // from dot_quantized_row's in the last bits only.
  template <class Block>
  static float dot_kquant_q8_K(const Block* w, const int8_t* x, const float* x_scale,
                               const int16_t* x_sums, int64_t n_blocks) {
    if constexpr (std::is_same_v<Block, BlockQ4_K> || std::is_same_v<Block, BlockQ5_K>) {
      return dot_k4_q8_K(w, x, x_scale, x_sums, n_blocks);
    } else if constexpr (std::is_same_v<Block, BlockQ6_K>) {
      return dot_q6_q8_K(w, x, x_scale, x_sums, n_blocks);
    } else {
      static_assert(std::is_same_v<Block, BlockQ2_K> || std::is_same_v<Block, BlockQ3_K>,
                    "not a K-quant block");
      return dot_k2_q8_K(w, x, x_scale, x_sums, n_blocks);
    }
  }

  // Q4_K and Q5_K with ggml's division of the work (ggml_vec_dot_q4_K_q8_K): a block's 8 scales
  // and 8 mins come out of their 12 packed bytes with a few integer operations on three words
  // (the same values as quant::k4_scale_min), the mins meet the activation's sums of 32 in one
  // madd, each scale reaches the 16-bit lanes of its 32 values by a byte shuffle, and the block's
  // int32 lanes are converted and added by FMA: one horizontal sum per row, not per block. The
  // integer sums per sub-block are dot_quantized_row's; only the F32 order differs.
  template <class Block>
  static float dot_k4_q8_K(const Block* w, const int8_t* x, const float* x_scale,
                           const int16_t* x_sums, int64_t n_blocks) {
    constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5_K>;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_min = _mm_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const Block& block = w[b];
      prefetch_ahead(&block, sizeof(Block));
      const int8_t* xb = x + kQkK * b;
      uint32_t unpacked[4];
      k4_scales_mins(block.scales, unpacked);
      const __m256i scales_mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(unpacked)));  // 8 scales, then 8 mins (int16)
      // The activation's sums of 32 values (<= 32 * 128: no int16 overflow) times the mins.
      const __m256i sums16 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_sums + kQkK / 16 * b));
      const __m128i sums32 =
          _mm_hadd_epi16(_mm256_castsi256_si128(sums16), _mm256_extracti128_si256(sums16, 1));
      const __m128i min_dot = _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), sums32);
      acc_min = _mm_fmadd_ps(_mm_set1_ps(x_scale[b] * _cvtsh_ss(block.dmin)),
                             _mm_cvtepi32_ps(min_dot), acc_min);
      const __m128i scales128 = _mm256_castsi256_si128(scales_mins);
      const __m256i scales = _mm256_set_m128i(scales128, scales128);
      [[maybe_unused]] __m256i qh;
      if constexpr (kFifthBit) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh));
      __m256i sum = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        const __m256i bits =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qs + 32 * j));
        __m256i low = _mm256_and_si256(bits, low4);
        __m256i high = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
        if constexpr (kFifthBit) {
          low = _mm256_or_si256(low, bit_as(qh, 2 * j, 0x10));
          high = _mm256_or_si256(high, bit_as(qh, 2 * j + 1, 0x10));
        }
        // Scale 2j (low nibbles) and 2j + 1 (high nibbles) in every 16-bit lane.
        const __m256i scale_low = _mm256_shuffle_epi8(
            scales, _mm256_broadcastsi128_si256(broadcast_epi16_control(2 * j)));
        const __m256i scale_high = _mm256_shuffle_epi8(
            scales, _mm256_broadcastsi128_si256(broadcast_epi16_control(2 * j + 1)));
        // q <= 31 and |x| <= 128: maddubs's pair sums fit int16; scale <= 63 keeps madd in int32.
        const __m256i x_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 64 * j));
        const __m256i x_high =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 64 * j + 32));
        sum = _mm256_add_epi32(
            sum,
            _mm256_add_epi32(_mm256_madd_epi16(scale_low, _mm256_maddubs_epi16(low, x_low)),
                             _mm256_madd_epi16(scale_high, _mm256_maddubs_epi16(high, x_high))));
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(x_scale[b] * _cvtsh_ss(block.d)),
                            _mm256_cvtepi32_ps(sum), acc);
    }
    __m128 mins = _mm_add_ps(acc_min, _mm_movehl_ps(acc_min, acc_min));
    mins = _mm_add_ss(mins, _mm_movehdup_ps(mins));
    return hsum(acc) - _mm_cvtss_f32(mins);
  }

  // Q4_K / Q5_K's 8 six-bit scales and 8 six-bit mins out of their 12 packed bytes with integer
  // operations on three words (the values of quant::k4_scale_min): bytes 0-7 of `unpacked` are
  // scales 0-7, bytes 8-15 mins 0-7.
  static void k4_scales_mins(const uint8_t* packed_bytes, uint32_t unpacked[4]) {
    constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    uint32_t packed[3];
    std::memcpy(packed, packed_bytes, sizeof(packed));
    unpacked[0] = packed[0] & kLow6;                                               // scales 0-3
    unpacked[1] = (packed[2] & kLow4) | (((packed[0] >> 6) & kLow2) << 4);         // scales 4-7
    unpacked[2] = packed[1] & kLow6;                                               // mins 0-3
    unpacked[3] = ((packed[2] >> 4) & kLow4) | (((packed[1] >> 6) & kLow2) << 4);  // mins 4-7
  }

  // The byte-shuffle control that copies 16-bit element e of each 128-bit lane to all of its
  // lane's 16-bit elements.
  static __m128i broadcast_epi16_control(int e) {
    return _mm_set1_epi16(static_cast<int16_t>(0x0100 * (2 * e + 1) + 2 * e));
  }

  // Q6_K in ggml's manner (ggml_vec_dot_q6_K_q8_K): the 16 signed scales widened once per block,
  // the offset 32 (a min of 32 * scale) dotted with the activation's sums of 16 in one madd and
  // taken off the block's int32 lanes (|lanes| < 2^31 for any block), each pair of scales
  // shuffled into the two 128-bit lanes of its 32 values, one FMA per block and one horizontal
  // sum per row. The same integer sum per block as dot_quantized_row with UnpackQ6_K.
  static float dot_q6_q8_K(const BlockQ6_K* w, const int8_t* x, const float* x_scale,
                           const int16_t* x_sums, int64_t n_blocks) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ6_K& block = w[b];
      prefetch_ahead(&block, sizeof(BlockQ6_K));
      const int8_t* xb = x + kQkK * b;
      const __m256i scales =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block.scales)));
      const __m256i sums16 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_sums + kQkK / 16 * b));
      __m256i sum = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_slli_epi32(_mm256_madd_epi16(scales, sums16), 5));
      for (int h = 0; h < 2; ++h) {
        const __m256i half_scales = _mm256_broadcastsi128_si256(
            h == 0 ? _mm256_castsi256_si128(scales) : _mm256_extracti128_si256(scales, 1));
        __m256i q[4];
        q6_half(block, h, q);
        for (int k = 0; k < 4; ++k) {
          // Scale 8h + 2k for the first 16 values (low lane), 8h + 2k + 1 for the next 16.
          const __m256i scale = scale_pair(half_scales, k);
          const __m256i xk =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 128 * h + 32 * k));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q[k], xk)));
        }
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(x_scale[b] * _cvtsh_ss(block.d)),
                            _mm256_cvtepi32_ps(sum), acc);
    }
    return hsum(acc);
  }

  // The 6-bit values of half h (128 values) of a Q6_K block: q[k] holds values 128 h + 32 k ..
  // + 31, the low 4 bits from ql (low nibbles for k < 2, high for k >= 2), the top 2 from bits
  // 2k..2k+1 of qh (ggml's layout).
  static void q6_half(const BlockQ6_K& block, int h, __m256i q[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), top2 = _mm256_set1_epi8(0x30);
    const auto* ql = block.ql + 64 * h;
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh + 32 * h));
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                           _mm256_and_si256(qh, top2));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2));
  }

  // The scale of value 16 g + i (i < 16) of 32 values starting at value 128 h + 32 j, in every
  // 16-bit element: scale 8 h + 2 j in the low 128-bit lane, 8 h + 2 j + 1 in the high one, from
  // the block's 16 scales [16] (int16) with the half h already broadcast to both lanes.
  static __m256i scale_pair(__m256i half_scales, int j) {
    return _mm256_shuffle_epi8(half_scales, _mm256_set_m128i(broadcast_epi16_control(2 * j + 1),
                                                             broadcast_epi16_control(2 * j)));
  }

  // Q2_K and Q3_K in ggml's manner (ggml_vec_dot_q2_K_q8_K / q3_K): the 16 scales (and Q2_K's
  // 16 mins) widened once per block (Q3_K's 6-bit scales out of their 12 packed bytes with
  // integer operations on three words, the values of quant::q3k_scale), the mins dotted with the
  // activation's sums of 16 in one madd (Q3_K's offset 4 is a min of 4 * scale, taken off the
  // int32 lanes), one FMA per block and one horizontal sum per row. The same integer sums per
  // block as dot_quantized_row with UnpackQ2_K / UnpackQ3_K.
  template <class Block>
  static float dot_k2_q8_K(const Block* w, const int8_t* x, const float* x_scale,
                           const int16_t* x_sums, int64_t n_blocks) {
    constexpr bool kQ3 = std::is_same_v<Block, BlockQ3_K>;
    const __m256i low2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    [[maybe_unused]] __m256 acc_min = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const Block& block = w[b];
      prefetch_ahead(&block, sizeof(Block));
      const int8_t* xb = x + kQkK * b;
      const __m256i sums16 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_sums + kQkK / 16 * b));
      __m256i scales, sum;
      if constexpr (kQ3) {
        constexpr uint32_t kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
        uint32_t packed[3], unpacked[4];
        std::memcpy(packed, block.scales, sizeof(packed));
        unpacked[0] = (packed[0] & kLow4) | ((packed[2] & kLow2) << 4);
        unpacked[1] = (packed[1] & kLow4) | (((packed[2] >> 2) & kLow2) << 4);
        unpacked[2] = ((packed[0] >> 4) & kLow4) | (((packed[2] >> 4) & kLow2) << 4);
        unpacked[3] = ((packed[1] >> 4) & kLow4) | (((packed[2] >> 6) & kLow2) << 4);
        scales = _mm256_sub_epi16(
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(unpacked))),
            _mm256_set1_epi16(32));
        sum = _mm256_sub_epi32(_mm256_setzero_si256(),
                               _mm256_slli_epi32(_mm256_madd_epi16(scales, sums16), 2));
      } else {
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.scales));
        const __m128i low4 = _mm_set1_epi8(0x0f);
        scales = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
        acc_min = _mm256_fmadd_ps(_mm256_set1_ps(x_scale[b] * _cvtsh_ss(block.dmin)),
                                  _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, sums16)), acc_min);
        sum = _mm256_setzero_si256();
      }
      [[maybe_unused]] __m256i hmask;
      if constexpr (kQ3) hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.hmask));
      for (int h = 0; h < 2; ++h) {
        const __m256i half_scales = _mm256_broadcastsi128_si256(
            h == 0 ? _mm256_castsi256_si128(scales) : _mm256_extracti128_si256(scales, 1));
        const __m256i bits =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qs + 32 * h));
        for (int j = 0; j < 4; ++j) {
          __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * j), low2);
          if constexpr (kQ3) q = _mm256_or_si256(q, bit_as(hmask, 4 * h + j, 0x04));
          const __m256i xj =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 128 * h + 32 * j));
          sum = _mm256_add_epi32(
              sum, _mm256_madd_epi16(scale_pair(half_scales, j), _mm256_maddubs_epi16(q, xj)));
        }
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(x_scale[b] * _cvtsh_ss(block.d)),
                            _mm256_cvtepi32_ps(sum), acc);
    }
    if constexpr (kQ3) return hsum(acc);
    return hsum(acc) - hsum(acc_min);
  }

  // 0x10 (Q5_K's fifth bit) or 0x04 (Q3_K's third) in each byte of `bits` whose bit `bit` is set.
  static __m256i bit_as(__m256i bits, int bit, char value) {
    const __m256i mask = _mm256_set1_epi8(static_cast<char>(1 << bit));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask),
                            _mm256_set1_epi8(value));
  }

  // sum over i of q_i x_i for 32 int8 pairs as 8 int32 lanes: the sign of x moves onto |q| so
  // maddubs (unsigned x signed) applies; |q| <= 128 keeps its pair sums below 2^15.
  static __m256i dot_i8x32(__m256i q, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }

  // Q8_0 weights against int8 activations in blocks of 32 with scales x_scale.
  static float dot_q8_0_int8(const BlockQ8_0* w, const int8_t* x, const float* x_scale,
                             int64_t n_blocks) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      prefetch_ahead(w + b);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].quants));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * b));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_i8x32(q, xb)),
                            _mm256_set1_ps(_cvtsh_ss(w[b].scale) * x_scale[b]), acc);
    }
    return hsum(acc);
  }

  // sum over i of q_i x_i for 32 pairs of unsigned q (<= 31 here, so maddubs's pair sums cannot
  // saturate) and int8 x, as 8 int32 lanes of 4 consecutive pairs (ggml's mul_sum_us8_pairs).
  static __m256i dot_u8i8x32(__m256i q, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
  }

  // The 32 nibbles of a legacy block as bytes in value order: value j is the low nibble of qs[j]
  // for j < 16, the high nibble of qs[j - 16] after (ggml's bytes_from_nibbles_32).
  static __m256i legacy_nibbles(const uint8_t* qs) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed),
                            _mm256_set1_epi8(0x0f));
  }

  // 0xff in byte j where bit j of the little-endian uint32 qh (Q5_0 / Q5_1's fifth bits) is set,
  // 0 elsewhere: byte j takes byte j / 8 of qh, then keeps its bit j % 8.
  static __m256i legacy_high_bits(const uint8_t* qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  }

  // Legacy weights against ggml's Q8_0 / Q8_1 activation blocks (see ScalarOps::dot_q4_0_q8_0):
  // ggml's x86 ggml_vec_dot_q4_0_q8_0 ... ggml_vec_dot_q5_1_q8_1 arithmetic, so that a row's F32
  // result is llama.cpp's to the bit. Per block, the int32 dot as 8 lanes of 4 consecutive values,
  // converted to F32 and accumulated by one FMA with d_w * d_x into 8 running lanes; Q4_1 / Q5_1
  // also accumulate m_w * s_x in one scalar by FMA (ggml's summs += m * s, which GCC contracts
  // under ggml's -std=gnu11: vfmadd231ss in llama.cpp's own object); at the end the 8 lanes are
  // summed (hsum, ggml's hsum_float_8) and the scalar added.
  static float dot_q4_0_q8_0(const BlockQ4_0* w, const int8_t* x, const float* xd,
                             int64_t n_blocks) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      prefetch_ahead(w + b);
      const __m256i q = _mm256_sub_epi8(legacy_nibbles(w[b].qs), _mm256_set1_epi8(8));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * b));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[b].d) * xd[b]),
                            _mm256_cvtepi32_ps(dot_i8x32(q, xb)), acc);
    }
    return hsum(acc);
  }

  // Eight Q4_0 rows (row r's blocks at rows + r * row_stride) against one ggml Q8_0 activation,
  // with the arithmetic llama.cpp runs on AVX2 CPUs for Q4_0 matrices of a multiple of 8 rows: it
  // repacks them into 8-row interleaved blocks (ggml-cpu repack.cpp, q4_0_8x8_q8_0) and its gemv
  // (gemv_q4_b32_8x8_q8_0_lut_avx) keeps the 8 rows in the lanes of one F32 accumulator, so that
  // per row, block after block, acc = fma(float(isum), d_w * d_x, acc) with the block's exact
  // int32 dot isum. Here the rows stay in place: each block's 8 x 16 bytes are transposed in
  // registers into 4-byte groups of the 8 rows (one row per 32-bit lane), their nibbles multiplied
  // as unsigned bytes (VNNI where the build has it) with the activation's 4-byte groups, and
  // 8 * (the block's sum of x) taken off, which is the dot with q - 8. x_sums: the activation's
  // int16 sums of 16 (quantize_activation_ggml_q8).
  static void dot8_q4_0_q8_0(const BlockQ4_0* rows, int64_t row_stride, const int8_t* x,
                             const float* xd, const int16_t* x_sums, int64_t n_blocks, float* out) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const BlockQ4_0* block = rows + b;
      if (b % 3 == 0)  // 54 bytes of each row: no cache line is skipped
        for (int r = 0; r < 8; ++r) prefetch_ahead(block + r * row_stride);
      auto qs = [&](int r) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(block[r * row_stride].qs));
      };
      // Row r's 16 bytes (4 dwords) in the low half, row r + 4's in the high half.
      const __m256i a0 = _mm256_inserti128_si256(_mm256_castsi128_si256(qs(0)), qs(4), 1);
      const __m256i a1 = _mm256_inserti128_si256(_mm256_castsi128_si256(qs(1)), qs(5), 1);
      const __m256i a2 = _mm256_inserti128_si256(_mm256_castsi128_si256(qs(2)), qs(6), 1);
      const __m256i a3 = _mm256_inserti128_si256(_mm256_castsi128_si256(qs(3)), qs(7), 1);
      const __m256i t0 = _mm256_unpacklo_epi32(a0, a1), t1 = _mm256_unpacklo_epi32(a2, a3);
      const __m256i t2 = _mm256_unpackhi_epi32(a0, a1), t3 = _mm256_unpackhi_epi32(a2, a3);
      // groups[k]: bytes 4k..4k+3 of rows 0..7 (values 4k..4k+3 in the low nibbles, 16 + 4k ..
      // 16 + 4k + 3 in the high ones).
      const __m256i groups[4] = {_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1),
                                 _mm256_unpacklo_epi64(t2, t3), _mm256_unpackhi_epi64(t2, t3)};
      const int8_t* xb = x + 32 * b;
      __m256i isum = _mm256_set1_epi32(-8 * (x_sums[2 * b] + x_sums[2 * b + 1]));
      for (int k = 0; k < 4; ++k) {
        int32_t x_low, x_high;
        std::memcpy(&x_low, xb + 4 * k, 4);
        std::memcpy(&x_high, xb + 16 + 4 * k, 4);
        isum = dot_u8i8_add(isum, _mm256_and_si256(groups[k], low4), _mm256_set1_epi32(x_low));
        isum = dot_u8i8_add(isum, _mm256_and_si256(_mm256_srli_epi16(groups[k], 4), low4),
                            _mm256_set1_epi32(x_high));
      }
      const __m128i d16 = _mm_setr_epi16(static_cast<int16_t>(block[0].d),
                                         static_cast<int16_t>(block[row_stride].d),
                                         static_cast<int16_t>(block[2 * row_stride].d),
                                         static_cast<int16_t>(block[3 * row_stride].d),
                                         static_cast<int16_t>(block[4 * row_stride].d),
                                         static_cast<int16_t>(block[5 * row_stride].d),
                                         static_cast<int16_t>(block[6 * row_stride].d),
                                         static_cast<int16_t>(block[7 * row_stride].d));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                            _mm256_mul_ps(_mm256_cvtph_ps(d16), _mm256_set1_ps(xd[b])), acc);
    }
    _mm256_storeu_ps(out, acc);
  }

  // Prefill's tile for the legacy types' lane form: R rows times T tokens with, per (row, token),
  // the arithmetic of dot_q8_0_int8 / dot_q4_0_q8_0 ... dot_q5_1_q8_1 exactly: 8 F32 lanes, lane l
  // accumulating fma(d_w * d_x, int32 dot of values 4l .. 4l + 3), block after block, then hsum,
  // plus (kMins) the FMA-accumulated m_w * s_x. The rows come unpacked once for every token
  // (matvec_rows' pack_legacy_rows): row r's block b is 32 bytes at w + r * w_stride + 32 * b, its
  // scale dw[r * n_blocks + b], its min wm[r * n_blocks + b]. kSigned: the bytes are the int8
  // values (Q8_0; sign trick); else unsigned u with value u - offset, and token t's lane init
  // x_init[(t * n_blocks + b) * 8 + l] = -offset * (its 4 values of lane l), which the dot starts
  // from. Token t's ggml Q8_0 / Q8_1 values start at x + t * x_stride, its block scales at
  // xd + t * n_blocks, its s at xs + t * n_blocks. out [R][T].
  template <int R, int T, bool kSigned, bool kMins>
  static void legacy_lanes_tile(const uint8_t* w, int64_t w_stride, const float* dw,
                                const float* wm, const int8_t* x, int64_t x_stride, const float* xd,
                                const float* xs, const int32_t* x_init, int64_t n_blocks,
                                float* out) {
    __m256 acc[R][T];
    float mins[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), mins[r][t] = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
      __m256i xb[T], init[T];
      for (int t = 0; t < T; ++t) {
        xb[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * x_stride + 32 * b));
        if constexpr (!kSigned)
          init[t] =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_init + (t * n_blocks + b) * 8));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i u =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * w_stride + 32 * b));
        const float d_w = dw[r * n_blocks + b];
        for (int t = 0; t < T; ++t) {
          if constexpr (kMins)
            mins[r][t] = std::fma(wm[r * n_blocks + b], xs[t * n_blocks + b], mins[r][t]);
          __m256i lanes;
          if constexpr (kSigned)
            lanes = dot_i8x32(u, xb[t]);
          else
            lanes = dot_u8i8_add(init[t], u, xb[t]);
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d_w * xd[t * n_blocks + b]),
                                      _mm256_cvtepi32_ps(lanes), acc[r][t]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        out[r * T + t] = kMins ? hsum(acc[r][t]) + mins[r][t] : hsum(acc[r][t]);
  }
  // Tile of legacy_lanes_tile that 16 ymm registers hold.
  static constexpr int kLegacyPrefillRows = 2;
  static constexpr int kLegacyPrefillTokens = 2;

  // Prefill's Q4_0 tile: 8 rows times T tokens with, per (row, token), dot8_q4_0_q8_0's arithmetic
  // exactly: acc = fma(float(exact block dot), d_w * d_x, acc), block after block. The rows come
  // as a panel unpacked once for every token (matvec_rows' pack_q4_0_rows8): per block 8 groups of
  // [8 rows][4 bytes] of values 0..15, group 2k the values 4k..4k+3 (low nibbles), group 2k + 1
  // the values 16 + 4k .. 16 + 4k + 3 (high nibbles); dw the 8 rows' block scales. Token t's ggml
  // Q8_0 values start at x + t * x_stride, its block scales at xd + t * n_blocks and its blocks'
  // -8 * (sum of values) at x_neg8 + t * n_blocks. out [T][8].
  template <int T>
  static void q4_0_rows8_tokens(const uint8_t* panel, const float* dw, const int8_t* x,
                                int64_t x_stride, const float* xd, const int32_t* x_neg8,
                                int64_t n_blocks, float* out) {
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const auto* groups = reinterpret_cast<const __m256i*>(panel + 256 * b);
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_set1_epi32(x_neg8[t * n_blocks + b]);
      for (int j = 0; j < 8; ++j) {
        const __m256i group = _mm256_loadu_si256(groups + j);
        const int64_t first = 32 * b + (j / 2) * 4 + (j % 2) * 16;
        for (int t = 0; t < T; ++t) {
          int32_t x4;
          std::memcpy(&x4, x + t * x_stride + first, 4);
          isum[t] = dot_u8i8_add(isum[t], group, _mm256_set1_epi32(x4));
        }
      }
      const __m256 dwv = _mm256_loadu_ps(dw + 8 * b);
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                 _mm256_mul_ps(dwv, _mm256_set1_ps(xd[t * n_blocks + b])), acc[t]);
    }
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + 8 * t, acc[t]);
  }
  // Tokens per q4_0_rows8_tokens call: what 16 ymm registers hold (T isums, T accumulators).
  static constexpr int kQ4_0PrefillTokens = 4;

  // acc + the sums of the four products of each 32-bit lane's bytes, u unsigned and s signed
  // (u <= 31 here, so maddubs's pair sums cannot saturate).
  static __m256i dot_u8i8_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
  }

  static float dot_q5_0_q8_0(const BlockQ5_0* w, const int8_t* x, const float* xd,
                             int64_t n_blocks) {
    const __m256i high_clear = _mm256_set1_epi8(static_cast<char>(0xf0));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      prefetch_ahead(w + b);
      // q - 16 in int8: the nibble where the fifth bit is set, the nibble | 0xf0 where it is not.
      const __m256i q = _mm256_or_si256(legacy_nibbles(w[b].qs),
                                        _mm256_andnot_si256(legacy_high_bits(w[b].qh), high_clear));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * b));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[b].d) * xd[b]),
                            _mm256_cvtepi32_ps(dot_i8x32(q, xb)), acc);
    }
    return hsum(acc);
  }

  static float dot_q4_1_q8_1(const BlockQ4_1* w, const int8_t* x, const float* xd, const float* xs,
                             int64_t n_blocks) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
      prefetch_ahead(w + b);
      mins = std::fma(_cvtsh_ss(w[b].m), xs[b], mins);
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * b));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[b].d) * xd[b]),
                            _mm256_cvtepi32_ps(dot_u8i8x32(legacy_nibbles(w[b].qs), xb)), acc);
    }
    return hsum(acc) + mins;
  }

  static float dot_q5_1_q8_1(const BlockQ5_1* w, const int8_t* x, const float* xd, const float* xs,
                             int64_t n_blocks) {
    const __m256i fifth = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
      prefetch_ahead(w + b);
      mins = std::fma(_cvtsh_ss(w[b].m), xs[b], mins);
      const __m256i q = _mm256_or_si256(legacy_nibbles(w[b].qs),
                                        _mm256_and_si256(legacy_high_bits(w[b].qh), fifth));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * b));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[b].d) * xd[b]),
                            _mm256_cvtepi32_ps(dot_u8i8x32(q, xb)), acc);
    }
    return hsum(acc) + mins;
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
      case DType::Q4_0:
        return dequantize_each<BlockQ4_0, kQ4BlockSize, dequantize_legacy<BlockQ4_0>>(src, dst, n);
      case DType::Q4_1:
        return dequantize_each<BlockQ4_1, kQ4BlockSize, dequantize_legacy<BlockQ4_1>>(src, dst, n);
      case DType::Q5_0:
        return dequantize_each<BlockQ5_0, kQ4BlockSize, dequantize_legacy<BlockQ5_0>>(src, dst, n);
      case DType::Q5_1:
        return dequantize_each<BlockQ5_1, kQ4BlockSize, dequantize_legacy<BlockQ5_1>>(src, dst, n);
      case DType::Q4_K:
        return dequantize_each<BlockQ4_K, kQkK, dequantize_k4<BlockQ4_K>>(src, dst, n);
      case DType::Q5_K:
        return dequantize_each<BlockQ5_K, kQkK, dequantize_k4<BlockQ5_K>>(src, dst, n);
      case DType::Q6_K:
        return dequantize_each<BlockQ6_K, kQkK, dequantize_q6>(src, dst, n);
      default:  // the other quantised types: the portable unpacking
        dequantize_row(type, src, dst, n);
        return;
    }
  }

  template <class Block, int kValues, void (*kDequantize)(const Block&, float*)>
  static void dequantize_each(const void* src, float* dst, int64_t n) {
    const auto* blocks = static_cast<const Block*>(src);
    for (int64_t b = 0; b < n / kValues; ++b) kDequantize(blocks[b], dst + kValues * b);
  }

  // dst[0..31] = scale * q - min for 32 values q < 32 (quant::dequantize_blocks' arithmetic). The
  // product is exact (scale = F16 d times a 6-bit scale: at most 17 significant bits, times 5 bits
  // of q), so an FMA the compiler may contract it into rounds as the multiply-then-subtract does.
  static void dequantize_32(__m256i q, float scale, float min, float* dst) {
    const __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(min);
    const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 2; ++k) {
        const __m256 v = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(k == 0 ? halves[h] : _mm_unpackhi_epi64(halves[h], halves[h])));
        _mm256_storeu_ps(dst + 16 * h + 8 * k, _mm256_sub_ps(_mm256_mul_ps(v, s), m));
      }
  }

  // One Q4_K / Q5_K block to F32, bit-identical to quant::dequantize_blocks (prefill converts
  // weight panels with it): value = (d * scale) * q - dmin * min per sub-block of 32.
  template <class Block>
  static void dequantize_k4(const Block& block, float* dst) {
    uint32_t unpacked[4];
    k4_scales_mins(block.scales, unpacked);
    const auto* scales = reinterpret_cast<const uint8_t*>(unpacked);
    const float d = _cvtsh_ss(block.d), dmin = _cvtsh_ss(block.dmin);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    [[maybe_unused]] __m256i qh;
    if constexpr (std::is_same_v<Block, BlockQ5_K>)
      qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh));
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qs + 32 * j));
      __m256i low = _mm256_and_si256(bits, low4);
      __m256i high = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
      if constexpr (std::is_same_v<Block, BlockQ5_K>) {
        low = _mm256_or_si256(low, bit_as(qh, 2 * j, 0x10));
        high = _mm256_or_si256(high, bit_as(qh, 2 * j + 1, 0x10));
      }
      dequantize_32(low, d * static_cast<float>(scales[2 * j]),
                    dmin * static_cast<float>(scales[8 + 2 * j]), dst + 64 * j);
      dequantize_32(high, d * static_cast<float>(scales[2 * j + 1]),
                    dmin * static_cast<float>(scales[8 + 2 * j + 1]), dst + 64 * j + 32);
    }
  }

  // One Q6_K block to F32, bit-identical to quant::dequantize_blocks: value = (d * scale) *
  // (q - 32) per group of 16 (q6_half).
  static void dequantize_q6(const BlockQ6_K& block, float* dst) {
    const float d = _cvtsh_ss(block.d);
    for (int h = 0; h < 2; ++h) {
      __m256i q[4];
      q6_half(block, h, q);
      for (int k = 0; k < 4; ++k) {
        // q - 32 fits int8; each group of 16 has its own scale.
        const __m256i centred = _mm256_sub_epi8(q[k], _mm256_set1_epi8(32));
        for (int g = 0; g < 2; ++g) {
          const int group = 8 * h + 2 * k + g;
          scale_16(g == 0 ? _mm256_castsi256_si128(centred) : _mm256_extracti128_si256(centred, 1),
                   d * static_cast<float>(block.scales[group]), dst + 16 * group);
        }
      }
    }
  }

  // dst[0..15] = scale * q for 16 int8 values.
  static void scale_16(__m128i q, float scale, float* dst) {
    const __m256 s = _mm256_set1_ps(scale);
    _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), s));
    _mm256_storeu_ps(
        dst + 8,
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q))), s));
  }

  // One Q4_0 / Q4_1 / Q5_0 / Q5_1 block to F32, bit-identical to quant::dequantize_blocks:
  // d * (q - offset) for Q4_0 and Q5_0 (offset 8, 16), d * q + m for Q4_1 and Q5_1 (as
  // dequantize_blocks' d * q - (-m)).
  template <class Block>
  static void dequantize_legacy(const Block& block, float* dst) {
    constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5_0> || std::is_same_v<Block, BlockQ5_1>;
    constexpr bool kMin = std::is_same_v<Block, BlockQ4_1> || std::is_same_v<Block, BlockQ5_1>;
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.qs));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    // Values 0-15 in the low nibbles, 16-31 in the high ones.
    __m256i q =
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bits, 4), low4), _mm_and_si128(bits, low4));
    if constexpr (kFifthBit)
      q = _mm256_or_si256(q, _mm256_and_si256(legacy_high_bits(block.qh), _mm256_set1_epi8(0x10)));
    const float d = _cvtsh_ss(block.d);
    if constexpr (kMin) {
      dequantize_32(q, d, -_cvtsh_ss(block.m), dst);
    } else {
      const __m256i centred = _mm256_sub_epi8(q, _mm256_set1_epi8(kFifthBit ? 16 : 8));
      scale_16(_mm256_castsi256_si128(centred), d, dst);
      scale_16(_mm256_extracti128_si256(centred, 1), d, dst + 16);
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

  static float exp(float x) {
    return _mm256_cvtss_f32(exp(_mm256_set1_ps(x)));
  }

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

  static void scaled_mul(float* out, const float* x, float s, const float* w, int64_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; ++i) out[i] = x[i] * s * w[i];
  }

  // llama.cpp's arithmetic for ggml-cpu built for AVX2 (see Avx512Ops::dot_f32_as_ggml).
  static constexpr int kGgmlLanes = 8;
  static constexpr bool kGgmlHaddReduce = true;  // GGML_F32x8_REDUCE ends with two hadds
  static float dot_f32_as_ggml(const float* x, const float* y, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    const int64_t whole = n & ~int64_t{31};
    for (int64_t i = 0; i < whole; i += 32) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
      s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
      s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    const __m256 r = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    const float sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    return dot_f32_leftovers_as_gcc(x, y, whole, n, 4, sum);
  }
  // ggml_vec_dot_f32's `sumf += x[i]*y[i]` after its whole steps, as GCC 12 vectorises it: the
  // first multiple of `plain` values add rounded products in order, the rest fuse.
  static float dot_f32_leftovers_as_gcc(const float* x, const float* y, int64_t from, int64_t n,
                                        int64_t plain, float sum) {
    const int64_t plain_end = from + (n - from) / plain * plain;
    int64_t i = from;
    for (; i < plain_end; ++i) {
      float product = x[i] * y[i];
      // An empty asm that "changes" the product: GCC may not fuse it into the add (an FMA).
      __asm__("" : "+x"(product));
      sum += product;
    }
    for (; i < n; ++i) sum = std::fma(x[i], y[i], sum);
    return sum;
  }
  // ggml_v_expf (AVX2 form): see exp_avx2_lane in kernels/llama_cpp_order.cpp.
  static __m256 exp_as_ggml(__m256 x) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k =
        _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 c = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(c)) return _mm256_fmadd_ps(j, k, k);
    const __m256i g =
        _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                         _mm256_set1_epi32(static_cast<int>(0x82000000u)));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 d = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    return _mm256_or_ps(
        _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            d, _mm256_or_ps(_mm256_and_ps(c, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                            _mm256_andnot_ps(c, _mm256_fmadd_ps(k, j, k)))));
  }
  // As Avx512Ops::exp_sum_as_ggml with 8 lanes and the AVX2 horizontal sum.
  static double exp_sum_as_ggml(float* x, float max, int64_t n) {
    double sum = 0.0;
    const __m256 vmax = _mm256_set1_ps(max);
    for (int64_t i = 0; i < n; i += 8) {
      const int64_t count = std::min<int64_t>(8, n - i);
      alignas(32) float lanes[8] = {};
      std::copy(x + i, x + i + count, lanes);
      __m256 e = exp_as_ggml(_mm256_sub_ps(_mm256_load_ps(lanes), vmax));
      _mm256_store_ps(lanes, e);
      std::fill(lanes + count, lanes + 8, 0.0f);  // masked cells
      e = _mm256_load_ps(lanes);
      std::copy(lanes, lanes + count, x + i);
      sum += static_cast<double>(tinyblas_hsum(e));
    }
    return sum;
  }
  static void swiglu_as_ggml(float* gate, const float* up, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(gate + i);
      const __m256 e = exp_as_ggml(_mm256_sub_ps(_mm256_setzero_ps(), x));
      _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                               _mm256_loadu_ps(up + i)));
    }
    ScalarOps::swiglu_as_ggml(gate + i, up + i, n - i);
  }
};

}  // namespace protokv::kernels

#endif  // PROTOKV_HAVE_AVX2
