// SPDX-License-Identifier: Apache-2.0
#pragma once
// The GGML quantised block formats (Q4_0 ... Q6_K, protokv/dtype.h) brought to one common form,
// UnpackedBlock, shared by the scalar dequantisation (core/dtype.cpp) and the integer mat-vec
// kernels (kernels/quant_matvec.h). The bit layouts follow ggml's dequantize_row_* in
// ggml-quants.c; the code is written from those layouts, not copied.
#include <cstdint>
#include <cstring>

#include "protokv/dtype.h"

namespace protokv::quant {

// Values of one block (32 for legacy formats, 256 for K-quants) in groups of 16. Value i of
// group g = i / 16 is
//   offset types (Q4_0, Q5_0, Q3_K, Q6_K):  (d * scale[g]) * (q[i] - offset)
//   min types (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): (d * scale[g]) * q[i] - m * min[g]
// with q[i] in 0..63. For offset types min[g] = scale[g] * offset and m = d, so the second form
// holds for every type: the integer kernels use it (sum over i of w_i x_i =
// d * sum_g scale[g] * (q_g . x_g) - m * sum_g min[g] * sum(x_g)), the dequantisation the first
// to round exactly as ggml does.
struct UnpackedBlock {
  uint8_t q[kQkK];
  int16_t scale[kQkK / 16];
  int16_t min[kQkK / 16];
  float d = 0, m = 0;
  int offset = 0;  // 0 for min types
};

inline uint32_t load_u32_le(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // x86 and every target ggml files are written on: little-endian
  return v;
}

// F16 -> F32 for every half bit pattern (256 KB, built on first use; core/dtype.cpp): one load
// instead of f16_to_f32's branches, for the block scales here and the kernels' portable path.
const float* f16_table();

struct UnpackQ4_0 {
  using Block = BlockQ4_0;
  static constexpr int kValues = 32;
  static void unpack(const Block& b, UnpackedBlock& u) {
    for (int j = 0; j < 16; ++j) {
      u.q[j] = b.qs[j] & 0x0f;
      u.q[j + 16] = b.qs[j] >> 4;
    }
    u.scale[0] = u.scale[1] = 1;
    u.min[0] = u.min[1] = 8;
    u.d = u.m = f16_table()[b.d];
    u.offset = 8;
  }
};

struct UnpackQ4_1 {
  using Block = BlockQ4_1;
  static constexpr int kValues = 32;
  static void unpack(const Block& b, UnpackedBlock& u) {
    for (int j = 0; j < 16; ++j) {
      u.q[j] = b.qs[j] & 0x0f;
      u.q[j + 16] = b.qs[j] >> 4;
    }
    u.scale[0] = u.scale[1] = 1;
    u.min[0] = u.min[1] = 1;
    u.d = f16_table()[b.d];
    u.m = -f16_table()[b.m];  // value = d q + m
    u.offset = 0;
  }
};

// Fifth bit of value j is bit j of qh (little-endian uint32).
inline void unpack_5bit(const uint8_t* qs, const uint8_t* qh_bytes, uint8_t* q) {
  const uint32_t qh = load_u32_le(qh_bytes);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
  }
}

struct UnpackQ5_0 {
  using Block = BlockQ5_0;
  static constexpr int kValues = 32;
  static void unpack(const Block& b, UnpackedBlock& u) {
    unpack_5bit(b.qs, b.qh, u.q);
    u.scale[0] = u.scale[1] = 1;
    u.min[0] = u.min[1] = 16;
    u.d = u.m = f16_table()[b.d];
    u.offset = 16;
  }
};

struct UnpackQ5_1 {
  using Block = BlockQ5_1;
  static constexpr int kValues = 32;
  static void unpack(const Block& b, UnpackedBlock& u) {
    unpack_5bit(b.qs, b.qh, u.q);
    u.scale[0] = u.scale[1] = 1;
    u.min[0] = u.min[1] = 1;
    u.d = f16_table()[b.d];
    u.m = -f16_table()[b.m];
    u.offset = 0;
  }
};

// Q2_K and Q3_K share the 2-bit layout: each half (128 values) reads 32 bytes of qs; value
// 128 h + 32 j + 16 k + l (j < 4, k < 2, l < 16) is bits 2j..2j+1 of qs[32 h + 16 k + l].
inline void unpack_2bit(const uint8_t* qs, uint8_t* q) {
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l)
        q[128 * h + 32 * j + l] = static_cast<uint8_t>((qs[32 * h + l] >> (2 * j)) & 3);
}

struct UnpackQ2_K {
  using Block = BlockQ2_K;
  static constexpr int kValues = kQkK;
  static void unpack(const Block& b, UnpackedBlock& u) {
    unpack_2bit(b.qs, u.q);
    for (int g = 0; g < 16; ++g) {
      u.scale[g] = b.scales[g] & 0x0f;
      u.min[g] = b.scales[g] >> 4;
    }
    u.d = f16_table()[b.d];
    u.m = f16_table()[b.dmin];
    u.offset = 0;
  }
};

// Q3_K's sixteen 6-bit scales in 12 bytes: low nibbles of scales 0..7 in the low nibbles of
// bytes 0..7, of scales 8..15 in their high nibbles; the top two bits of scale 4 s + j (s < 4,
// j < 4) are bits 2s..2s+1 of byte 8 + j. Stored biased by 32.
inline int q3k_scale(const uint8_t* packed, int index) {
  const int j = index % 4;
  const int s = index / 4;
  const int low = s < 2 ? packed[4 * s + j] & 0x0f : packed[4 * (s - 2) + j] >> 4;
  const int high = (packed[8 + j] >> (2 * s)) & 3;
  return (low | (high << 4)) - 32;
}

struct UnpackQ3_K {
  using Block = BlockQ3_K;
  static constexpr int kValues = kQkK;
  static void unpack(const Block& b, UnpackedBlock& u) {
    unpack_2bit(b.qs, u.q);
    // High bit of value 128 h + 32 j + l is bit 4 h + j of hmask[l]; set means +4 (the stored
    // quant is q - 4 with q in 0..7).
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l)
          u.q[128 * h + 32 * j + l] |= static_cast<uint8_t>(((b.hmask[l] >> (4 * h + j)) & 1) << 2);
    for (int g = 0; g < 16; ++g) {
      u.scale[g] = static_cast<int16_t>(q3k_scale(b.scales, g));
      u.min[g] = static_cast<int16_t>(4 * u.scale[g]);
    }
    u.d = u.m = f16_table()[b.d];
    u.offset = 4;
  }
};

// Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins in 12 bytes. Sub-block j < 4: scale in
// the low 6 bits of byte j, min in those of byte j + 4. j >= 4: low 4 bits from byte j + 4
// (scale low nibble, min high nibble), top 2 bits from the top bits of bytes j - 4 (scale) and
// j (min). (ggml's get_scale_min_k4.)
inline void k4_scale_min(const uint8_t* packed, int j, int& scale, int& min) {
  if (j < 4) {
    scale = packed[j] & 63;
    min = packed[j + 4] & 63;
  } else {
    scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
    min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

inline void k4_scales_to_groups(const uint8_t* packed, UnpackedBlock& u) {
  for (int sub = 0; sub < 8; ++sub) {
    int scale, min;
    k4_scale_min(packed, sub, scale, min);
    u.scale[2 * sub] = u.scale[2 * sub + 1] = static_cast<int16_t>(scale);
    u.min[2 * sub] = u.min[2 * sub + 1] = static_cast<int16_t>(min);
  }
}

// Value 64 j + l (l < 32) is the low nibble of qs[32 j + l], value 64 j + 32 + l its high nibble.
inline void unpack_k4_nibbles(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < 4; ++j)
    for (int l = 0; l < 32; ++l) {
      q[64 * j + l] = qs[32 * j + l] & 0x0f;
      q[64 * j + 32 + l] = qs[32 * j + l] >> 4;
    }
}

struct UnpackQ4_K {
  using Block = BlockQ4_K;
  static constexpr int kValues = kQkK;
  static void unpack(const Block& b, UnpackedBlock& u) {
    unpack_k4_nibbles(b.qs, u.q);
    k4_scales_to_groups(b.scales, u);
    u.d = f16_table()[b.d];
    u.m = f16_table()[b.dmin];
    u.offset = 0;
  }
};

struct UnpackQ5_K {
  using Block = BlockQ5_K;
  static constexpr int kValues = kQkK;
  static void unpack(const Block& b, UnpackedBlock& u) {
    unpack_k4_nibbles(b.qs, u.q);
    // Fifth bit of value 64 j + 32 k + l is bit 2 j + k of qh[l].
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 2; ++k)
        for (int l = 0; l < 32; ++l)
          u.q[64 * j + 32 * k + l] |= static_cast<uint8_t>(((b.qh[l] >> (2 * j + k)) & 1) << 4);
    k4_scales_to_groups(b.scales, u);
    u.d = f16_table()[b.d];
    u.m = f16_table()[b.dmin];
    u.offset = 0;
  }
};

struct UnpackQ6_K {
  using Block = BlockQ6_K;
  static constexpr int kValues = kQkK;
  static void unpack(const Block& b, UnpackedBlock& u) {
    // Half h (128 values), l < 32: value 128 h + 32 k + l takes its low 4 bits from
    // ql[64 h + 32 (k % 2) + l] (low nibble for k < 2, high for k >= 2) and its top 2 bits
    // from bits 2k..2k+1 of qh[32 h + l].
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const uint8_t low = b.ql[64 * h + 32 * (k % 2) + l];
          const int nibble = k < 2 ? low & 0x0f : low >> 4;
          const int top = (b.qh[32 * h + l] >> (2 * k)) & 3;
          u.q[128 * h + 32 * k + l] = static_cast<uint8_t>(nibble | (top << 4));
        }
    for (int g = 0; g < 16; ++g) {
      u.scale[g] = b.scales[g];
      u.min[g] = static_cast<int16_t>(32 * b.scales[g]);
    }
    u.d = u.m = f16_table()[b.d];
    u.offset = 32;
  }
};

// Calls f(Unpack{}) with the unpacker of `type`; returns false for types without one (F32, F16,
// BF16, Q8_0).
template <class F>
bool with_unpacker(DType type, F&& f) {
  switch (type) {
    case DType::Q4_0:
      f(UnpackQ4_0{});
      return true;
    case DType::Q4_1:
      f(UnpackQ4_1{});
      return true;
    case DType::Q5_0:
      f(UnpackQ5_0{});
      return true;
    case DType::Q5_1:
      f(UnpackQ5_1{});
      return true;
    case DType::Q2_K:
      f(UnpackQ2_K{});
      return true;
    case DType::Q3_K:
      f(UnpackQ3_K{});
      return true;
    case DType::Q4_K:
      f(UnpackQ4_K{});
      return true;
    case DType::Q5_K:
      f(UnpackQ5_K{});
      return true;
    case DType::Q6_K:
      f(UnpackQ6_K{});
      return true;
    default:
      return false;
  }
}

// Dequantises `n_blocks` blocks with ggml's rounding (see UnpackedBlock).
template <class Unpack>
void dequantize_blocks(const void* src, float* dst, int64_t n_blocks) {
  const auto* blocks = static_cast<const typename Unpack::Block*>(src);
  UnpackedBlock u;
  for (int64_t b = 0; b < n_blocks; ++b) {
    Unpack::unpack(blocks[b], u);
    float* out = dst + b * Unpack::kValues;
    for (int g = 0; g < Unpack::kValues / 16; ++g) {
      const float group_scale = u.d * static_cast<float>(u.scale[g]);
      const uint8_t* q = u.q + 16 * g;
      if (u.offset != 0) {
        for (int l = 0; l < 16; ++l)
          out[16 * g + l] = group_scale * static_cast<float>(q[l] - u.offset);
      } else {
        const float group_min = u.m * static_cast<float>(u.min[g]);
        for (int l = 0; l < 16; ++l)
          out[16 * g + l] = group_scale * static_cast<float>(q[l]) - group_min;
      }
    }
  }
}

}  // namespace protokv::quant
