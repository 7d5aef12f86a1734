// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the GGUF reader and writer: value-type names and sizes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "protokv/gguf.h"

namespace protokv::gguf_detail {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kWriteVersion = 3;

inline bool is_valid_type(uint32_t type) {
  return type <= static_cast<uint32_t>(GgufType::kFloat64);
}

inline bool is_unsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}
inline bool is_signed(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
inline bool is_integer(GgufType t) {
  return is_unsigned(t) || is_signed(t);
}
inline bool is_float(GgufType t) {
  return t == GgufType::kFloat32 || t == GgufType::kFloat64;
}

std::string_view type_name(GgufType type);

// Bytes a value of `type` occupies on disk; for strings and arrays, the least they can occupy
// (their length prefix, plus the element type for arrays). Used to reject impossible counts
// before allocating anything.
size_t min_encoded_size(GgufType type);

// Names of the ggml tensor types protokv does not compute with, for error messages.
std::string ggml_type_label(uint32_t ggml_type);

}  // namespace protokv::gguf_detail
