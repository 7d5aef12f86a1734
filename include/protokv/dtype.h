// SPDX-License-Identifier: Apache-2.0
#pragma once
// Element types of weight tensors. Values are the GGML type ids so GGUF files map 1:1.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace protokv {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};

inline constexpr int kQ8BlockSize = 32;  // Q8_0: blocks of {f16 scale, 32 x int8}
struct BlockQ8_0 {
  uint16_t scale;  // f16 bits
  int8_t quants[kQ8BlockSize];
};
static_assert(sizeof(BlockQ8_0) == 34);

// The other GGML block formats, byte for byte as ggml-common.h lays them out (all scales are
// f16 bits). Legacy formats cover 32 values; the K-quants a super-block of kQkK = 256 values
// split in sub-blocks of 16 or 32 with their own small integer scales.
inline constexpr int kQ4BlockSize = 32;  // also Q4_1, Q5_0, Q5_1
inline constexpr int kQkK = 256;

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];  // value j in low nibble of qs[j], value j + 16 in the high nibble
};
static_assert(sizeof(BlockQ4_0) == 18);
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // fifth bits, bit j of the little-endian uint32 for value j
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);
struct BlockQ2_K {
  uint8_t scales[16];  // per 16 values: low nibble scale, high nibble min
  uint8_t qs[64];      // 2-bit quants
  uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);
struct BlockQ3_K {
  uint8_t hmask[32];   // high bit of each 3-bit quant
  uint8_t qs[64];      // low 2 bits
  uint8_t scales[12];  // 16 scales of 6 bits, packed
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 scales and 8 mins of 6 bits, packed
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);
struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // per 16 values
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Everything about a weight type that is not its block layout, one row per type (ggml's
// type_traits idea): the registry in core/dtype.cpp. The functions below read it, and so do the
// loaders, exporters and the CLI's type lists; the kernels dispatch on the block layouts through
// quant::with_unpacker (core/quant_blocks.h). Adding a type: its DType id and block struct here,
// its row in dtype.cpp, its unpacker in quant_blocks.h (docs/DESIGN.md §4, "Adding a weight type").
struct DTypeTraits {
  DType type;
  std::string_view name;  // llama.cpp's: "f32", "q4_0", "q4_K", ...
  int64_t block_values;   // 1 for plain types, 32 for legacy quants, 256 for K-quants
  size_t block_bytes;
  bool k_quant;  // super-blocks of 256 values with sub-block scales
  void (*dequantize)(const void* src, float* dst, int64_t n);
  // Null when protokv has no quantiser for it (it reads such files, llama-quantize writes them).
  void (*quantize)(const float* src, void* dst, int64_t n);
  uint32_t file_type;  // llama_ftype ("general.file_type") of a file mostly of this type
  bool writable() const { return quantize != nullptr; }
};
// Every supported type, in the order messages list them.
std::span<const DTypeTraits> dtype_registry();
// The row of a GGML type id; null for one protokv cannot compute with.
const DTypeTraits* find_dtype_traits(uint32_t ggml_type);
// The row of `type`; throws Error for an id outside the registry.
const DTypeTraits& dtype_traits(DType type);
// "f32, f16, bf16, q8_0, ..." (only the types quantize_row writes with `writable_only`).
std::string dtype_names(bool writable_only = false);

// True for the GGML type ids protokv can compute with.
bool dtype_supported(uint32_t ggml_type);
// llama.cpp's names: "f32", "q4_0", "q4_K", ...
std::string_view dtype_name(DType type);
// Parses any dtype_name (K-quants also in lower case, "q4_k"); throws Error otherwise.
DType dtype_from_name(std::string_view name);
// True for the types quantize_row can write (F32, F16, BF16, Q8_0, and Q4_0 / Q4_K with a simple
// reference quantiser that is not byte-identical to llama-quantize).
bool dtype_quantizable(DType type);
// True for the K-quants (super-blocks of 256 values).
bool dtype_is_k_quant(DType type);
// True for the legacy quants of 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), which ggml
// multiplies with its Q8_0 / Q8_1 activation blocks.
bool dtype_is_legacy_quant(DType type);
// Elements per block (1 for plain types, 32 for legacy quants, 256 for K-quants).
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
// Converts `n` f32 values to `type` (n a multiple of the block size); types that are not
// dtype_quantizable throw Error.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace protokv
