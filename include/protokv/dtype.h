#pragma once
// Element types of weight tensors. Values are the GGML type ids so GGUF files map 1:1.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace protokv {

enum class DType : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, BF16 = 30 };

inline constexpr int kQ8BlockSize = 32;  // Q8_0: blocks of {f16 scale, 32 x int8}
struct BlockQ8_0 {
  uint16_t scale;  // f16 bits
  int8_t quants[kQ8BlockSize];
};
static_assert(sizeof(BlockQ8_0) == 34);

// True for the GGML type ids protokv can compute with.
bool dtype_supported(uint32_t ggml_type);
std::string_view dtype_name(DType type);
// Parses "f32", "f16", "bf16", "q8_0"; throws Error otherwise.
DType dtype_from_name(std::string_view name);
// Elements per block (1 for plain types, 32 for Q8_0).
int64_t dtype_block_size(DType type);
// Bytes of a row of `n` elements; n must be a multiple of the block size.
size_t dtype_row_bytes(DType type, int64_t n);

// IEEE half and bfloat16 conversion (round to nearest even).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
uint16_t f32_to_bf16(float f);

// Converts `n` elements of `type` starting at `src` to f32.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);
// Converts `n` f32 values to `type` (n a multiple of the block size).
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace protokv
