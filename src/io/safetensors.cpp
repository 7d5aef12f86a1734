// SPDX-License-Identifier: Apache-2.0
#include "io/safetensors.h"
#include "protokv/limits.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "io/mapped_file.h"
#include "protokv/error.h"

namespace protokv {
namespace {

using nlohmann::json;

constexpr size_t kHeaderLengthBytes = 8;
constexpr uint64_t kMaxHeaderBytes = limits::kMaxSafetensorsHeaderBytes;

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The safetensors dtype names of the types protokv converts; every other one (F64, I64, U8,
// BOOL, F8_E4M3, ...) is reported by name.
bool dtype_from_safetensors(std::string_view name, DType* type) {
  if (name == "F32")
    *type = DType::F32;
  else if (name == "F16")
    *type = DType::F16;
  else if (name == "BF16")
    *type = DType::BF16;
  else
    return false;
  return true;
}

uint64_t element_bytes(DType type) {
  return type == DType::F32 ? 4 : 2;
}

}  // namespace

int64_t SafetensorsTensor::element_count() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  size_t size = 0;
  file.mapping_ = map_file(path, kHeaderLengthBytes, "a safetensors file", &size);
  const auto* base = static_cast<const unsigned char*>(file.mapping_.get());

  const uint64_t header_len = read_u64_le(base);
  PROTOKV_CHECK(header_len <= kMaxHeaderBytes,
                "{}: bad safetensors header length {}: over the limit of {} bytes", path,
                header_len, kMaxHeaderBytes);
  PROTOKV_CHECK(header_len >= 2 && header_len <= size - kHeaderLengthBytes,
                "{}: bad safetensors header length {} (file has {} bytes)", path, header_len, size);
  const std::string_view header(reinterpret_cast<const char*>(base + kHeaderLengthBytes),
                                static_cast<size_t>(header_len));
  const json root = json::parse(header, nullptr, /*allow_exceptions=*/false);
  PROTOKV_CHECK(!root.is_discarded() && root.is_object(),
                "{}: safetensors header is not a valid JSON object", path);

  const unsigned char* data = base + kHeaderLengthBytes + header_len;
  const uint64_t data_size = size - kHeaderLengthBytes - header_len;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") continue;
    PROTOKV_CHECK(entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() &&
                      entry.contains("shape") && entry["shape"].is_array() &&
                      entry.contains("data_offsets") && entry["data_offsets"].is_array(),
                  "{}: tensor '{}' needs dtype, shape and data_offsets", path, name);
    SafetensorsTensor t;
    t.name = name;
    const std::string dtype = entry["dtype"].get<std::string>();
    PROTOKV_CHECK(dtype_from_safetensors(dtype, &t.type),
                  "{}: tensor '{}' has dtype {}, which protokv does not convert (only F32, F16, "
                  "BF16)",
                  path, name, dtype);
    uint64_t elements = 1;
    for (const json& d : entry["shape"]) {
      PROTOKV_CHECK(d.is_number_unsigned(), "{}: tensor '{}' has a bad shape {}", path, name,
                    entry["shape"].dump());
      const uint64_t dim = d.get<uint64_t>();
      PROTOKV_CHECK(dim <= (uint64_t{1} << 40) &&
                        (dim == 0 || elements <= std::numeric_limits<uint64_t>::max() / 16 / dim),
                    "{}: tensor '{}' has an absurd shape {}", path, name, entry["shape"].dump());
      elements *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& offsets = entry["data_offsets"];
    PROTOKV_CHECK(
        offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
        "{}: tensor '{}' has bad data_offsets {}", path, name, offsets.dump());
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    PROTOKV_CHECK(begin <= end && end <= data_size,
                  "{}: tensor '{}' data_offsets [{}, {}] lie outside the data region ({} bytes)",
                  path, name, begin, end, data_size);
    const uint64_t expected = elements * element_bytes(t.type);
    PROTOKV_CHECK(end - begin == expected,
                  "{}: tensor '{}' holds {} bytes but its shape {} of {} needs {}", path, name,
                  end - begin, entry["shape"].dump(), dtype, expected);
    t.data = data + begin;
    t.nbytes = static_cast<size_t>(expected);
    file.tensors_.push_back(std::move(t));
  }

  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.data < b.data || (a.data == b.data && a.nbytes < b.nbytes);
            });
  for (size_t i = 1; i < file.tensors_.size(); ++i) {
    const SafetensorsTensor& prev = file.tensors_[i - 1];
    const SafetensorsTensor& cur = file.tensors_[i];
    PROTOKV_CHECK(static_cast<const unsigned char*>(prev.data) + prev.nbytes <=
                      static_cast<const unsigned char*>(cur.data),
                  "{}: tensors '{}' and '{}' overlap", path, prev.name, cur.name);
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  return file;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace protokv
