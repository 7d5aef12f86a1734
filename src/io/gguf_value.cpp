// SPDX-License-Identifier: Apache-2.0
#include "io/gguf_value.h"

#include <fmt/format.h>

namespace protokv::gguf_detail {

std::string_view type_name(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown";
}

size_t min_encoded_size(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:  // uint64 length
      return 8;
    case GgufType::kArray:  // uint32 element type + uint64 count
      return 12;
  }
  return 1;
}

std::string ggml_type_label(uint32_t ggml_type) {
  // ggml's type ids (ggml.h); gaps are ids ggml has retired.
  static constexpr std::string_view kNames[] = {
      "f32",     "f16",    "q4_0",    "q4_1",  "",       "",      "q5_0",  "q5_1",
      "q8_0",    "q8_1",   "q2_K",    "q3_K",  "q4_K",   "q5_K",  "q6_K",  "q8_K",
      "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs",
      "i8",      "i16",    "i32",     "i64",   "f64",    "iq1_m", "bf16",  "",
      "",        "",       "tq1_0",   "tq2_0", "",       "",      "",      "mxfp4"};
  if (ggml_type < std::size(kNames) && !kNames[ggml_type].empty()) {
    return fmt::format("{} (ggml type {})", kNames[ggml_type], ggml_type);
  }
  return fmt::format("{} (unknown ggml type)", ggml_type);
}

}  // namespace protokv::gguf_detail
