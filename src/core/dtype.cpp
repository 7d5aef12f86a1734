// SPDX-License-Identifier: Apache-2.0
#include "protokv/dtype.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/quant_blocks.h"
#include "protokv/error.h"

namespace protokv {

namespace {

// ---- per-type row conversions (the traits table's function pointers) ----

void copy_f32(const void* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * 4);
}
void dequantize_f32(const void* src, float* dst, int64_t n) {
  copy_f32(src, dst, n);
}
void quantize_f32(const float* src, void* dst, int64_t n) {
  copy_f32(src, dst, n);
}
void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}
void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
}
void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
}
void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
}
void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQ8BlockSize; ++b) {
    const float scale = f16_to_f32(blocks[b].scale);
    for (int j = 0; j < kQ8BlockSize; ++j) dst[b * kQ8BlockSize + j] = scale * blocks[b].quants[j];
  }
}
// Same rounding as ggml's reference quantize_row_q8_0: scale = amax / 127.
void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQ8BlockSize; ++b) {
    const float* x = src + b * kQ8BlockSize;
    float amax = 0.0f;
    for (int j = 0; j < kQ8BlockSize; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    blocks[b].scale = f32_to_f16(scale);
    for (int j = 0; j < kQ8BlockSize; ++j)
      blocks[b].quants[j] = static_cast<int8_t>(std::lround(x[j] * inv));
  }
}
// Every block format with an unpacker (quant_blocks.h) dequantises through it.
template <class Unpack>
void dequantize_unpacked(const void* src, float* dst, int64_t n) {
  quant::dequantize_blocks<Unpack>(src, dst, n / Unpack::kValues);
}
void quantize_q4_0(const float* src, void* dst, int64_t n);
void quantize_q4_k(const float* src, void* dst, int64_t n);

template <class Unpack>
constexpr size_t kBlockBytes = sizeof(typename Unpack::Block);

// llama_ftype ids ("general.file_type") of a file whose matrices are mostly of one type.
constexpr uint32_t kFileTypeAllF32 = 0, kFileTypeMostlyF16 = 1, kFileTypeMostlyQ4_0 = 2,
                   kFileTypeMostlyQ8_0 = 7, kFileTypeMostlyQ4_K_S = 14, kFileTypeMostlyBF16 = 32;

// The registry: one row per weight type (dtype.h's DTypeTraits), in the order messages list them.
// clang-format off
constexpr DTypeTraits kDTypes[] = {
  // type        name    block values  block bytes                  K-quant dequantise                              quantise        file type
  {DType::F32,  "f32",  1,            4,                           false, dequantize_f32,                          quantize_f32,   kFileTypeAllF32},
  {DType::F16,  "f16",  1,            2,                           false, dequantize_f16,                          quantize_f16,   kFileTypeMostlyF16},
  {DType::BF16, "bf16", 1,            2,                           false, dequantize_bf16,                         quantize_bf16,  kFileTypeMostlyBF16},
  {DType::Q8_0, "q8_0", kQ8BlockSize, sizeof(BlockQ8_0),           false, dequantize_q8_0,                         quantize_q8_0,  kFileTypeMostlyQ8_0},
  {DType::Q4_0, "q4_0", kQ4BlockSize, kBlockBytes<quant::UnpackQ4_0>, false, dequantize_unpacked<quant::UnpackQ4_0>, quantize_q4_0, kFileTypeMostlyQ4_0},
  {DType::Q4_1, "q4_1", kQ4BlockSize, kBlockBytes<quant::UnpackQ4_1>, false, dequantize_unpacked<quant::UnpackQ4_1>, nullptr,       0},
  {DType::Q5_0, "q5_0", kQ4BlockSize, kBlockBytes<quant::UnpackQ5_0>, false, dequantize_unpacked<quant::UnpackQ5_0>, nullptr,       0},
  {DType::Q5_1, "q5_1", kQ4BlockSize, kBlockBytes<quant::UnpackQ5_1>, false, dequantize_unpacked<quant::UnpackQ5_1>, nullptr,       0},
  {DType::Q2_K, "q2_K", kQkK,         kBlockBytes<quant::UnpackQ2_K>, true,  dequantize_unpacked<quant::UnpackQ2_K>, nullptr,       0},
  {DType::Q3_K, "q3_K", kQkK,         kBlockBytes<quant::UnpackQ3_K>, true,  dequantize_unpacked<quant::UnpackQ3_K>, nullptr,       0},
  {DType::Q4_K, "q4_K", kQkK,         kBlockBytes<quant::UnpackQ4_K>, true,  dequantize_unpacked<quant::UnpackQ4_K>, quantize_q4_k, kFileTypeMostlyQ4_K_S},
  {DType::Q5_K, "q5_K", kQkK,         kBlockBytes<quant::UnpackQ5_K>, true,  dequantize_unpacked<quant::UnpackQ5_K>, nullptr,       0},
  {DType::Q6_K, "q6_K", kQkK,         kBlockBytes<quant::UnpackQ6_K>, true,  dequantize_unpacked<quant::UnpackQ6_K>, nullptr,       0},
};
// clang-format on

}  // namespace

std::span<const DTypeTraits> dtype_registry() {
  return kDTypes;
}

const DTypeTraits* find_dtype_traits(uint32_t ggml_type) {
  for (const DTypeTraits& t : kDTypes)
    if (static_cast<uint32_t>(t.type) == ggml_type) return &t;
  return nullptr;
}

const DTypeTraits& dtype_traits(DType type) {
  const DTypeTraits* t = find_dtype_traits(static_cast<uint32_t>(type));
  PROTOKV_CHECK(t != nullptr, "unknown tensor type id {}", static_cast<uint32_t>(type));
  return *t;
}

std::string dtype_names(bool writable_only) {
  std::vector<std::string_view> names;
  for (const DTypeTraits& t : kDTypes)
    if (!writable_only || t.writable()) names.push_back(t.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

bool dtype_supported(uint32_t ggml_type) {
  return find_dtype_traits(ggml_type) != nullptr;
}

std::string_view dtype_name(DType type) {
  const DTypeTraits* t = find_dtype_traits(static_cast<uint32_t>(type));
  return t != nullptr ? t->name : "unknown";
}

DType dtype_from_name(std::string_view name) {
  for (const DTypeTraits& t : kDTypes) {
    if (name.size() != t.name.size()) continue;
    bool same = true;  // the K-quants' capital K may be typed either way
    for (size_t i = 0; i < name.size(); ++i)
      same = same && std::tolower(static_cast<unsigned char>(name[i])) ==
                         std::tolower(static_cast<unsigned char>(t.name[i]));
    if (same) return t.type;
  }
  fail("unknown tensor type '{}' (expected one of {})", name, dtype_names());
}

bool dtype_quantizable(DType type) {
  const DTypeTraits* t = find_dtype_traits(static_cast<uint32_t>(type));
  return t != nullptr && t->writable();
}

bool dtype_is_k_quant(DType type) {
  const DTypeTraits* t = find_dtype_traits(static_cast<uint32_t>(type));
  return t != nullptr && t->k_quant;
}

bool dtype_is_legacy_quant(DType type) {
  return dtype_block_size(type) == 32;
}

int64_t dtype_block_size(DType type) {
  const DTypeTraits* t = find_dtype_traits(static_cast<uint32_t>(type));
  return t != nullptr ? t->block_values : 1;
}

size_t dtype_row_bytes(DType type, int64_t n) {
  const DTypeTraits* t = find_dtype_traits(static_cast<uint32_t>(type));
  if (t == nullptr) return 0;
  return static_cast<size_t>(n / t->block_values) * t->block_bytes;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace quant {

const float* f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(size_t{1} << 16);
    for (uint32_t h = 0; h < t.size(); ++h) t[h] = f16_to_f32(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

}  // namespace quant

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {                                               // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Simple reference quantisers for Q4_0 and Q4_K (round to nearest, scales from the block range;
// NOT byte-identical to llama-quantize, whose Q4_K search for scales is more elaborate). They
// write valid ggml blocks, so any reader decodes them the same way.
void quantize_q4_0(const float* x, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / kQ4BlockSize; ++b) {
    const float* xb = x + b * kQ4BlockSize;
    float extreme = 0.0f;  // the value of largest magnitude, sign kept: it maps to -8
    for (int j = 0; j < kQ4BlockSize; ++j)
      if (std::fabs(xb[j]) > std::fabs(extreme)) extreme = xb[j];
    const float d = extreme / -8.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_f16(d);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::clamp(static_cast<int>(std::lround(xb[j] * inv)) + 8, 0, 15);
      const int hi = std::clamp(static_cast<int>(std::lround(xb[j + 16] * inv)) + 8, 0, 15);
      blocks[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_q4_k(const float* x, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_K*>(dst);
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const float* xb = x + b * kQkK;
    float scales[8], mins[8];  // value = scale * q - min per sub-block of 32
    float max_scale = 0.0f, max_min = 0.0f;
    for (int sub = 0; sub < 8; ++sub) {
      float lo = 0.0f, hi = 0.0f;  // the range always includes 0, so min >= 0
      for (int l = 0; l < 32; ++l) {
        lo = std::min(lo, xb[32 * sub + l]);
        hi = std::max(hi, xb[32 * sub + l]);
      }
      scales[sub] = (hi - lo) / 15.0f;
      mins[sub] = -lo;
      max_scale = std::max(max_scale, scales[sub]);
      max_min = std::max(max_min, mins[sub]);
    }
    BlockQ4_K& out = blocks[b];
    out.d = f32_to_f16(max_scale / 63.0f);
    out.dmin = f32_to_f16(max_min / 63.0f);
    const float d = f16_to_f32(out.d), dmin = f16_to_f32(out.dmin);
    // Mins rounded up (offset >= -lo keeps every shifted value >= 0), then each scale rounded up
    // to cover the shifted range (no clipping at 15 unless a scale saturates at 63).
    int sc[8], mn[8];
    for (int sub = 0; sub < 8; ++sub) {
      mn[sub] = dmin > 0.0f ? std::clamp(static_cast<int>(std::ceil(mins[sub] / dmin)), 0, 63) : 0;
      float hi = 0.0f;
      for (int l = 0; l < 32; ++l) hi = std::max(hi, xb[32 * sub + l]);
      const float range = hi + dmin * static_cast<float>(mn[sub]);
      sc[sub] = d > 0.0f ? std::clamp(static_cast<int>(std::ceil(range / (15.0f * d))), 0, 63) : 0;
    }
    // The 12-byte packing read by quant::k4_scale_min.
    std::memset(out.scales, 0, sizeof(out.scales));
    for (int sub = 0; sub < 8; ++sub) {
      if (sub < 4) {
        out.scales[sub] |= static_cast<uint8_t>(sc[sub]);
        out.scales[sub + 4] |= static_cast<uint8_t>(mn[sub]);
      } else {
        out.scales[sub + 4] = static_cast<uint8_t>((sc[sub] & 15) | ((mn[sub] & 15) << 4));
        out.scales[sub - 4] |= static_cast<uint8_t>((sc[sub] >> 4) << 6);
        out.scales[sub] |= static_cast<uint8_t>((mn[sub] >> 4) << 6);
      }
    }
    for (int sub = 0; sub < 8; ++sub) {
      const float step = d * static_cast<float>(sc[sub]);
      const float offset = dmin * static_cast<float>(mn[sub]);
      const float inv = step > 0.0f ? 1.0f / step : 0.0f;
      for (int l = 0; l < 32; ++l) {
        const int q =
            std::clamp(static_cast<int>(std::lround((xb[32 * sub + l] + offset) * inv)), 0, 15);
        // Value 64 j + l (l < 32): low nibble of qs[32 j + l]; 64 j + 32 + l: high nibble.
        uint8_t& byte = out.qs[32 * (sub / 2) + l];
        byte = sub % 2 == 0 ? static_cast<uint8_t>((byte & 0xf0) | q)
                            : static_cast<uint8_t>((byte & 0x0f) | (q << 4));
      }
    }
  }
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  dtype_traits(type).dequantize(src, dst, n);
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  const DTypeTraits& t = dtype_traits(type);
  if (!t.writable())
    fail(
        "quantising to {} is not implemented (protokv reads {} files; quantise with "
        "llama-quantize)",
        t.name, t.name);
  t.quantize(src, dst, n);
}

}  // namespace protokv
